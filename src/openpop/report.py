"""The profile report: ``report.json`` + a self-contained ``report.html`` next to ``trace.json``.

``openpop-report DIR`` (or ``python -m openpop.report DIR``) prints a terminal summary of a report
directory (plan, stage times, bubble fraction, top operators per stage, memory, compile
breakdown, host vs compute per host call); ``--compare OTHER`` adds a second report's figures
side by side (and writes ``compare.html``), ``--warmup N`` recomputes the report leaving the
model's first N host calls out, ``--open`` opens the page.

Numbers come from the trace (stage spans, operator and memory events; ``report_analysis.py``)
and the executor's perf counters (``getPerfCounters()``); nothing is estimated. Warm-up calls
(by default the model's first host call) are left out of the timeline and statistics and
marked in the host-call table. The Gantt chart shows the first optimizer step (training) or
device iteration (inference) of the first measured call. The bubble fraction is the share of
that step's span, summed over stages, in which a stage ran neither forward nor backward.
"""
import json
import os
import sys
from typing import Optional

from . import report_analysis as analysis
from .report_analysis import DEFAULT_WARMUP, fmt_bytes, fmt_seconds, fmt_time_us
from .runtime import messages

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
    _write(directory, summary)
    return summary


def _write(directory, summary) -> None:
    from .report_html import render_html
    with open(os.path.join(directory, REPORT_JSON), "w") as stream:
        json.dump(summary, stream, indent=1, default=str)
    with open(os.path.join(directory, REPORT_HTML), "w") as stream:
        stream.write(render_html(summary))


def render_html(summary: dict, other: Optional[dict] = None) -> str:
    """The self-contained HTML page of a summary (``report_html.py``), or of two side by side."""
    from . import report_html
    return report_html.render_html(summary, other)


def rewrite(directory: str, warmup: int) -> dict:
    """Recompute ``directory``'s report from its ``trace.json`` with ``warmup`` warm-up calls
    left out, and write ``report.json`` and ``report.html`` again."""
    summary = _load_summary(directory)
    with open(os.path.join(directory, summary.get("trace", TRACE_FILE))) as stream:
        trace = json.load(stream)
    base = {k: summary[k] for k in ("format", "allocation", "pipeline_stages", "pipelined", "host_calls", "options",
                                     "memory", "trace") if k in summary}
    base.update(ipus=summary.get("ipus") or max(1, len(summary.get("memory", []))), compile=summary.get("compile", {}))
    summary = derive(trace, base, warmup)
    _write(directory, summary)
    return summary


def _fmt(value, pattern):
    return "n/a" if value is None else pattern.format(value)


# ---------------------------------------------------------------------- terminal
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


def terminal_summary(directory: str) -> str:
    summary = _load_summary(directory)
    lines = [f"openpop profile report: {directory}", warmup_line(summary), "", "Execution plan:"]
    for a in summary["allocation"]:
        lines.append(f"  {a['block']:<30} stage {a['stage']}  IPU {a['ipu']}  {a['device']}")
    lines += ["", "Stage times (measured calls):"]
    for s in summary["stages"]:
        lines.append(f"  stage {s['stage']} (IPU {s['ipu']}): forward {fmt_time_us(s['forward_us']):>10}   "
                     f"backward {fmt_time_us(s['backward_us']):>10}")
    lines.append(f"Bubble fraction (one step): {_fmt(summary['bubble_fraction'], '{:.1%}')}")
    for group in summary.get("ops", []):
        lines += ["", f"Top operators by self time, {_group_name(group)} (of {fmt_time_us(group['self_us'])}):"]
        for op in group["ops"][:5]:
            lines.append(f"  {op['name']:<40} {fmt_time_us(op['self_us']):>10}  {op['calls']:>6} calls")
    lines += ["", "Memory per virtual IPU (parameters / buffers / optimizer state / peak activations):"]
    for m in summary.get("memory", []):
        lines.append(f"  IPU {m['ipu']}: {fmt_bytes(m['parameter_bytes'])} / {fmt_bytes(m['buffer_bytes'])} / "
                     f"{fmt_bytes(m['optimizer_state_bytes'])} / {fmt_bytes(m.get('activation_peak_bytes'))}")
    timeline = summary.get("memory_timeline") or {}
    if timeline.get("series"):
        lines.append("Peak bytes live, allocated while a stage ran (profiler memory events): " + ", ".join(
            f"{s['name']} {fmt_bytes(s['peak_bytes'])}" for s in timeline["series"]))
    breakdown = summary.get("compile") or {}
    if breakdown:
        lines += ["", f"Compile: {fmt_seconds(breakdown.get('total_seconds'))} in all: " + ", ".join(
            f"{row['phase']} {fmt_seconds(row['seconds'])}" for row in breakdown.get("phases", []))]
    lines += ["", "Host calls:"]
    for c in summary["host_calls"]:
        lines.append(f"  call {c['call']}: wall {fmt_seconds(c['seconds'])}"
                     f"  compute {fmt_seconds(c['compute_seconds'])}"
                     f"  host {fmt_seconds(c['host_seconds'])}" + ("  (warm-up, left out)" if c.get("warmup") else ""))
    lines.append(f"Throughput: {_fmt(summary['throughput_samples_per_second'], '{:.1f} samples/s')}")
    lines.append(f"Trace: {os.path.join(directory, summary['trace'])}")
    return "\n".join(lines)


