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

from .report_analysis import DEFAULT_WARMUP, fmt_bytes, fmt_seconds, fmt_time_us
from .report_writer import (  # noqa: F401 (the report's files and format, as before)
    FORMAT,
    REPORT_HTML,
    REPORT_JSON,
    TRACE_FILE,
    comparison_rows,
    derive,
    group_name,
    stage_spans,
    summarise,
    warmup_line,
    write,
    write_report,
)
from .runtime import messages


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
    write(directory, summary)
    return summary


def _fmt(value, pattern):
    return "n/a" if value is None else pattern.format(value)


# ---------------------------------------------------------------------- terminal
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
        lines += ["", f"Top operators by self time, {group_name(group)} (of {fmt_time_us(group['self_us'])}):"]
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
