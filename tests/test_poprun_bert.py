"""openpop-bert under poprun: two instances train the recipe like one process with both replicas;
only instance 0 logs and writes checkpoints; a resumed job continues exactly."""
import io
import os
import sys

import pytest
import torch

from openpop.bert import train
from openpop.bert.config import make_config

from helpers.poprun_runner import run_poprun

BERT = ["--num-instances", "2", "--num-replicas", "2", sys.executable, "-m", "openpop.bert", "--config",
        "cpu_tiny_128", "--micro-batch-size", "4", "--dataset", "generated", "--disable-progress-bar"]


@pytest.mark.slow
def test_bert_on_two_instances_with_checkpoint_and_resume(tmp_path):
    out, resumed_out = str(tmp_path / "whole"), str(tmp_path / "resumed")
    whole = run_poprun(*BERT, "--training-steps", "3", "--checkpoint-steps", "2", "--checkpoint-output-dir", out)
    assert whole.returncode == 0, whole.stderr
    recipe_lines = [line for line in whole.stderr.splitlines() if "POPRUN" not in line]
    assert recipe_lines and all(line.startswith("[1,0]<stderr>:") for line in recipe_lines)  # instance 0 only
    assert "[1,0]<stderr>:The number of replicas is overridden by PopRun. The new value is 2." in recipe_lines
    assert "[1,0]<stderr>:global_batch_size: 8" in recipe_lines  # 4 samples x 1 local replica x 2 instances
    assert sorted(os.listdir(out)) == ["step_2.pt", "step_3.pt"]  # each written once

    resumed = run_poprun(*BERT, "--training-steps", "3", "--checkpoint-input-dir", os.path.join(out, "step_2.pt"),
                         "--resume-training-from-checkpoint", "--checkpoint-output-dir", resumed_out)
    assert resumed.returncode == 0, resumed.stderr
    assert f"[1,0]<stderr>:Resuming training from {out}/step_2.pt at step 2" in resumed.stderr.splitlines()
    final = torch.load(os.path.join(out, "step_3.pt"), weights_only=False)["model"]
    again = torch.load(os.path.join(resumed_out, "step_3.pt"), weights_only=False)["model"]
    for name, value in final.items():
        assert torch.equal(again[name], value), name

    # One process holding both replicas.
    one = train.run(make_config("cpu_tiny_128", replication_factor=2, micro_batch_size=4, dataset="generated",
                                training_steps=3, disable_progress_bar=True), stream=io.StringIO())
    for name, value in one.model.state_dict().items():
        torch.testing.assert_close(final[name], value, atol=1e-6, rtol=0, msg=lambda m, name=name: f"{name}: {m}")
