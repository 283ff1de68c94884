"""Profile traces and reports (issue 16): torch.profiler traces with openpop's spans, the HTML
report, ``python -m openpop.report`` and ``POPLAR_ENGINE_OPTIONS``."""
import io
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import poptorch
from openpop.runtime import trace as trace_module
from openpop.runtime.trace import TraceSession

from helpers.profile_models import DI, GA, MICRO, STAGES, FourStages, OneLayer, batch, pipelined_model


def test_trace_is_chrome_trace_json_with_openpop_spans(recorded):
    events = recorded["trace"]["traceEvents"]
    for event in events:
        assert {"ph", "name", "pid", "tid"} <= set(event)
        if event["ph"] == "X":
            assert isinstance(event["ts"], (int, float)) and event["dur"] >= 0
    names = {e["name"] for e in events if e["ph"] == "X"}
    for expected in ("openpop:host_call:1", "openpop:host_call:2", "openpop:forward", "openpop:backward",
                     "openpop:gradient_reduction", "openpop:optimizer_step", "openpop:output_collection"):
        assert expected in names
    assert "openpop:host_call:0" not in names  # outside the window
    assert any(name.startswith("aten::") for name in names)  # torch.profiler's operator view
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"
              and "virtual IPU" in e["args"]["name"]}
    assert sorted(tracks.values()) == [f"virtual IPU {i} (cpu)" for i in range(STAGES)]
    stage_events = [e for e in events if e.get("cat") == "openpop_stage"]
    # 2 calls x DI steps x GA micro-batches x stages x (forward, backward)
    assert len(stage_events) == 2 * DI * GA * STAGES * 2
    for e in stage_events:
        assert tracks[e["tid"]] == f"virtual IPU {e['args']['ipu']} (cpu)"


def test_stage_order_per_micro_batch_from_timestamps(recorded):
    spans = [e for e in recorded["trace"]["traceEvents"] if e.get("cat") == "openpop_stage"]
    calls = sorted((e for e in recorded["trace"]["traceEvents"] if e["name"].startswith("openpop:host_call:")),
                   key=lambda e: e["ts"])
    for call in calls:
        inside = [e for e in spans if call["ts"] <= e["ts"] <= call["ts"] + call["dur"]]
        by_micro_batch = {}
        for e in inside:
            a = e["args"]
            by_micro_batch.setdefault((a["step"], a["micro_batch"]), {})[(a["kind"], a["stage"])] = e
        assert len(by_micro_batch) == DI * GA
        for key, found in by_micro_batch.items():
            forward = [found["forward", s] for s in range(STAGES)]
            backward = [found["backward", s] for s in range(STAGES)]
            for earlier, later in zip(forward, forward[1:]):
                assert earlier["ts"] + earlier["dur"] <= later["ts"], key
            for earlier, later in zip(backward[::-1], backward[::-1][1:]):  # last stage first
                assert earlier["ts"] + earlier["dur"] <= later["ts"], key
            assert forward[-1]["ts"] + forward[-1]["dur"] <= backward[-1]["ts"], key


def test_report_numbers_equal_perf_counters_and_plan(recorded):
    report, perf, plan = recorded["report"], recorded["perf"], recorded["plan"]
    last = report["host_calls"][-1]
    assert last["call"] == 2
    assert last["perf_counters"] == perf
    starts, computed = perf["input_complete"][0], perf["output"][0]
    steps = [computed[0] - starts[0]] + [b - a for a, b in zip(computed, computed[1:])]
    assert last["step_seconds"] == pytest.approx(steps)
    assert last["compute_seconds"] == pytest.approx(sum(steps))
    assert last["host_seconds"] == pytest.approx(last["seconds"] - sum(steps))
    assert last["samples"] == DI * GA * MICRO
    total = sum(c["seconds"] for c in report["host_calls"])
    assert report["throughput_samples_per_second"] == pytest.approx(2 * DI * GA * MICRO / total)
    assert [(a["block"], a["stage"], a["ipu"], a["device"]) for a in report["allocation"]] == [
        (b.name, i, b.ipu, str(plan.device_map.device(b.ipu))) for i, b in enumerate(plan.blocks)]
    assert report["pipeline_stages"] == plan.pipeline_stages == STAGES
    # Per-stage time is the sum of that stage's spans in the trace.
    spans = [e for e in recorded["trace"]["traceEvents"] if e.get("cat") == "openpop_stage"]
    for stage in report["stages"]:
        forward = sum(e["dur"] for e in spans if e["args"]["stage"] == stage["stage"]
                      and e["args"]["kind"] == "forward")
        assert stage["forward_us"] == pytest.approx(forward)
    gantt = report["gantt"]
    assert len(gantt) == GA * STAGES * 2 and {s["step"] for s in gantt} == {0}
    assert 0.0 <= report["bubble_fraction"] < 1.0
    assert set(report["options"]["values"]) == set(recorded["options"]) and len(report["options"]["values"]) > 10
    layer_bytes = (8 * 8 + 8) * 4
    activations = [m.pop("activation_peak_bytes") for m in report["memory"]]
    assert [m.pop("device_peak_bytes") for m in report["memory"]] == [None] * STAGES  # CPU: no CUDA stats
    assert report["memory"] == [{"ipu": i, "parameter_bytes": layer_bytes, "buffer_bytes": 0,
                                 "optimizer_state_bytes": 0} for i in range(STAGES)]
    assert all(a > 0 for a in activations)  # measured: tests/test_profile_memory.py