def _group_name(group) -> str:
    return f"stage {group['stage']} (IPU {group['ipu']})" if group["stage"] is not None else analysis.OUTSIDE


def _load_summary(directory: str) -> dict:
    path = os.path.join(directory, REPORT_JSON)
    if not os.path.exists(path):
        raise FileNotFoundError(messages.NOT_A_PROFILE.format(directory=directory, path=path))
    with open(path) as stream:
        summary = json.load(stream)
    options = summary.get("options")
    if isinstance(options, dict) and "values" not in options:  # openpop-report-1
        summary["options"] = {"values": options, "defaults": {}}
    return summary


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
            groups.setdefault(key, [_group_name(group), None, None])[1 + i] = group
    return [tuple(groups[k]) for k in sorted(groups)]


def comparison(directory: str, other: str) -> str:
    """Two reports' figures side by side, with the ratio of the second to the first."""
    first, second = _load_summary(directory), _load_summary(other)
    lines = [f"{'':<44} {'A':>12} {'B':>12} {'B / A':>8}", f"A = {directory}", f"B = {other}"]
    section = None
    for part, name, a, b, unit in comparison_rows(first, second):
        if part != section:
            section = part
            lines.append(f"{part}:")
        ratio = f"{b / a:.3f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a else "-"
        label = f"  {name}" + (f" ({unit})" if unit else "")
        lines.append(f"{label[:44]:<44} {_fmt(a, '{:.3f}'):>12} {_fmt(b, '{:.3f}'):>12} {ratio:>8}")
    return "\n".join(lines)


def _parser():
    import argparse
    parser = argparse.ArgumentParser(
        prog="openpop-report",
        description="Summarise an openpop profile directory (report.json, report.html and trace.json, written by "
                    "POPLAR_ENGINE_OPTIONS autoReport, Options.enableProfiling or IPUStrategy(autoreport=True)).",
        epilog="example: openpop-report ./report/training --compare ./report_before/training")
    parser.add_argument("directory", help="a profile directory (the one holding report.json)")
    parser.add_argument("--open", action="store_true", help="open report.html in the default web browser")
    parser.add_argument("--compare", metavar="OTHER",
                        help="another profile directory: its figures beside these, in the terminal and in "
                             "DIRECTORY/compare.html")
    parser.add_argument("--warmup", metavar="N", type=int,
                        help=f"leave the model's first N host calls out of the timeline and statistics, and write "
                             f"report.json and report.html again from trace.json (default when recorded: "
                             f"{DEFAULT_WARMUP})")
    return parser


COMPARE_HTML = "compare.html"


def main(argv=None) -> int:
    """``openpop-report DIR [--open] [--compare OTHER] [--warmup N]`` (also ``python -m openpop.report``)."""
    parser = _parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.warmup is not None and args.warmup < 0:
        parser.error(f"--warmup must be 0 or more, not {args.warmup}")
    page = os.path.abspath(os.path.join(args.directory, REPORT_HTML))
    try:
        if args.warmup is not None:
            rewrite(args.directory, args.warmup)
            if args.compare:
                rewrite(args.compare, args.warmup)
        print(terminal_summary(args.directory))
        if args.compare:
            print()
            print(comparison(args.directory, args.compare))
            page = os.path.abspath(os.path.join(args.directory, COMPARE_HTML))
            with open(page, "w") as stream:
                stream.write(render_html(_load_summary(args.directory), _load_summary(args.compare)))
            print(f"\nSide by side: {page}")
    except FileNotFoundError as exc:
        print(f"openpop-report: error: {exc}", file=sys.stderr)
        return 1
    if args.open:
        import webbrowser
        if not webbrowser.open("file://" + page):
            print(f"openpop-report: no browser to open; the report is {page}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
