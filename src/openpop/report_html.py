"""The profile report as one self-contained HTML page: inline CSS and SVG, no script, nothing
fetched. Charts scale with the page (``viewBox``); tables wrap or scroll inside their own box,
so the page never scrolls sideways (checked in headless Chromium at 900 and 1600 px:
``scripts/report_screenshots.py``). ``render_html(summary, other)`` puts two reports side by
side (``openpop-report A --compare B`` writes it to ``A/compare.html``)."""
import html
from typing import Optional

from .report_analysis import OUTSIDE, fmt_bytes, fmt_seconds, fmt_time_us

COLOURS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac"]
COMPUTE, HOST, OTHER = "#4e79a7", "#e15759", "#999999"

STYLE = """
* { box-sizing: border-box; }
body { font-family: system-ui, sans-serif; margin: 0 auto; padding: 16px 24px; color: #222; max-width: 1500px; }
h1 { font-size: 24px; margin: 4px 0 8px; }
h2 { font-size: 19px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
h3 { font-size: 15px; margin: 12px 0 6px; }
table { border-collapse: collapse; margin-bottom: 12px; max-width: 100%; }
td, th { border: 1px solid #ccc; padding: 3px 8px; font-size: 13px; text-align: left; vertical-align: top; }
td { overflow-wrap: break-word; }
th { background: #eee; }
td.num, th.num { text-align: right; white-space: nowrap; }
tr.warmup td { color: #888; }
.scroll { overflow-x: auto; max-width: 100%; }
.numbers { display: flex; flex-wrap: wrap; gap: 8px 28px; font-size: 15px; margin: 8px 0; }
.note { font-size: 13px; color: #444; max-width: 75em; line-height: 1.4; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 4px 20px; }
.pair { display: grid; grid-template-columns: repeat(auto-fit, minmax(420px, 1fr)); gap: 4px 24px; }
svg { display: block; max-width: 100%; height: auto; }
.legend span { display: inline-block; margin-right: 16px; font-size: 13px; }
.swatch { display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: -1px; }
details summary { cursor: pointer; font-size: 14px; margin: 6px 0; }
code { font-size: 12px; }
"""


class Markup(str):
    """Text that is HTML already (``_table`` does not escape it)."""


def _e(value) -> str:
    return value if isinstance(value, Markup) else html.escape(str(value))


def _breakable(name: str) -> Markup:
    """An operator name that may wrap after ``::`` and ``: `` (long autograd names)."""
    text = html.escape(name)
    for mark in ("::", ": "):
        text = text.replace(mark, mark + "<wbr>")
    return Markup(text)


def _tick(text_of, value):
    return "0" if value == 0 else text_of(value)


def _table(headers, rows, numeric=(), row_classes=None):
    """A table; columns whose index is in ``numeric`` are right-aligned."""
    head = "".join(f'<th{" class=num" if i in numeric else ""}>{_e(h)}</th>' for i, h in enumerate(headers))
    body = []
    for r, row in enumerate(rows):
        cls = f' class="{row_classes[r]}"' if row_classes and row_classes[r] else ""
        cells = "".join(f'<td{" class=num" if i in numeric else ""}>{_e(c)}</td>' for i, c in enumerate(row))
        body.append(f"<tr{cls}>{cells}</tr>")
    return f'<div class="scroll"><table><tr>{head}</tr>{"".join(body)}</table></div>'


def _swatch(colour, opacity=1.0):
    return f'<span class="swatch" style="background:{colour};opacity:{opacity}"></span>'