def test_html_report_is_self_contained(recorded):
    text = (recorded["dir"] / "report.html").read_text()
    assert text.startswith("<!DOCTYPE html>")
    for fetch in ("<script src", "<link", "https://", "@import"):
        assert fetch not in text
    assert "<svg" in text and "stage 3 (IPU 3)" in text
    assert "Execution plan" in text and "Options" in text and "samples/s" in text


@pytest.mark.slow
def test_cli_prints_terminal_summary(recorded):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run([sys.executable, "-m", "openpop.report", str(recorded["dir"])],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    for expected in ("Execution plan:", "stage 3 (IPU 3): forward", "Bubble fraction", "call 2: wall",
                     "IPU 3: 288 B / 0 B / 0 B / ",
                     "Throughput:"):
        assert expected in result.stdout
    missing = subprocess.run([sys.executable, "-m", "openpop.report", str(recorded["dir"] / "nope")],
                             capture_output=True, text=True, env=env, timeout=60)
    assert missing.returncode == 1 and "not an openpop profile directory" in missing.stderr


def test_engine_options_environment_turns_tracing_on(tmp_path, monkeypatch, no_environment_session):
    directory = tmp_path / "env_report"
    monkeypatch.setenv("POPLAR_ENGINE_OPTIONS", json.dumps(
        {"autoReport.all": "true", "autoReport.directory": str(directory),
         "autoReport.executionProfileProgramRunCount": 1}))
    model = pipelined_model()
    model(*batch())
    model(*batch())
    training = directory / "training"  # PopTorch's subdirectory per model (Options.modelName)
    report = json.loads((training / "report.json").read_text())
    assert [c["call"] for c in report["host_calls"]] == [0]
    assert (training / "trace.json").exists() and (training / "report.html").exists()
    model.destroy()


def test_each_model_reports_to_its_own_subdirectory_and_says_where(tmp_path, monkeypatch, capfd,
                                                                   no_environment_session):
    monkeypatch.setenv("POPLAR_ENGINE_OPTIONS", json.dumps(
        {"autoReport.all": "true", "autoReport.directory": str(tmp_path),
         "autoReport.executionProfileProgramRunCount": 1}))
    net = OneLayer()
    training = poptorch.trainingModel(net)
    inference = poptorch.inferenceModel(net)
    named = poptorch.inferenceModel(OneLayer(), poptorch.Options().modelName("classifier"))
    x, target = torch.randn(2, 8), torch.randn(2, 8)
    training(x, target)
    inference(x, target)
    named(x, target)
    printed = capfd.readouterr().err
    for name, kind in (("training", True), ("inference", False), ("classifier", False)):
        report = json.loads((tmp_path / name / "report.json").read_text())
        assert [(c["call"], c["training"]) for c in report["host_calls"]] == [(0, kind)], name
        assert f"openpop profile report: {tmp_path / name / 'report.html'}" in printed
    for model in (training, inference, named):
        model.destroy()


def test_malformed_engine_options_fail_before_the_run(monkeypatch, no_environment_session):
    monkeypatch.setenv("POPLAR_ENGINE_OPTIONS", '{"autoReport.all": true,')
    model = pipelined_model()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(poptorch.Error, match="POPLAR_ENGINE_OPTIONS is not valid JSON"):
        model(*batch())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    model.destroy()


def test_unknown_autoreport_key_warns(tmp_path, monkeypatch, no_environment_session, warnings_logged):
    monkeypatch.setenv("POPLAR_ENGINE_OPTIONS", json.dumps(
        {"autoReport.all": "false", "autoReport.outputEverything": "true"}))
    model = pipelined_model()
    model(*batch())
    assert any("'autoReport.outputEverything'" in m for m in warnings_logged())
    model.destroy()


def test_unwritable_directory_is_an_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(poptorch.Error, match="not writable"):
        TraceSession(blocker / "report")


def test_tracing_off_enters_no_profiler(no_environment_session):
    seen = []

    class Probe(FourStages):
        def forward(self, x, target):
            hooks = [h for m in self.modules() for h in [*m._forward_pre_hooks.values(), *m._forward_hooks.values()]]
            spans = [h for h in hooks if isinstance(getattr(getattr(h, "func", h), "__self__", None),
                                                    trace_module.StageSpans)]
            seen.append((torch.autograd.profiler._is_profiler_enabled, len(spans)))
            return super().forward(x, target)

    opts = poptorch.Options().deviceIterations(DI)
    opts.Training.gradientAccumulation(GA)
    opts.setExecutionStrategy(poptorch.PipelinedExecution())
    model = poptorch.trainingModel(Probe(), opts)
    model(*batch())
    assert seen and set(seen) == {(False, 0)}
    model.destroy()


def test_channel_tracepoints_appear_in_the_trace(tmp_path, no_environment_session):
    channel = poptorch.profiling.Channel("mine")

    class Marked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x, target):
            with channel.tracepoint("body"):
                out = self.fc(x)
            return out, F.mse_loss(out, target)

    model = poptorch.trainingModel(Marked())
    x, target = torch.randn(2, 8), torch.randn(2, 8)
    with poptorch.profiling.TraceSession(tmp_path, calls=range(1)):
        model(x, target)
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert any(e["name"] == "mine:body" and e["ph"] == "X" for e in events)
    assert [r[0] for r in channel.records][-1] == "body"
    model.destroy()


