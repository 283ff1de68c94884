"""Writing a profile report: ``report.json`` and a self-contained ``report.html`` from a trace.

The trace session (``runtime/trace.py``) calls ``write_report`` when its window closes; the
``openpop-report`` command (``report.py``) reads and rewrites reports. Standard library only,
with ``report_analysis.py`` (the figures) and ``report_html.py`` (the page): the runtime may use
it without importing a front-end.
"""
import json
import os

from . import report_analysis as analysis
from .report_analysis import DEFAULT_WARMUP

FORMAT = "openpop-report-2"
TRACE_FILE = "trace.json"  # written by runtime/trace.py next to the report

REPORT_JSON = "report.json"
REPORT_HTML = "report.html"


def stage_spans(trace: dict):
    """Stage spans of a (post-processed) trace (``report_analysis.stage_spans``)."""
    return analysis.stage_spans(trace)


def summarise(trace: dict, plan, host_calls, options, memory=(), compile=None, warmup=None) -> dict:
    """The report's data: what the run recorded (plan, host calls, options, memory, compile
    breakdown) and what ``derive`` computes from the trace for a number of warm-up calls."""
    allocation = []
    if plan is not None:
        stage, previous = 0, None
        for block in plan.blocks:
            if previous is not None and block.ipu != previous:
                stage += 1
            previous = block.ipu
            device = str(plan.device_map.device(block.ipu)) if plan.device_map is not None else "?"
            allocation.append({"block": block.name, "stage": stage, "ipu": block.ipu, "device": device,
                               "modules": len(block.modules)})
    if options and "values" not in options:  # a plain {key: value} (older callers)
        options = {"values": dict(options), "defaults": {}}
    base = {
        "format": FORMAT,
        "allocation": allocation,
        "pipeline_stages": plan.pipeline_stages if plan is not None else 1,
        "pipelined": bool(plan.pipelined) if plan is not None else False,
        "ipus": plan.ipus_per_replica if plan is not None else max(1, len(list(memory))),
        "host_calls": list(host_calls),
        "options": options or {"values": {}, "defaults": {}},
        "memory": list(memory),
        "compile": compile or {},
        "trace": TRACE_FILE,
    }
    return derive(trace, base, DEFAULT_WARMUP if warmup is None else warmup)


def derive(trace: dict, base: dict, warmup: int) -> dict:
    """``base`` with the figures that depend on which calls count: the first ``warmup`` host
    calls of the model are left out of the timeline, stage times, operator table, memory over
    time and throughput (they stay in the host-call table, marked)."""
    summary = dict(base)
    windows = analysis.host_call_windows(trace)
    kept, note = analysis.measured_calls(base["host_calls"], warmup)
    spans = analysis.stage_spans(trace, windows)
    measured = [s for s in spans if not windows or s["call"] in kept]
    stages = {}
    for s in measured:
        entry = stages.setdefault(s["stage"], {"stage": s["stage"], "ipu": s["ipu"], "forward_us": 0.0,
                                               "backward_us": 0.0, "spans": 0})
        entry[s["kind"] + "_us"] = entry.get(s["kind"] + "_us", 0.0) + s["duration"]
        entry["spans"] += 1
    calls = [dict(c, warmup=c["call"] not in kept) for c in base["host_calls"]]
    counted = [c for c in calls if not c["warmup"]]
    total_seconds = sum(c["seconds"] for c in counted)
    samples = sum(c["samples"] or 0 for c in counted)
    gantt = _one_step(measured)
    ipus = base.get("ipus") or 1
    summary.update({
        "warmup": warmup,
        "measured_calls": sorted(kept),
        "warmup_note": note,
        "stages": [stages[k] for k in sorted(stages)],
        "gantt": gantt,
        "bubble_fraction": _bubble_fraction(gantt),
        "host_calls": calls,
        "throughput_samples_per_second": samples / total_seconds if total_seconds > 0 else None,
        "ops": analysis.op_table(trace, spans, windows, kept),
        "memory_timeline": analysis.memory_timeline(trace, spans, windows, kept, ipus),
        "notes": list((trace.get("openpop") or {}).get("notes", [])),
    })
    return summary


def _one_step(spans):
    """The first optimizer step (training) or device iteration (inference) of the first
    measured call: step numbers restart at 0 on each call."""
    if not spans:
        return []
    first = next((i for i, s in enumerate(spans) if s["step"] == 0 and s["micro_batch"] == 0
                  and s["stage"] == 0 and s["kind"] == "forward"), 0)
    call = spans[first].get("call")
    chosen = [s for s in spans[first:] if s["step"] == 0 and s.get("call") == call]
    origin = chosen[0]["start"] if chosen else 0.0
    return [dict(s, start=s["start"] - origin, end=s["end"] - origin) for s in chosen]


def _bubble_fraction(gantt):
    if not gantt:
        return None
    length = max(s["end"] for s in gantt) - min(s["start"] for s in gantt)
    stages = {s["stage"] for s in gantt}
    busy = sum(s["end"] - s["start"] for s in gantt)
    if length <= 0:
        return None
    return max(0.0, 1.0 - busy / (length * len(stages)))