def _nice_ticks(top, count=4):
    """Round tick values from 0 to at least ``top``."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / count
    magnitude = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 1.0
    while raw < magnitude:
        magnitude /= 10
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    ticks, value = [], 0.0
    while value < top + step * 0.999:
        ticks.append(value)
        value += step
    return ticks


def _byte_ticks(top, count=4):
    """Tick values in bytes at round numbers of the unit ``top`` is best read in."""
    unit = 1
    for candidate in (2 ** 10, 2 ** 20, 2 ** 30):
        if top >= candidate:
            unit = candidate
    return [t * unit for t in _nice_ticks(top / unit, count)]


# ---------------------------------------------------------------------- charts
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


def gantt_svg(gantt):
    if not gantt:
        return "<p>No stage spans were recorded.</p>"
    stages = sorted({s["stage"] for s in gantt})
    length = max(s["end"] for s in gantt) or 1.0
    width, row, left = 900, 30, 112
    plot = width - left - 12
    height = row * len(stages) + 34
    scale = plot / length
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
             f'role="img" aria-label="pipeline timeline of one step">']
    for i, stage in enumerate(stages):
        ipu = next(s["ipu"] for s in gantt if s["stage"] == stage)
        parts.append(f'<text x="4" y="{i * row + 19}" font-size="12">stage {stage} (IPU {ipu})</text>')
        parts.append(f'<rect x="{left}" y="{i * row + 2}" width="{plot}" height="{row - 4}" fill="#f3f3f3"/>')
        # Concurrent micro-batches may overlap on a stage: each gets a sub-row.
        spans = sorted((s for s in gantt if s["stage"] == stage), key=lambda s: s["start"])
        lanes, count = _lanes(spans)
        lane_height = (row - 4) / count
        for s, lane in zip(spans, lanes):
            x = left + s["start"] * scale
            y = i * row + 2 + lane * lane_height
            w = max((s["end"] - s["start"]) * scale, 1.0)
            colour = COLOURS[s["micro_batch"] % len(COLOURS)]
            opacity = "1.0" if s["kind"] == "forward" else "0.5"
            label = f'stage {stage} {s["kind"]}, micro-batch {s["micro_batch"]}: {fmt_time_us(s["end"] - s["start"])}'
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{lane_height:.1f}" fill="{colour}" '
                         f'fill-opacity="{opacity}" stroke="#333" stroke-width="0.3">'
                         f'<title>{_e(label)}</title></rect>')
            if w > 24 and count == 1:
                parts.append(f'<text x="{x + 2:.1f}" y="{i * row + 19}" font-size="10" fill="#fff">'
                             f'{"F" if s["kind"] == "forward" else "B"}{s["micro_batch"]}</text>')
    axis_y = row * len(stages) + 4
    for tick in _nice_ticks(length / 1000, 5):
        x = left + tick * 1000 * scale
        if x > width - 4:
            break
        parts.append(f'<line x1="{x:.1f}" y1="{axis_y}" x2="{x:.1f}" y2="{axis_y + 5}" stroke="#555"/>')
        parts.append(f'<text x="{x:.1f}" y="{axis_y + 18}" font-size="11" text-anchor="middle">'
                     f'{_e(_tick(fmt_time_us, tick * 1000))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def calls_svg(calls):
    """One horizontal bar per host call: compute time, then host time (the rest of the call)."""
    if not calls:
        return ""
    width, row, left = 900, 24, 150
    plot = width - left - 20
    top = max(c["seconds"] for c in calls) or 1.0
    height = row * len(calls) + 30
    scale = plot / top
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
             f'role="img" aria-label="host and compute time per host call">']
    for i, c in enumerate(calls):
        y = i * row + 3
        label = f'call {c["call"]}' + (" (warm-up)" if c.get("warmup") else "")
        colour_text = OTHER if c.get("warmup") else "#222"
        parts.append(f'<text x="4" y="{y + 14}" font-size="12" fill="{colour_text}">{_e(label)}</text>')
        compute = c["compute_seconds"] * scale
        host = c["host_seconds"] * scale
        opacity = "0.45" if c.get("warmup") else "1"
        parts.append(f'<rect x="{left}" y="{y}" width="{max(compute, 0.5):.1f}" height="{row - 8}" fill="{COMPUTE}" '
                     f'fill-opacity="{opacity}"><title>compute {_e(fmt_seconds(c["compute_seconds"]))}</title></rect>')
        parts.append(f'<rect x="{left + compute:.1f}" y="{y}" width="{max(host, 0.5):.1f}" height="{row - 8}" '
                     f'fill="{HOST}" fill-opacity="{opacity}"><title>host {_e(fmt_seconds(c["host_seconds"]))}'
                     f'</title></rect>')
    axis_y = row * len(calls) + 2
    for tick in _nice_ticks(top * 1000, 5):
        x = left + tick / 1000 * scale
        if x > width - 4:
            break
        parts.append(f'<line x1="{x:.1f}" y1="{axis_y}" x2="{x:.1f}" y2="{axis_y + 5}" stroke="#555"/>')
        parts.append(f'<text x="{x:.1f}" y="{axis_y + 18}" font-size="11" text-anchor="middle">'
                     f'{_e(_tick(fmt_seconds, tick / 1000))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def memory_svg(timeline):
    """Step lines of bytes live per virtual IPU (and outside stages) over the measured calls."""
    series = list(timeline.get("series", []))
    if not series:
        return "<p>No memory events were recorded (see the notes at the top of the report).</p>"
    width, height, left, bottom = 900, 260, 80, 36
    plot_w, plot_h = width - left - 16, height - bottom - 12
    length = timeline.get("length_ms") or max(p[0] for s in series for p in s["points"]) or 1.0
    top = max(s["peak_bytes"] for s in series) or 1
    ticks = _byte_ticks(top)
    top = max(ticks[-1], top)

    def xy(t, v):
        return f"{left + t / length * plot_w:.1f},{12 + plot_h - v / top * plot_h:.1f}"

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
             f'role="img" aria-label="memory over time per virtual IPU">']
    for tick in ticks:
        y = 12 + plot_h - tick / top * plot_h
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - 16}" y2="{y:.1f}" stroke="#e4e4e4"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">'
                     f'{_e(_tick(fmt_bytes, tick))}'
                     f'</text>')
    for index, start, end in timeline.get("calls", []):
        for edge in (start, end):
            x = left + edge / length * plot_w
            parts.append(f'<line x1="{x:.1f}" y1="12" x2="{x:.1f}" y2="{12 + plot_h}" stroke="#bbb" '
                         f'stroke-dasharray="3,3"/>')
        parts.append(f'<text x="{left + start / length * plot_w + 3:.1f}" y="24" font-size="11" fill="#666">'
                     f'call {index}</text>')
    for s in series:
        colour = COLOURS[s["ipu"] % len(COLOURS)] if s["ipu"] is not None else OTHER
        points, path = s["points"], []
        for j, (t, v) in enumerate(points):
            if j:
                path.append(xy(t, points[j - 1][1]))  # a step: the value holds until the next event
            path.append(xy(t, v))
        path.append(xy(length, points[-1][1]))
        parts.append(f'<polyline points="{" ".join(path)}" fill="none" stroke="{colour}" stroke-width="1.6">'
                     f'<title>{_e(s["name"])}: peak {_e(fmt_bytes(s["peak_bytes"]))}</title></polyline>')
    axis_y = 12 + plot_h
    parts.append(f'<line x1="{left}" y1="{axis_y}" x2="{width - 16}" y2="{axis_y}" stroke="#555"/>')
    for tick in _nice_ticks(length, 5):
        x = left + tick / length * plot_w
        if x > width - 4:
            break
        parts.append(f'<text x="{x:.1f}" y="{axis_y + 16}" font-size="11" text-anchor="middle">'
                     f'{_e(_tick(fmt_time_us, tick * 1000))}</text>')
    parts.append("</svg>")
    legend = "".join(
        f'<span>{_swatch(COLOURS[s["ipu"] % len(COLOURS)] if s["ipu"] is not None else OTHER)}{_e(s["name"])}: '
        f'peak {_e(fmt_bytes(s["peak_bytes"]))}</span>' for s in series)
    totals = "".join(f'<span>{_e(t["name"])}: peak {_e(fmt_bytes(t["peak_bytes"]))} (the profiler\'s running '
                     f'total, since it started)</span>' for t in timeline.get("totals", []))
    return "".join(parts) + f'<p class="legend">{legend}</p>' + (f'<p class="legend">{totals}</p>' if totals else "")


# ---------------------------------------------------------------------- sections
def _group_title(group):
    return f'stage {group["stage"]} (IPU {group["ipu"]})' if group["stage"] is not None else OUTSIDE


def ops_section(groups):
    if not groups:
        return "<p>No operator events were recorded.</p>"
    cards = []
    for group in groups:
        total = group["self_us"] or 1.0
        rows = [[_breakable(o["name"]), o["calls"], fmt_time_us(o["self_us"]), f'{o["self_us"] / total:.1%}',
                 fmt_time_us(o["total_us"])] for o in group["ops"]]
        cards.append(f'<div><h3>{_e(_group_title(group))}: {_e(fmt_time_us(group["self_us"]))} self time, '
                     f'{group["operators"]} operators</h3>'
                     + _table(["operator", "calls", "self time", "share", "total"], rows, (1, 2, 3, 4))
                     + "</div>")
    return f'<div class="grid">{"".join(cards)}</div>'


def compile_section(breakdown):
    if not breakdown:
        return "<p>No compile was recorded for this model.</p>"
    total = breakdown.get("total_seconds") or 0.0
    rows = [[r["phase"], fmt_seconds(r["seconds"]), f'{r["seconds"] / total:.1%}' if total else "n/a"]
            for r in breakdown.get("phases", [])]
    rows.append(["total (compileSeconds())", fmt_seconds(total), "100%"])
    cache = breakdown.get("executable_cache")
    counters = breakdown.get("cache_counters") or {}
    cache_line = (f"Executable cache: <code>{_e(cache)}</code>." if cache else
                  "Executable cache off (<code>Options.enableExecutableCaching(path)</code> or "
                  "<code>POPTORCH_CACHE_DIR</code> turns it on).")
    if counters:
        cache_line += " torch.compile's caches since this compile began: " + ", ".join(
            f"{_e(k.replace('_', ' '))} {v}" for k, v in sorted(counters.items())) + "."
    return (_table(["phase", "time", "share"], rows, (1, 2)) +
            f'<p class="note">Graph capture: one micro-batch traced to find the loss and record the blocks. '
            f'Placement: weights and replicas onto the virtual IPUs\' devices. Backend compile: torch.compile, '
            f'as it stood when the report was written (host calls inside the profile window run eagerly, '
            f'so a compiled backend may compile after the window). {cache_line}</p>')


def options_section(options):
    values, defaults = options.get("values", {}), options.get("defaults", {})
    changed = sorted(k for k in values if k not in defaults or defaults[k] != values[k])
    rows = [[k, values[k], defaults.get(k, "-")] for k in changed]
    first = (_table(["option", "value", "default"], rows) if rows
             else "<p>Every option has its default value.</p>")
    everything = _table(["option", "value"], sorted([k, v] for k, v in values.items()))
    return (f"<h3>Set by the script ({len(rows)} of {len(values)})</h3>{first}"
            f"<details><summary>All {len(values)} options</summary>{everything}</details>")


def bubble_note(summary):
    stages = summary.get("pipeline_stages") or 1
    devices = {a["device"] for a in summary.get("allocation", [])}
    if stages <= 1:
        return "One stage: there is no pipeline bubble."
    text = ("The bubble fraction is the share of one step's time, summed over stages, in which a stage ran "
            "neither a forward nor a backward pass (the gaps in the timeline above).")
    if len(devices) <= 1:
        floor = 1 - 1 / stages
        text += (f" All {stages} stages run on one device ({_e(next(iter(devices), '?'))}): there they cannot "
                 f"overlap, each waits while the others run, so at least {floor:.0%} is expected by construction "
                 f"((stages - 1) / stages). It says how much a pipeline over {stages} devices (GPUs, "
                 f"<code>Options.deviceMap</code> or <code>OPENPOP_DEVICE_MAP</code>) could overlap, not that this run "
                 f"wasted time.")
    else:
        text += (" The stages run on different devices; gaps there are the pipeline's fill and drain and the "
                 "waits between stages.")
    return text


def _warmup_text(summary):
    from .report_writer import warmup_line
    return warmup_line(summary).replace("Warm-up: ", "", 1)


def _body(summary):
    throughput = summary.get("throughput_samples_per_second")
    bubble = summary.get("bubble_fraction")
    memory_rows = summary.get("memory", [])
    cuda = any(m.get("device_peak_bytes") is not None for m in memory_rows)
    timeline = summary.get("memory_timeline") or {}
    peaks = {s["ipu"]: s["peak_bytes"] for s in timeline.get("series", []) if s["ipu"] is not None}
    memory = _table(["IPU", "parameters", "buffers", "optimizer state", "peak activations",
                     "peak live (profiler)"] + (["CUDA device peak"] if cuda else []),
                    [[m["ipu"], fmt_bytes(m["parameter_bytes"]), fmt_bytes(m["buffer_bytes"]),
                      fmt_bytes(m["optimizer_state_bytes"]), fmt_bytes(m.get("activation_peak_bytes")),
                      fmt_bytes(peaks.get(m["ipu"]))]
                     + ([fmt_bytes(m.get("device_peak_bytes"))] if cuda else []) for m in memory_rows],
                    numeric=tuple(range(1, 7)))
    allocation = _table(["block", "stage", "virtual IPU", "device", "modules"],
                        [[a["block"], a["stage"], a["ipu"], a["device"], a["modules"]] for a in summary["allocation"]],
                        (1, 2, 4))
    stages = _table(["stage", "virtual IPU", "forward", "backward", "spans"],
                    [[s["stage"], s["ipu"], fmt_time_us(s["forward_us"]), fmt_time_us(s["backward_us"]), s["spans"]]
                     for s in summary["stages"]], (0, 1, 2, 3, 4))
    calls = summary["host_calls"]
    call_table = _table(["host call", "wall", "compute", "host", "steps", "samples"],
                        [[f'{c["call"]}' + (" (warm-up, left out)" if c.get("warmup") else ""),
                          fmt_seconds(c["seconds"]), fmt_seconds(c["compute_seconds"]), fmt_seconds(c["host_seconds"]),
                          c["steps"], c["samples"]] for c in calls], (1, 2, 3, 4, 5),
                        ["warmup" if c.get("warmup") else "" for c in calls])
    legend = (f'<p class="legend"><span>{_swatch(COLOURS[0])}forward</span><span>{_swatch(COLOURS[0], 0.5)}'
              f'backward (lighter)</span><span>colour: micro-batch</span><span>overlapping micro-batches: '
              f'sub-rows</span></p>')
    return f"""
