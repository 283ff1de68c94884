"""Lightning under poprun: each instance's Trainer(accelerator="ipu") is one Lightning process of
the job (world_size = instances, global_rank = instance); the weights are those of one batch of
both instances' samples; sync_dist logs are averaged; only instance 0 is global zero."""
import os

import pytest
import torch

from helpers import poprun_programs as programs
from helpers.poprun_runner import PROGRAMS, load_results, run_poprun

pytest.importorskip("lightning")


@pytest.mark.slow
def test_lightning_trainer_in_every_instance(tmp_path):
    result = run_poprun("--num-instances", "2", "--num-replicas", "2", "python", PROGRAMS, "lightning", str(tmp_path))
    assert result.returncode == 0, result.stderr
    results = load_results(tmp_path, 2)
    assert [(r["world_size"], r["global_rank"], r["is_global_zero"], r["num_devices"]) for r in results] == [
        (2, 0, True, 1), (2, 1, False, 1)]
    assert results[0]["logged_loss"] == results[1]["logged_loss"]  # sync_dist=True: the instances' mean
    assert sorted(os.listdir(tmp_path / "checkpoints")) == [f"epoch=0-step={s}.ckpt" for s in (1, 2, 3)]

    # Oracle: instance 0's initial weights; each step one batch made of both instances' shards.
    torch.manual_seed(100)
    model = programs.lightning_module()
    x, y = programs.lightning_data()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    half, batch = programs.LIGHTNING_SAMPLES // 2, programs.LIGHTNING_BATCH
    for step in range(programs.LIGHTNING_STEPS):
        rows = (list(range(step * batch, (step + 1) * batch))
                + list(range(half + step * batch, half + (step + 1) * batch)))
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model.fc(x[rows]), y[rows]).backward()
        optimizer.step()
    for r in results:
        for name, value in model.state_dict().items():
            torch.testing.assert_close(r["weights"][name], value, atol=1e-6, rtol=0)
