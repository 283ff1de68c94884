"""The profile report's views (issue 33 item 7): warm-up calls left out (selectable), the
per-stage operator table, memory over time per virtual IPU from the profiler's memory events,
the compile breakdown, units, readable options, the host-call chart, the bubble explanation,
and ``--compare`` with the new tables."""
import json
import os
import subprocess
import sys

import pytest

from openpop import report, report_analysis
from openpop.report_analysis import fmt_bytes, fmt_seconds, fmt_time_us
from openpop.runtime import trace as trace_module
from openpop.runtime.trace import TraceSession

from helpers.profile_models import DI, GA, STAGES, batch, pipelined_model

CALLS = 3  # host calls 0, 1, 2 recorded; call 0 is the warm-up


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    os.environ.pop(trace_module.ENGINE_OPTIONS_ENV, None)
    trace_module.reset_environment_session()
    directory = tmp_path_factory.mktemp("views")
    model = pipelined_model()
    x, target = batch()
    with TraceSession(directory, calls=range(CALLS)):
        for _ in range(CALLS):
            model(x, target)
    model.destroy()
    return directory


def load(directory):
    return json.loads((directory / "report.json").read_text())


def test_warm_up_call_is_left_out_by_default_and_said(warm):
    summary = load(warm)
    assert summary["warmup"] == report_analysis.DEFAULT_WARMUP == 1
    assert summary["measured_calls"] == [1, 2]
    assert [c["warmup"] for c in summary["host_calls"]] == [True, False, False]
    # stage times and the timeline come from calls 1 and 2 only
    assert sum(s["spans"] for s in summary["stages"]) == 2 * DI * GA * STAGES * 2
    assert {s["call"] for s in summary["gantt"]} == {1}
    counted = [c for c in summary["host_calls"] if not c["warmup"]]
    rows = sum(c["samples"] for c in counted)
    assert summary["throughput_samples_per_second"] == pytest.approx(rows / sum(c["seconds"] for c in counted))
    page = (warm / "report.html").read_text()
    assert "host call 0 left out of the timeline and statistics" in page
    assert "0 (warm-up, left out)" in page and "call 0 (warm-up)" in page
    assert "Warm-up: host call 0 left out" in report.terminal_summary(str(warm))


def test_warmup_is_selectable_from_the_command_line(warm, tmp_path, capsys):
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("trace.json", "report.json"):
        (copy / name).write_text((warm / name).read_text())
    assert report.main([str(copy), "--warmup", "0"]) == 0
    assert "Warm-up: none of the recorded calls" in capsys.readouterr().out
    summary = load(copy)
    assert summary["warmup"] == 0 and summary["measured_calls"] == [0, 1, 2]
    assert sum(s["spans"] for s in summary["stages"]) == 3 * DI * GA * STAGES * 2
    assert "(warm-up" not in (copy / "report.html").read_text()
    assert report.main([str(copy), "--warmup", "9"]) == 0  # every recorded call is a warm-up: all kept, said
    summary = load(copy)
    assert summary["measured_calls"] == [0, 1, 2] and "every recorded host call is a warm-up" in summary["warmup_note"]
    with pytest.raises(SystemExit):
        report.main([str(copy), "--warmup", "-1"])


def test_warmup_keyword_and_engine_option(tmp_path, monkeypatch, no_environment_session):
    model = pipelined_model()
    with TraceSession(tmp_path / "kw", calls=range(3), warmup=2):
        for _ in range(3):
            model(*batch())
    assert load(tmp_path / "kw")["measured_calls"] == [2]
    monkeypatch.setenv(trace_module.ENGINE_OPTIONS_ENV, json.dumps(
        {"autoReport.all": "true", "autoReport.directory": str(tmp_path / "env"), "openpop.warmupCalls": 0}))
    session = trace_module.session_from_engine_options(
        trace_module.parse_engine_options(os.environ[trace_module.ENGINE_OPTIONS_ENV]))
    assert session.warmup == 0


