"""The profile report: ``report.json`` + a self-contained ``report.html`` next to ``trace.json``.

``openpop-report DIR`` (or ``python -m openpop.report DIR``) prints a terminal summary of a report
directory (plan, stage times, bubble fraction, host vs compute per host call); ``--compare OTHER``
adds two reports' headline numbers side by side, ``--open`` opens ``report.html``.

Numbers come from the trace's stage spans (``runtime/trace.py``) and the executor's perf
counters (``getPerfCounters()``); nothing is estimated. The Gantt chart shows the first
recorded optimizer step (training) or device iteration (inference) of the last recorded call.
The bubble fraction is the share of that step's span, summed over stages, in which a stage
ran neither forward nor backward.
"""
import html
import json
import os
import sys

from .runtime import messages

TRACE_FILE = "trace.json"  # written by runtime/trace.py next to the report

REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
COLOURS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac"]


def stage_spans(trace: dict):
    """Stage spans of a (post-processed) trace: dicts with ipu, stage, kind, micro_batch, step,
    start and end (microseconds)."""
    spans = []
    for event in trace.get("traceEvents", []):
        if event.get("ph") != "X" or event.get("cat") != "openpop_stage":
            continue
        info = dict(event["args"])
        info = {k: info[k] for k in ("ipu", "stage", "kind", "micro_batch", "step")}
        info["start"] = float(event["ts"])
        info["duration"] = float(event.get("dur", 0))  # end - start would lose digits to a large ts
        info["end"] = info["start"] + info["duration"]
        spans.append(info)
    spans.sort(key=lambda s: s["start"])
    return spans


def summarise(trace: dict, plan, host_calls, options, memory=()) -> dict:
    spans = stage_spans(trace)
    stages = {}
    for s in spans:
        entry = stages.setdefault(s["stage"], {"stage": s["stage"], "ipu": s["ipu"], "forward_us": 0.0,
                                               "backward_us": 0.0, "spans": 0})
        entry[s["kind"] + "_us"] = entry.get(s["kind"] + "_us", 0.0) + s["duration"]
        entry["spans"] += 1
    gantt = _one_step(spans)
    total_seconds = sum(c["seconds"] for c in host_calls)
    samples = sum(c["samples"] or 0 for c in host_calls)
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
    return {
        "format": "openpop-report-1",
        "allocation": allocation,
        "pipeline_stages": plan.pipeline_stages if plan is not None else 1,
        "pipelined": bool(plan.pipelined) if plan is not None else False,
        "stages": [stages[k] for k in sorted(stages)],
        "gantt": gantt,
        "bubble_fraction": _bubble_fraction(gantt),
        "host_calls": list(host_calls),
        "throughput_samples_per_second": samples / total_seconds if total_seconds > 0 else None,
        "options": options,
        "memory": list(memory),
        "trace": TRACE_FILE,
    }


def _one_step(spans):
    if not spans:
        return []
    # The last recorded call's first step: step numbers restart at 0 on each call.
    step = 0
    starts = [i for i, s in enumerate(spans) if s["step"] == step and s["micro_batch"] == 0
              and s["stage"] == 0 and s["kind"] == "forward"]
    begin = starts[-1] if starts else 0
    chosen = []
    for s in spans[begin:]:
        if s["step"] != step:
            break
        chosen.append(s)
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


def write_report(directory, trace, plan, host_calls, options, memory=()) -> dict:
    summary = summarise(trace, plan, host_calls, options, memory)
    with open(os.path.join(directory, REPORT_JSON), "w") as stream:
        json.dump(summary, stream, indent=1, default=str)
    with open(os.path.join(directory, REPORT_HTML), "w") as stream:
        stream.write(render_html(summary))
    return summary