def write_report(directory, trace, plan, host_calls, options, memory=(), compile=None, warmup=None) -> dict:
    summary = summarise(trace, plan, host_calls, options, memory, compile, warmup)
    write(directory, summary)
    return summary


def write(directory, summary) -> None:
    """``report.json`` and ``report.html`` of ``summary`` into ``directory``."""
    from .report_html import render_html
    with open(os.path.join(directory, REPORT_JSON), "w") as stream:
        json.dump(summary, stream, indent=1, default=str)
    with open(os.path.join(directory, REPORT_HTML), "w") as stream:
        stream.write(render_html(summary))


def warmup_line(summary) -> str:
    """What the figures leave out, in words (the terminal summary and the HTML say the same)."""
    warmup = summary.get("warmup", 0)
    left_out = [c["call"] for c in summary["host_calls"] if c.get("warmup")]
    if summary.get("warmup_note"):
        return "Warm-up: " + summary["warmup_note"]
    if left_out:
        return (f"Warm-up: host call{'s' if len(left_out) > 1 else ''} {', '.join(map(str, left_out))} left out of "
                f"the timeline and statistics (the model's first {warmup}; --warmup 0 keeps them)")
    return f"Warm-up: none of the recorded calls is among the model's first {warmup} host calls: all counted"


def comparison_rows(first: dict, second: dict) -> list:
    """``[(section, name, A, B, unit)]``: the two reports' figures side by side (numbers in the
    unit named; None where a report lacks one)."""
    def median(values):
        values = sorted(values)
        return values[len(values) // 2] if values else None

    def per_call(summary, key):
        return median([c[key] * 1000 for c in summary["host_calls"] if not c.get("warmup")])

    rows = [("headline", "throughput", first.get("throughput_samples_per_second"),
             second.get("throughput_samples_per_second"), "samples/s"),
            ("headline", "host call, median wall", per_call(first, "seconds"), per_call(second, "seconds"), "ms"),
            ("headline", "host call, median compute", per_call(first, "compute_seconds"),
             per_call(second, "compute_seconds"), "ms"),
            ("headline", "host call, median host", per_call(first, "host_seconds"), per_call(second, "host_seconds"),
             "ms"),
            ("headline", "bubble fraction", first.get("bubble_fraction"), second.get("bubble_fraction"), "")]
    stages = sorted({s["stage"] for s in first["stages"]} | {s["stage"] for s in second["stages"]})
    for stage in stages:
        for kind in ("forward", "backward"):
            a = next((s[f"{kind}_us"] / 1000 for s in first["stages"] if s["stage"] == stage), None)
            b = next((s[f"{kind}_us"] / 1000 for s in second["stages"] if s["stage"] == stage), None)
            rows.append(("stages", f"stage {stage} {kind}", a, b, "ms"))
    for group in _paired_groups(first, second):
        a_ops = {o["name"]: o for o in group[1]["ops"]} if group[1] else {}
        b_ops = {o["name"]: o for o in group[2]["ops"]} if group[2] else {}
        names = sorted(set(a_ops) | set(b_ops), key=lambda n: -max(a_ops.get(n, {}).get("self_us", 0),
                                                                  b_ops.get(n, {}).get("self_us", 0)))
        for name in names[:5]:
            rows.append((f"operators, {group[0]} (self time)", name,
                         a_ops[name]["self_us"] / 1000 if name in a_ops else None,
                         b_ops[name]["self_us"] / 1000 if name in b_ops else None, "ms"))
    peaks = [{s["name"]: s["peak_bytes"] for s in (x.get("memory_timeline") or {}).get("series", [])}
             for x in (first, second)]
    for name in sorted(set(peaks[0]) | set(peaks[1])):
        rows.append(("memory (peak live bytes)", name, _mib(peaks[0].get(name)), _mib(peaks[1].get(name)), "MiB"))
    compiles = [{r["phase"]: r["seconds"] for r in (x.get("compile") or {}).get("phases", [])} for x in (first, second)]
    totals = [(x.get("compile") or {}).get("total_seconds") for x in (first, second)]
    if any(totals):
        rows.append(("compile", "total", totals[0], totals[1], "s"))
        for phase in list(compiles[0]) + [p for p in compiles[1] if p not in compiles[0]]:
            rows.append(("compile", phase, compiles[0].get(phase), compiles[1].get(phase), "s"))
    return rows


def _mib(value):
    return None if value is None else value / 2 ** 20


def _paired_groups(first, second):
    """``[(name, group of A or None, group of B or None)]`` of the operator tables."""
    groups = {}
    for i, summary in enumerate((first, second)):
        for group in summary.get("ops", []):
            key = (group["stage"] is None, group["stage"] or 0)
            groups.setdefault(key, [group_name(group), None, None])[1 + i] = group
    return [tuple(groups[k]) for k in sorted(groups)]


def group_name(group) -> str:
    return f"stage {group['stage']} (IPU {group['ipu']})" if group["stage"] is not None else analysis.OUTSIDE