<p class="numbers"><span>throughput: <b>{"n/a" if throughput is None else f"{throughput:.1f} samples/s"}</b></span>
<span>pipeline stages: <b>{summary["pipeline_stages"]}</b></span>
<span>bubble fraction (one step): <b>{"n/a" if bubble is None else f"{bubble:.1%}"}</b></span>
<span>compile: <b>{_e(fmt_seconds((summary.get("compile") or {}).get("total_seconds")))}</b></span></p>
<p class="note"><b>Warm-up:</b> {_e(_warmup_text(summary))}.</p>
<p class="note">Trace: <a href="{_e(summary["trace"])}">{_e(summary["trace"])}</a>
(operator, memory and stage events; open it in ui.perfetto.dev or chrome://tracing).</p>
{"".join(f'<p class="note"><b>Note:</b> {_e(n)}</p>' for n in summary.get("notes", []))}
<h2>Execution plan</h2>{allocation}
<h2>Pipeline timeline (one step)</h2>{gantt_svg(summary["gantt"])}{legend}
<p class="note">{bubble_note(summary)}</p>
<h2>Time per stage</h2>{stages}
<h2>Top operators per stage (self time)</h2>
<p class="note">Self time: an operator's time less that of the operators it called; total: with them; share: of
the stage's self time. From the profiler's operator
events in the measured calls; an operator belongs to the stage whose span ran on its thread.</p>
{ops_section(summary.get("ops", []))}
<h2>Memory per virtual IPU</h2>{memory}
<p class="note">Parameters, buffers and optimizer state are counted from the tensors. Peak activations: the most
bytes autograd held for the backward at once (saved tensors; with recomputation the stashed stage inputs). Peak
live (profiler): from the profiler's memory events, the most bytes allocated while the IPU's stages ran and not
yet freed (temporaries included).</p>
<h3>Memory over time</h3>{memory_svg(timeline)}
<p class="note">Bytes allocated while a virtual IPU's stage ran and not yet freed, over the measured calls (dashed:
host call boundaries). Tensors that existed before the profile began (weights) are not in it: see the table.</p>
<h2>Compile time</h2>{compile_section(summary.get("compile") or {})}
<h2>Host calls</h2>{calls_svg(calls)}
<p class="legend"><span>{_swatch(COMPUTE)}compute: the device steps (perf counters)</span>
<span>{_swatch(HOST)}host: the rest of the call (inputs, outputs, Python)</span></p>{call_table}
<h2>Options</h2>{options_section(summary.get("options") or {})}
"""


def render_html(summary: dict, other: Optional[dict] = None) -> str:
    if other is None:
        title, body = "openpop profile report", _body(summary)
    else:
        from .report_writer import comparison_rows
        rows, section, table = comparison_rows(summary, other), None, []
        for part, name, a, b, unit in rows:
            ratio = f"{b / a:.3f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a else "-"
            table.append([part if part != section else "", name + (f" ({unit})" if unit else ""),
                          "n/a" if a is None else f"{a:.3f}", "n/a" if b is None else f"{b:.3f}", ratio])
            section = part
        title = "openpop profile reports side by side"
        body = (f'<h2>Figures</h2>{_table(["section", "figure", "A", "B", "B / A"], table, (2, 3, 4))}'
                f'<div class="pair"><div><h2>A</h2>{_body(summary)}</div><div><h2>B</h2>{_body(other)}</div></div>')
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title><style>{STYLE}</style></head><body>
<h1>{title}</h1>{body}
</body></html>
"""