# ---------------------------------------------------------------------- HTML
def _table(headers, rows):
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _lanes(spans):
    """Greedy lane per span so that spans in one lane never overlap; returns (lanes, count)."""
    ends, lanes = [], []
    for span in spans:
        lane = next((i for i, end in enumerate(ends) if end <= span["start"]), len(ends))
        if lane == len(ends):
            ends.append(0.0)
        ends[lane] = span["end"]
        lanes.append(lane)
    return lanes, max(len(ends), 1)


def _gantt_svg(gantt):
    if not gantt:
        return "<p>No stage spans were recorded.</p>"
    stages = sorted({s["stage"] for s in gantt})
    length = max(s["end"] for s in gantt) or 1.0
    width, row, left = 900, 28, 110
    height = row * len(stages) + 40
    scale = (width - left - 10) / length
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">']
    for i, stage in enumerate(stages):
        ipu = next(s["ipu"] for s in gantt if s["stage"] == stage)
        parts.append(f'<text x="4" y="{i * row + 18}" font-size="12">stage {stage} (IPU {ipu})</text>')
        parts.append(f'<rect x="{left}" y="{i * row + 2}" width="{width - left - 10}" height="{row - 4}" '
                     f'fill="#f3f3f3"/>')
        # Concurrent micro-batches may overlap on a stage: each gets a sub-row.
        spans = sorted((s for s in gantt if s["stage"] == stage), key=lambda s: s["start"])
        lanes, count = _lanes(spans)
        lane_height = (row - 4) / count
        for s, lane in zip(spans, lanes):
            x = left + s["start"] * scale
            y = i * row + 2 + lane * lane_height
            w = max((s["end"] - s["start"]) * scale, 1.0)
            colour = COLOURS[s["micro_batch"] % len(COLOURS)]
            opacity = "1.0" if s["kind"] == "forward" else "0.55"
            label = f'{s["kind"]} mb{s["micro_batch"]}: {s["end"] - s["start"]:.0f} us'
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{lane_height:.1f}" fill="{colour}" '
                         f'fill-opacity="{opacity}" stroke="#333" stroke-width="0.3">'
                         f'<title>{html.escape(label)}</title></rect>')
            if w > 24 and count == 1:
                parts.append(f'<text x="{x + 2:.1f}" y="{i * row + 18}" font-size="10" fill="#fff">'
                             f'{"F" if s["kind"] == "forward" else "B"}{s["micro_batch"]}</text>')
    axis_y = row * len(stages) + 16
    parts.append(f'<text x="{left}" y="{axis_y}" font-size="11">0</text>')
    parts.append(f'<text x="{width - 90}" y="{axis_y}" font-size="11">{length / 1000:.2f} ms</text>')
    parts.append(f'<text x="{left}" y="{axis_y + 16}" font-size="11">solid: forward, light: backward; '
                 f'colour: micro-batch; overlapping micro-batches in sub-rows</text>')
    parts.append("</svg>")
    return "".join(parts)


def _calls_svg(calls):
    if not calls:
        return ""
    width, height, left = 600, 180, 50
    top = max(c["seconds"] for c in calls) or 1.0
    n = len(calls)

    def xy(i, value):
        x = left + (i * (width - left - 10) / max(n - 1, 1))
        return f"{x:.1f},{height - 30 - value / top * (height - 50):.1f}"

    host = " ".join(xy(i, c["host_seconds"]) for i, c in enumerate(calls))
    compute = " ".join(xy(i, c["compute_seconds"]) for i, c in enumerate(calls))
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">'
            f'<polyline points="{compute}" fill="none" stroke="#4e79a7" stroke-width="2"/>'
            f'<polyline points="{host}" fill="none" stroke="#e15759" stroke-width="2"/>'
            f'<text x="4" y="14" font-size="11">{top * 1000:.1f} ms</text>'
            f'<text x="{left}" y="{height - 8}" font-size="11">host call →  '
            f'<tspan fill="#4e79a7">compute</tspan>  <tspan fill="#e15759">host</tspan></text></svg>')


