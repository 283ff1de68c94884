"""openpop-bert under poprun: two instances train the recipe like one process with both replicas;
only instance 0 logs and writes checkpoints; a resumed job continues exactly, also after instance 0
was killed while it wrote a checkpoint."""
import io
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from openpop.bert import train
from openpop.bert.config import make_config

from helpers.poprun_runner import PROGRAMS, environment, poprun_command, run_poprun
from helpers.processes import wait_gone

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


def _same(a, b, where="checkpoint"):
    """Exact equality of two loaded checkpoints (tensors bit for bit)."""
    assert type(a) is type(b), where
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert set(a) == set(b), where
        for key in a:
            _same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


@pytest.mark.slow
def test_kill_9_during_a_checkpoint_write_keeps_the_last_one_and_resume_is_exact(tmp_path):
    out, hook = tmp_path / "checkpoints", tmp_path / "hook"
    hook.mkdir()
    recipe = BERT[BERT.index("--config"):] + ["--training-steps", "5", "--checkpoint-steps", "2",
                                              "--checkpoint-output-dir", str(out)]
    job = subprocess.Popen(
        poprun_command("--num-instances", "2", "--num-replicas", "2", sys.executable, PROGRAMS,
                       "bert-stalled-checkpoint", "4", str(hook), *recipe),
        env=environment(OMP_NUM_THREADS="1"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180  # only against a hang: the program says when it writes
        while not (hook / "writing").exists():
            assert job.poll() is None, job.communicate()[1]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        writer = int((hook / "writing").read_text())
        os.kill(writer, signal.SIGKILL)  # instance 0, half-way through step_4.pt
        started = time.monotonic()
        _out, err = job.communicate(timeout=60)
        seconds = time.monotonic() - started
    finally:
        if job.poll() is None:
            job.kill()
    assert seconds < 60 and job.returncode == 128 + 9, err
    errors = [line.split(" POPRUN [E] ", 1)[1] for line in err.splitlines() if " POPRUN [E] " in line]
    assert errors[0] == f"instance 0 (rank 0, pid {writer}) was killed by SIGKILL (exit status -9)", err
    assert errors[-1].startswith("the job was stopped: instance 0 failed first"), err
    assert not any("instance 1" in line and "killed by SIGTERM" in line for line in errors), err
    # The last good checkpoint is whole; the killed write left only its temporary file.
    names = sorted(os.listdir(out))
    assert names[1:] == ["step_2.pt"] and names[0].startswith(f".tmp-step_4.pt-{writer}-"), names
    assert torch.load(out / "step_2.pt", weights_only=True)["step"] == 2

    resumed = run_poprun(*BERT, "--training-steps", "5", "--checkpoint-steps", "2", "--checkpoint-output-dir",
                         str(out), "--resume-training-from-checkpoint", OMP_NUM_THREADS="1")
    assert resumed.returncode == 0, resumed.stderr
    lines = resumed.stderr.splitlines()
    assert (f"[1,0]<stderr>:Removed 1 temporary file(s) left in {out} by checkpoint writes that were killed"
            in lines)
    assert f"[1,0]<stderr>:Resuming training from {out}/step_2.pt at step 2" in lines
    assert sorted(os.listdir(out)) == ["step_2.pt", "step_4.pt", "step_5.pt"]
    # Steps 3 and 4 again from step_2.pt: the checkpoint the killed run was writing, bit for bit
    # (its configuration differs only in saying that it resumed).
    again, uninterrupted = (torch.load(path, weights_only=False) for path in (out / "step_4.pt",
                                                                              hook / "uninterrupted.pt"))
    assert again["config"].pop("resume_training_from_checkpoint") is True
    assert uninterrupted["config"].pop("resume_training_from_checkpoint") is False
    _same(again, uninterrupted)
    assert wait_gone([writer], 5.0) == []
