"""Profile trace spans beyond the single-threaded pipeline (issue 16): concurrent micro-batches
on worker threads, the data loader's wait, poprun's all-reduce, and the engine-options window."""
import json
import os

import pytest
import torch

import poptorch
from openpop.runtime.trace import TraceSession

from helpers.poprun_runner import run_poprun
from helpers.profile_models import DI, GA, STAGES, OneLayer, batch, pipelined_model

TESTS = os.path.dirname(os.path.abspath(__file__))


def stage_events(directory):
    events = json.loads((directory / "trace.json").read_text())["traceEvents"]
    return events, [e for e in events if e.get("cat") == "openpop_stage"]


def test_concurrent_micro_batches_get_stage_spans_from_their_threads(tmp_path, monkeypatch, no_environment_session):
    monkeypatch.setenv("OPENPOP_CONCURRENT_STAGES", "on")
    model = pipelined_model()
    with TraceSession(tmp_path, calls=range(1)):
        model(*batch())
    assert model._executable.concurrent
    events, spans = stage_events(tmp_path)
    assert len(spans) == DI * GA * STAGES * 2
    assert len({e["args"]["thread"] for e in spans}) > 1  # recorded on the worker threads
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    by_micro_batch = {}
    for e in spans:
        assert names[e["tid"]].startswith(f"virtual IPU {e['args']['ipu']} (cpu)")
        a = e["args"]
        by_micro_batch.setdefault((a["step"], a["micro_batch"]), {})[(a["kind"], a["stage"])] = e
    assert len(by_micro_batch) == DI * GA
    for key, found in by_micro_batch.items():
        assert len({e["args"]["thread"] for e in found.values()}) == 1, key  # one thread per micro-batch
        order = [found["forward", s] for s in range(STAGES)] + [found["backward", s] for s in reversed(range(STAGES))]
        for earlier, later in zip(order, order[1:]):
            assert earlier["ts"] + earlier["dur"] <= later["ts"], key
    for tid in {e["tid"] for e in spans}:  # spans on one track never cross (Chrome trace nesting)
        track = sorted((e for e in spans if e["tid"] == tid), key=lambda e: e["ts"])
        for earlier, later in zip(track, track[1:]):
            assert earlier["ts"] + earlier["dur"] <= later["ts"]
    summary = json.loads((tmp_path / "report.json").read_text())
    assert all(m["activation_peak_bytes"] > 0 for m in summary["memory"])
    # every thread recorded: torch's profiler gives no memory events then, and the report says so
    assert summary["memory_timeline"] == {} and any("no memory events" in n for n in summary["notes"])
    model.destroy()


@pytest.mark.parametrize("mode", ["Sync", "Async"])
def test_data_loader_wait_is_a_span_between_recorded_calls(tmp_path, no_environment_session, mode):
    opts = poptorch.Options()
    dataset = torch.utils.data.TensorDataset(torch.randn(12, 8), torch.randn(12, 8))
    loader = poptorch.DataLoader(opts, dataset, batch_size=2, mode=getattr(poptorch.DataLoaderMode, mode))
    model = poptorch.trainingModel(OneLayer(), opts)
    with TraceSession(tmp_path, calls=range(3)):
        for x, target in loader:
            model(x, target)
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    calls = sorted((e for e in events if e["name"].startswith("openpop:host_call:")), key=lambda e: e["ts"])
    waits = [e for e in events if e["name"] == "openpop:dataloader_wait" and e["ph"] == "X"]
    # The profiler starts with call 0 and stops after call 2: the waits before calls 1 and 2.
    assert len(calls) == 3 and len(waits) == 2
    for wait, (before, after) in zip(sorted(waits, key=lambda e: e["ts"]), zip(calls, calls[1:])):
        assert before["ts"] + before["dur"] <= wait["ts"] and wait["ts"] + wait["dur"] <= after["ts"]
    model.destroy()
    loader.terminate()


@pytest.mark.slow
def test_poprun_all_reduce_is_a_span_in_each_instance_report(tmp_path):
    directory = tmp_path / "report"
    result = run_poprun("--num-instances", "2", "--num-replicas", "2", "python",
                        os.path.join(TESTS, "helpers", "profile_programs.py"),
                        POPLAR_ENGINE_OPTIONS=json.dumps({"autoReport.all": "true",
                                                          "autoReport.directory": str(directory),
                                                          "autoReport.executionProfileProgramRunCount": 1}),
                        OMP_NUM_THREADS="1")
    assert result.returncode == 0, result.stdout + result.stderr
    for instance in range(2):
        events = json.loads((directory / "training" / f"instance{instance}" / "trace.json").read_text())["traceEvents"]
        call = next(e for e in events if e["name"] == "openpop:host_call:0")
        reduces = [e for e in events if e["name"] == "openpop:all_reduce" and e["ph"] == "X"]
        assert len(reduces) == 1  # one optimizer step
        assert call["ts"] <= reduces[0]["ts"] <= call["ts"] + call["dur"]


def test_engine_options_window_from_a_later_call(tmp_path, monkeypatch, no_environment_session):
    directory = tmp_path / "later"
    monkeypatch.setenv("POPLAR_ENGINE_OPTIONS", json.dumps(
        {"autoReport.all": "true", "autoReport.directory": str(directory),
         "autoReport.executionProfileProgramRunCount": 2, "openpop.firstProfiledRun": 2}))
    model = poptorch.trainingModel(OneLayer())
    for _ in range(5):
        model(torch.randn(2, 8), torch.randn(2, 8))
    report = json.loads((directory / "training" / "report.json").read_text())
    assert [c["call"] for c in report["host_calls"]] == [2, 3]
    model.destroy()


@pytest.mark.parametrize("options, message", [
    ({"autoReport.all": "true", "openpop.firstProfiledRun": -1},
     "openpop.firstProfiledRun must be a non-negative integer"),
    ({"autoReport.all": "true", "autoReport.executionProfileProgramRunCount": "two"},
     "autoReport.executionProfileProgramRunCount must be a non-negative integer, got 'two'"),
    ({"autoReport.all": "true", "openpop.firstProfiledRun": 1.5}, "got 1.5"),
])
def test_bad_window_values_fail_before_the_run(tmp_path, monkeypatch, no_environment_session, options, message):
    monkeypatch.setenv("POPLAR_ENGINE_OPTIONS", json.dumps(dict(options, **{"autoReport.directory": str(tmp_path)})))
    model = poptorch.trainingModel(OneLayer())
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(poptorch.Error, match=message):
        model(torch.randn(2, 8), torch.randn(2, 8))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    model.destroy()


def test_unknown_openpop_engine_option_warns(monkeypatch, no_environment_session, caplog):
    import logging
    monkeypatch.setenv("POPLAR_ENGINE_OPTIONS", json.dumps({"openpop.firstProfiledrun": 3}))
    poptorch.logger.propagate = True
    try:
        with caplog.at_level(logging.WARNING, logger="poptorch::python"):
            model = poptorch.trainingModel(OneLayer())
            model(torch.randn(2, 8), torch.randn(2, 8))
    finally:
        poptorch.logger.propagate = False
    assert any("'openpop.firstProfiledrun'" in r.getMessage() and "openpop.firstProfiledRun" in r.getMessage()
               for r in caplog.records)
    model.destroy()
