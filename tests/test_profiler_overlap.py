"""Profiler sessions that overlap never crash the process (``runtime/trace.py``): torch runs one
``torch.profiler`` per process, a second one started takes the first one's events, and exporting
the first then kills the interpreter (SIGSEGV). Each case runs in a child process, so a crash
fails its test instead of the suite."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

# Lightning with the seeds' autoreport switch and a validation step: training's window is open
# when validation starts its own.
LIGHTNING_AUTOREPORT = """
import os, torch, lightning.pytorch as pl
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import IPUStrategy
torch.manual_seed(0)
class M(pl.LightningModule):
    def __init__(self):
        super().__init__(); self.l = torch.nn.Linear(32, 2)
    def training_step(self, b, i):
        x, y = b; return torch.nn.functional.cross_entropy(self.l(x), y)
    def validation_step(self, b, i):
        x, y = b; self.log('v', torch.nn.functional.cross_entropy(self.l(x), y))
    def val_dataloader(self): return self.train_dataloader()
    def configure_optimizers(self): return torch.optim.SGD(self.parameters(), lr=0.1)
    def train_dataloader(self):
        ds = torch.utils.data.TensorDataset(torch.randn(64, 32), torch.randint(0, 2, (64,)))
        return torch.utils.data.DataLoader(ds, batch_size=8)
t = Trainer(default_root_dir=".", accelerator="ipu", devices=1, fast_dev_run=True, enable_progress_bar=False,
            enable_model_summary=False, logger=False, strategy=IPUStrategy(autoreport=True, autoreport_dir="./report/"))
t.fit(M())
print("FIT DONE")
"""

# Two PopTorch models whose engine-option sessions overlap, then a user's torch.profiler around
# a third model's recorded calls, started before openpop's window (MODE=before) or inside it
# (MODE=inside).
POPTORCH_OVERLAP = """
import json, os, sys, torch, poptorch
from openpop.runtime.trace import TraceSession
MODE = sys.argv[1]
def model():
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    return poptorch.inferenceModel(net, poptorch.Options())
x = torch.randn(2, 4)
if MODE == "sessions":
    a, b = model(), model()
    with TraceSession("a", calls=range(3), accepts=lambda e: e is a), \\
            TraceSession("b", calls=range(3), accepts=lambda e: e is b):
        a(x); b(x); a(x); b(x)
elif MODE == "before":
    c = model()
    with torch.profiler.profile() as user:
        with TraceSession("c", calls=range(2)):
            c(x); c(x)
        torch.ones(3).sum()
    user.export_chrome_trace("user.json")
elif MODE == "inside":
    c = model()
    with TraceSession("c", calls=range(3)):
        c(x)
        with torch.profiler.profile() as user:
            c(x)
        user.export_chrome_trace("user.json")
        c(x)
print("RUN DONE")
"""


def _run(tmp_path, script, *args):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    env.pop("POPLAR_ENGINE_OPTIONS", None)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done


def _trace(directory):
    with open(os.path.join(directory, "trace.json")) as stream:
        return json.load(stream)


def _events(directory):
    return [e for e in _trace(directory)["traceEvents"] if e.get("ph") == "X"]


def _notes(directory):
    return " ".join(_trace(directory).get("openpop", {}).get("notes", []))


def _report(directory):
    with open(os.path.join(directory, "report.json")) as stream:
        return json.load(stream)


@pytest.mark.slow
def test_lightning_autoreport_with_validation_writes_both_reports(tmp_path):
    done = _run(tmp_path, LIGHTNING_AUTOREPORT)
    assert "FIT DONE" in done.stdout
    assert "USDT" not in done.stderr  # kineto's start/stop lines are not the user's output
    for stage in ("training", "validation"):
        directory = tmp_path / "report" / stage
        assert (directory / "profile.json").is_file() and (directory / "report.html").is_file()
        names = {e["name"] for e in _events(directory)}
        assert "openpop:host_call:0" in names, stage
        assert any(name.startswith("aten::") for name in names), stage
    # training's window was open when validation needed the profiler: it ended early, said so
    assert "ends its window early" in _notes(tmp_path / "report" / "training")
    assert _notes(tmp_path / "report" / "validation") == ""


@pytest.mark.slow
def test_overlapping_sessions_each_keep_their_own_calls(tmp_path):
    _run(tmp_path, POPTORCH_OVERLAP, "sessions")
    # a's window (three calls) ended when b started: a has its first call only; b has two
    assert [h["call"] for h in _report(tmp_path / "a")["host_calls"]] == [0]
    assert [h["call"] for h in _report(tmp_path / "b")["host_calls"]] == [0, 1]
    assert "b needs torch.profiler" in _notes(tmp_path / "a")
    for name in ("a", "b"):
        assert any(e["name"] == "openpop:host_call:0" for e in _events(tmp_path / name))


@pytest.mark.slow
def test_a_users_profiler_running_first_is_left_alone(tmp_path):
    done = _run(tmp_path, POPTORCH_OVERLAP, "before")
    assert "RUN DONE" in done.stdout
    report = _report(tmp_path / "c")
    assert [h["call"] for h in report["host_calls"]] == [0, 1]  # timings kept
    assert _events(tmp_path / "c") == []  # no operator events: the user's profiler has them
    assert "torch.profiler that openpop did not start" in done.stderr
    assert "torch.profiler that openpop did not start" in _notes(tmp_path / "c")
    with open(tmp_path / "user.json") as stream:  # the user's trace is whole
        names = {e.get("name") for e in json.load(stream)["traceEvents"]}
    assert any(str(name).startswith("aten::") for name in names)


@pytest.mark.slow
def test_a_users_profiler_started_inside_the_window_costs_the_trace_not_the_run(tmp_path):
    done = _run(tmp_path, POPTORCH_OVERLAP, "inside")
    assert "RUN DONE" in done.stdout
    assert (tmp_path / "user.json").is_file()
    report = _report(tmp_path / "c")
    assert [h["call"] for h in report["host_calls"]] == [0, 1, 2]
    assert _events(tmp_path / "c") == []
    assert "took its events" in done.stderr and "took its events" in _notes(tmp_path / "c")


def test_a_report_that_cannot_be_written_is_a_warning_and_the_run_stands(tmp_path, monkeypatch):
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.strategies import IPUStrategy

    from openpop.lightning.report import StageProfile

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(StageProfile, "write", full_disk)

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(4, 1)

        def training_step(self, batch, index):
            return self.l(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 4)), batch_size=4)

    model = Model()
    before = model.l.weight.detach().clone()
    trainer = pl.Trainer(default_root_dir=tmp_path, accelerator="ipu", devices=1, max_steps=2, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         strategy=IPUStrategy(autoreport=True, autoreport_dir=str(tmp_path / "report")))
    with pytest.warns(UserWarning, match=r"could not write the training profile report \(the run's result stands\)"):
        trainer.fit(model)
    assert trainer.global_step == 2 and not torch.equal(model.l.weight, before)