def test_operator_table_per_stage_from_the_measured_calls(warm):
    groups = load(warm)["ops"]
    assert [g["stage"] for g in groups] == [0, 1, 2, 3, None]  # None: outside every stage span
    for group in groups:
        ops = group["ops"]
        assert 0 < len(ops) <= report_analysis.TOP_OPS
        assert [o["self_us"] for o in ops] == sorted((o["self_us"] for o in ops), reverse=True)
        assert all(0 <= o["self_us"] <= o["total_us"] + 1e-6 for o in ops)
        assert group["self_us"] >= sum(o["self_us"] for o in ops) - 1e-6
    for group in groups[:STAGES]:
        # each stage runs one tanh per micro-batch forward: 2 measured calls x DI x GA
        names = {o["name"]: o for o in group["ops"]}
        assert names["aten::tanh"]["calls"] == 2 * DI * GA, group["stage"]
        assert group["ipu"] == group["stage"]
    page = (warm / "report.html").read_text()
    assert "Top operators per stage (self time)" in page and "stage 3 (IPU 3):" in page


def test_self_time_and_stage_of_synthetic_operators():
    trace = {"traceEvents": [
        {"ph": "X", "name": "openpop:host_call:1", "ts": 0, "dur": 1000, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "openpop_stage", "name": "stage0 forward mb0", "ts": 10, "dur": 500, "pid": 1, "tid": 99,
         "args": {"ipu": 0, "stage": 0, "kind": "forward", "micro_batch": 0, "step": 0, "thread": 1}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "ts": 20, "dur": 100, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "ts": 30, "dur": 70, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::sgd", "ts": 600, "dur": 40, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::warm", "ts": 2000, "dur": 40, "pid": 1, "tid": 1},  # no call
    ]}
    windows = report_analysis.host_call_windows(trace)
    spans = report_analysis.stage_spans(trace, windows)
    groups = report_analysis.op_table(trace, spans, windows, {1})
    stage0 = {o["name"]: o for o in groups[0]["ops"]}
    assert groups[0]["stage"] == 0 and stage0["aten::linear"]["self_us"] == pytest.approx(30)
    assert stage0["aten::addmm"]["self_us"] == pytest.approx(70) and stage0["aten::linear"]["total_us"] == 100
    assert groups[1]["stage"] is None and [o["name"] for o in groups[1]["ops"]] == ["aten::sgd"]


def test_memory_over_time_attributes_allocations_to_the_stage_that_made_them():
    def memory(ts, size, address, total, tid=1):
        return {"ph": "i", "name": "[memory]", "ts": ts, "pid": 1, "tid": tid,
                "args": {"Bytes": size, "Addr": address, "Total Allocated": total}}

    trace = {"traceEvents": [
        {"ph": "X", "name": "openpop:host_call:1", "ts": 0, "dur": 1000, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "openpop_stage", "name": "s", "ts": 100, "dur": 100, "pid": 1, "tid": 99,
         "args": {"ipu": 1, "stage": 1, "kind": "forward", "micro_batch": 0, "step": 0, "thread": 1}},
        memory(150, 4096, "a", 4096),
        memory(300, 1024, "b", 5120),      # outside every stage span
        memory(400, -4096, "a", 1024),     # freed outside the span: still IPU 1's block
        memory(500, -77, "old", 1024),     # allocated before the profile: not counted
        dict(memory(600, 8192, "c", 8192), args={"Bytes": 8192, "Addr": "c", "Total Allocated": 8192,
                                                 "Device Type": 1, "Device Id": 0}),  # on a GPU: its own total
    ]}
    windows = report_analysis.host_call_windows(trace)
    timeline = report_analysis.memory_timeline(trace, report_analysis.stage_spans(trace, windows), windows, {1}, 2)
    series = {s["name"]: s for s in timeline["series"]}
    assert set(series) == {"virtual IPU 1", report_analysis.OUTSIDE}
    assert series["virtual IPU 1"]["points"] == [[0.0, 0], [0.15, 4096], [0.4, 0]]
    assert series["virtual IPU 1"]["peak_bytes"] == 4096
    assert series[report_analysis.OUTSIDE]["peak_bytes"] == 1024 + 8192  # every device's allocations
    assert [(t["device"], t["peak_bytes"]) for t in timeline["totals"]] == [("cpu", 5120), ("cuda:0", 8192)]
    assert timeline["calls"] == [[1, 0.0, 1.0]]