def test_enable_profiling_option_turns_tracing_on(tmp_path, no_environment_session):
    opts = poptorch.Options().enableProfiling(str(tmp_path / "opt_report"))
    model = poptorch.trainingModel(OneLayer(), opts)
    x, target = torch.randn(2, 8), torch.randn(2, 8)
    for _ in range(3):
        model(x, target)
    report = json.loads((tmp_path / "opt_report" / "training" / "report.json").read_text())
    assert [c["call"] for c in report["host_calls"]] == [0, 1]  # the default window: 2 calls
    model.destroy()


def test_bert_profile_dir_writes_a_report(tmp_path, no_environment_session):
    pytest.importorskip("transformers")
    from openpop.bert import train
    from openpop.bert.config import make_config
    config = make_config("unit_test", dataset="generated", device_iterations=1, gradient_accumulation=2,
                         training_steps=2, ipus_per_replica=1, layers_per_ipu=[3], disable_progress_bar=True,
                         data_cache_dir=str(tmp_path / "cache"), profile_dir=str(tmp_path / "bert_report"))
    train.run(config, stream=io.StringIO())
    trace_module.reset_environment_session()  # the window (2 calls) is full: already written
    report = json.loads((tmp_path / "bert_report" / "training" / "report.json").read_text())
    assert [c["call"] for c in report["host_calls"]] == [0, 1]
    assert (tmp_path / "bert_report" / "training" / "report.html").exists()


def test_openpop_report_cli_help_compare_and_errors(recorded, capsys):
    from openpop import report
    with pytest.raises(SystemExit) as exit_info:
        report.main(["--help"])
    assert exit_info.value.code == 0
    usage = capsys.readouterr().out
    assert usage.startswith("usage: openpop-report [-h] [--open] [--compare OTHER] [--warmup N] directory")
    assert "example: openpop-report" in usage
    directory = str(recorded["dir"])
    assert report.main([directory, "--compare", directory]) == 0
    out = capsys.readouterr().out
    assert "Execution plan:" in out and f"B = {directory}" in out
    throughput = next(line for line in out.splitlines() if line.startswith("  throughput (samples/s)"))
    assert throughput.split()[-1] == "1.000"  # a report against itself
    assert report.main([directory, "--compare", directory + "/nope"]) == 1
    err = capsys.readouterr().err
    assert "openpop-report: error:" in err and "not an openpop profile directory" in err
