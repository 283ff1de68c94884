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
    train_oracle(model, torch.optim.SGD(model.parameters(), lr=0.1), local_replicas=1)
    for r in results:
        for name, value in model.state_dict().items():
            torch.testing.assert_close(r["weights"][name], value, atol=1e-6, rtol=0)


def train_oracle(model, optimizer, local_replicas):
    """Each step one batch made of both instances' shards (each instance's part: its replicas'
    micro-batches; an epoch of 2 local replicas is 2 steps)."""
    x, y = programs.lightning_data()
    half, batch = programs.LIGHTNING_SAMPLES // 2, programs.LIGHTNING_BATCH * local_replicas
    for step in range(programs.LIGHTNING_STEPS):
        start = step % (half // batch) * batch
        rows = list(range(start, start + batch)) + list(range(half + start, half + start + batch))
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model.fc(x[rows]), y[rows]).backward()
        optimizer.step()


@pytest.mark.parametrize("local_replicas", [1, 2])
def test_manual_optimization_in_every_instance(tmp_path, local_replicas):
    """Manual optimization under poprun: the replicas of both instances are one DDP group (each
    ``manual_backward`` averages over all of them), from instance 0's weights and optimizer state.
    Oracle as for automatic optimization, with momentum (every replica's loss is a mean over as
    many rows)."""
    result = run_poprun("--num-instances", "2", "--num-replicas", str(2 * local_replicas), "python", PROGRAMS,
                        "lightning-manual", str(tmp_path), str(local_replicas))
    assert result.returncode == 0, result.stderr
    results = load_results(tmp_path, 2)
    torch.manual_seed(100)
    model = programs.lightning_manual_module()
    train_oracle(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), local_replicas)
    for r in results:
        for name, value in model.state_dict().items():
            torch.testing.assert_close(r["weights"][name], value, atol=1e-6, rtol=0)