def test_memory_over_time_per_virtual_ipu_is_recorded(warm):
    summary = load(warm)
    timeline = summary["memory_timeline"]
    names = [s["name"] for s in timeline["series"]]
    assert names[:STAGES] == [f"virtual IPU {i}" for i in range(STAGES)]
    for s in timeline["series"]:
        assert s["peak_bytes"] > 0 and len(s["points"]) <= report_analysis.MAX_POINTS + 1
        assert all(0 <= t <= timeline["length_ms"] + 1e-6 for t, _ in s["points"])
    assert [c[0] for c in timeline["calls"]] == [1, 2]
    trace = json.loads((warm / "trace.json").read_text())
    assert any(e.get("name") == "[memory]" for e in trace["traceEvents"])  # profile_memory is on
    page = (warm / "report.html").read_text()
    assert "Memory over time" in page and "virtual IPU 3: peak" in page and "KiB" in page


def test_compile_breakdown(warm):
    breakdown = load(warm)["compile"]
    phases = {row["phase"]: row["seconds"] for row in breakdown["phases"]}
    assert phases["graph capture"] > 0 and "placement" in phases
    assert "backend compile (torch.compile)" in phases
    assert sum(phases.values()) == pytest.approx(breakdown["total_seconds"], rel=1e-6, abs=1e-9)
    assert "Compile time" in (warm / "report.html").read_text()
    assert "Compile: " in report.terminal_summary(str(warm))


def test_units_and_readable_options(warm):
    assert fmt_bytes(512) == "512 B" and fmt_bytes(1536) == "1.5 KiB" and fmt_bytes(3 * 2 ** 20) == "3.0 MiB"
    assert fmt_bytes(5 * 2 ** 30) == "5.0 GiB" and fmt_bytes(None) == "n/a"
    assert fmt_time_us(12.3) == "12.3 µs" and fmt_time_us(1500) == "1.50 ms" and fmt_seconds(2.5) == "2.50 s"
    options = load(warm)["options"]
    assert options["values"]["output_mode"] == "OutputMode.Final"
    assert options["values"]["connection_type"] == "ConnectionType.Always"
    assert options["values"]["execution_mode"] == "PipelinedExecution"
    changed = sorted(k for k, v in options["values"].items() if options["defaults"].get(k) != v)
    assert changed == ["device_iterations", "gradient_accumulation"]
    page = (warm / "report.html").read_text()
    assert "Set by the script (2 of" in page and "<details><summary>All" in page
    assert "OutputMode.Final" in page and " bytes)" not in page


def test_bubble_fraction_is_explained_for_stages_on_one_device(warm):
    page = (warm / "report.html").read_text()
    assert "they cannot overlap" in page and "at least 75% is expected by construction" in page


def test_compare_shows_the_new_tables_side_by_side(warm, capsys):
    assert report.main([str(warm), "--compare", str(warm)]) == 0
    out = capsys.readouterr().out
    for section in ("headline:", "stages:", "operators, stage 0 (IPU 0) (self time):", "memory (peak live bytes):",
                    "compile:"):
        assert section in out
    assert "Side by side: " in out
    page = (warm / report.COMPARE_HTML).read_text()
    assert page.count("Top operators per stage") == 2 and page.count("Memory over time") == 2
    assert "B / A" in page and "<script" not in page


def test_memory_profiling_leaves_the_users_output_clean(tmp_path):
    """torch warns once per process on stderr when a block allocated before a memory profile is
    freed: openpop spends that warning where it goes nowhere."""
    script = (
        "import sys; sys.path.insert(0, 'tests')\n"
        "from helpers.profile_models import pipelined_model, batch\n"
        "from openpop.runtime.trace import TraceSession\n"
        "model = pipelined_model(); x, t = batch(); before = [x * 2 for _ in range(3)]\n"
        f"with TraceSession({str(tmp_path)!r}, calls=range(2)):\n"
        "    model(x, t); del before; model(x, t)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1")
    env.pop(trace_module.ENGINE_OPTIONS_ENV, None)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert result.returncode == 0, result.stderr
    assert "Memory block of unknown size" not in result.stderr and "USDT" not in result.stderr
    assert (tmp_path / "report.html").exists()