def render_html(summary: dict) -> str:
    allocation = _table(["block", "stage", "virtual IPU", "device", "modules"],
                        [[a["block"], a["stage"], a["ipu"], a["device"], a["modules"]] for a in summary["allocation"]])
    stages = _table(["stage", "IPU", "forward (ms)", "backward (ms)", "spans"],
                    [[s["stage"], s["ipu"], f'{s["forward_us"] / 1000:.3f}', f'{s["backward_us"] / 1000:.3f}',
                      s["spans"]] for s in summary["stages"]])
    calls = _table(["host call", "wall (ms)", "compute (ms)", "host (ms)", "steps", "samples"],
                   [[c["call"], f'{c["seconds"] * 1000:.3f}', f'{c["compute_seconds"] * 1000:.3f}',
                     f'{c["host_seconds"] * 1000:.3f}', c["steps"], c["samples"]] for c in summary["host_calls"]])
    rows = summary.get("memory", [])
    cuda = any(m.get("device_peak_bytes") is not None for m in rows)
    memory = _table(["virtual IPU", "parameters (bytes)", "buffers (bytes)", "optimizer state (bytes)",
                     "peak activations (bytes, measured)"] + (["CUDA device peak (bytes)"] if cuda else []),
                    [[m["ipu"], m["parameter_bytes"], m["buffer_bytes"], m["optimizer_state_bytes"],
                      _fmt(m.get("activation_peak_bytes"), "{}")]
                     + ([_fmt(m.get("device_peak_bytes"), "{}")] if cuda else []) for m in rows])
    options = _table(["option", "value"], sorted([k, v] for k, v in summary["options"].items()))
    throughput = summary["throughput_samples_per_second"]
    bubble = summary["bubble_fraction"]
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>openpop profile report</title>
<style>
body {{ font-family: sans-serif; margin: 24px; color: #222; }}
table {{ border-collapse: collapse; margin-bottom: 16px; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; font-size: 13px; text-align: left; }}
th {{ background: #eee; }}
h2 {{ margin-top: 28px; }}
.numbers span {{ margin-right: 24px; font-size: 15px; }}
.note {{ font-size: 12px; color: #555; }}
</style></head><body>
<h1>openpop profile report</h1>
<p class="numbers"><span>throughput: <b>{_fmt(throughput, "{:.1f} samples/s")}</b></span>
<span>pipeline stages: <b>{summary["pipeline_stages"]}</b></span>
<span>bubble fraction (one step): <b>{_fmt(bubble, "{:.1%}")}</b></span></p>
<p>Trace: <a href="{html.escape(summary["trace"])}">{html.escape(summary["trace"])}</a>
(open in ui.perfetto.dev or chrome://tracing)</p>
<h2>Execution plan</h2>{allocation}
<h2>Pipeline timeline (one step)</h2>{_gantt_svg(summary["gantt"])}
<h2>Time per stage (recorded calls)</h2>{stages}
<h2>Memory per virtual IPU</h2>{memory}
<p class="note">Peak activations: the most bytes autograd held for the backward at once on that
IPU during the recorded calls (saved tensors; with recomputation the stashed stage inputs).</p>
<h2>Host calls</h2>{_calls_svg(summary["host_calls"])}{calls}
<h2>Options</h2>{options}
</body></html>
"""


def _fmt(value, pattern):
    return "n/a" if value is None else pattern.format(value)


# ---------------------------------------------------------------------- terminal
def terminal_summary(directory: str) -> str:
    summary = _load_summary(directory)
    lines = [f"openpop profile report: {directory}", "", "Execution plan:"]
    for a in summary["allocation"]:
        lines.append(f"  {a['block']:<30} stage {a['stage']}  IPU {a['ipu']}  {a['device']}")
    lines += ["", "Stage times (recorded calls):"]
    for s in summary["stages"]:
        lines.append(f"  stage {s['stage']} (IPU {s['ipu']}): forward {s['forward_us'] / 1000:9.3f} ms   "
                     f"backward {s['backward_us'] / 1000:9.3f} ms")
    lines.append(f"Bubble fraction (one step): {_fmt(summary['bubble_fraction'], '{:.1%}')}")
    lines += ["", "Memory per virtual IPU (parameters / buffers / optimizer state / peak activations, bytes):"]
    for m in summary.get("memory", []):
        lines.append(f"  IPU {m['ipu']}: {m['parameter_bytes']} / {m['buffer_bytes']} / {m['optimizer_state_bytes']}"
                     f" / {_fmt(m.get('activation_peak_bytes'), '{}')}")
    lines += ["", "Host calls:"]
    for c in summary["host_calls"]:
        lines.append(f"  call {c['call']}: wall {c['seconds'] * 1000:.3f} ms"
                     f"  compute {c['compute_seconds'] * 1000:.3f} ms  host {c['host_seconds'] * 1000:.3f} ms")
    lines.append(f"Throughput: {_fmt(summary['throughput_samples_per_second'], '{:.1f} samples/s')}")
    lines.append(f"Trace: {os.path.join(directory, summary['trace'])}")
    return "\n".join(lines)


def _load_summary(directory: str) -> dict:
    path = os.path.join(directory, REPORT_JSON)
    if not os.path.exists(path):
        raise FileNotFoundError(messages.NOT_A_PROFILE.format(directory=directory, path=path))
    with open(path) as stream:
        return json.load(stream)


def comparison(directory: str, other: str) -> str:
    """Two reports' headline numbers side by side, with the ratio of the second to the first."""
    first, second = _load_summary(directory), _load_summary(other)

    def median(values):
        values = sorted(values)
        return values[len(values) // 2] if values else None

    def per_call(summary, key):
        return median([c[key] * 1000 for c in summary["host_calls"]])

    rows = [("throughput (samples/s)", first.get("throughput_samples_per_second"),
             second.get("throughput_samples_per_second")),
            ("host call, median wall (ms)", per_call(first, "seconds"), per_call(second, "seconds")),
            ("host call, median compute (ms)", per_call(first, "compute_seconds"), per_call(second, "compute_seconds")),
            ("host call, median host (ms)", per_call(first, "host_seconds"), per_call(second, "host_seconds")),
            ("bubble fraction", first.get("bubble_fraction"), second.get("bubble_fraction"))]
    stages = sorted({s["stage"] for s in first["stages"]} | {s["stage"] for s in second["stages"]})
    for stage in stages:
        for kind in ("forward", "backward"):
            a = next((s[f"{kind}_us"] / 1000 for s in first["stages"] if s["stage"] == stage), None)
            b = next((s[f"{kind}_us"] / 1000 for s in second["stages"] if s["stage"] == stage), None)
            rows.append((f"stage {stage} {kind} (ms)", a, b))
    lines = [f"{'':<32} {'A':>12} {'B':>12} {'B / A':>8}", f"{'A = ' + directory:<60}", f"{'B = ' + other:<60}"]
    for name, a, b in rows:
        ratio = f"{b / a:.3f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a else "-"
        lines.append(f"{name:<32} {_fmt(a, '{:.3f}'):>12} {_fmt(b, '{:.3f}'):>12} {ratio:>8}")
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
    parser.add_argument("--compare", metavar="OTHER", help="another profile directory: headline numbers side by side")
    return parser


def main(argv=None) -> int:
    """``openpop-report DIR [--open] [--compare OTHER]`` (also ``python -m openpop.report``)."""
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        print(terminal_summary(args.directory))
        if args.compare:
            print()
            print(comparison(args.directory, args.compare))
    except FileNotFoundError as exc:
        print(f"openpop-report: error: {exc}", file=sys.stderr)
        return 1
    if args.open:
        import webbrowser
        page = os.path.abspath(os.path.join(args.directory, REPORT_HTML))
        if not webbrowser.open("file://" + page):
            print(f"openpop-report: no browser to open; the report is {page}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
