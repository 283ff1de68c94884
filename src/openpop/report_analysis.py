"""The profile report's numbers from a trace (``trace.json``, as ``runtime/trace.py`` writes it).

* ``host_call_windows``: each recorded host call's span, so that any event can be given the
  host call it happened in;
* ``stage_spans``: openpop's per-stage, per-micro-batch spans with their host call and thread;
* ``measured_calls``: which recorded calls count, leaving out warm-up calls (a model's first
  ``warmup`` host calls, default 1: allocations, first-touch page faults and lazy
  initialisation make a model's first call several times slower than the next);
* ``op_table``: per stage, the operators with the most self time (an operator's time less that
  of the operators it called, on its thread), from the profiler's ``cpu_op`` events;
* ``memory_timeline``: bytes live per virtual IPU over time, from the profiler's ``[memory]``
  events (``profile_memory``): an allocation belongs to the virtual IPU whose stage span ran on
  the allocating thread at that moment, until the same address is freed; allocations outside
  every stage span (inputs, gradient reduction, the optimizer step) form their own series; the
  profiler's running total per device (cpu, cuda:<i>) beside them.

Nothing is estimated: every number is a sum, difference or maximum of recorded events.
"""
import bisect

DEFAULT_WARMUP = 1
TOP_OPS = 10
MAX_POINTS = 240  # per memory series: the peak of each time bucket is kept
OUTSIDE = "outside stages"


def host_call_windows(trace: dict) -> list:
    """``[(call index, start us, end us)]`` of the ``openpop:host_call:<n>`` spans, by start."""
    windows = []
    for event in trace.get("traceEvents", []):
        name = event.get("name", "")
        if event.get("ph") == "X" and name.startswith("openpop:host_call:"):
            try:
                index = int(name.rsplit(":", 1)[1])
            except ValueError:
                continue
            start = float(event["ts"])
            windows.append((index, start, start + float(event.get("dur", 0))))
    windows.sort(key=lambda w: w[1])
    return windows


def call_at(windows, ts):
    """The index of the host call whose span holds time ``ts``, or None."""
    starts = [w[1] for w in windows]
    i = bisect.bisect_right(starts, ts) - 1
    if i >= 0 and windows[i][1] <= ts <= windows[i][2]:
        return windows[i][0]
    return None


def stage_spans(trace: dict, windows=None):
    """Stage spans of a (post-processed) trace: dicts with ipu, stage, kind, micro_batch, step,
    call (None where the trace has no host call spans), thread, start, duration and end (us)."""
    windows = host_call_windows(trace) if windows is None else windows
    spans = []
    for event in trace.get("traceEvents", []):
        if event.get("ph") != "X" or event.get("cat") != "openpop_stage":
            continue
        args = event["args"]
        info = {k: args[k] for k in ("ipu", "stage", "kind", "micro_batch", "step")}
        info["thread"] = args.get("thread", event.get("tid"))
        info["start"] = float(event["ts"])
        info["duration"] = float(event.get("dur", 0))  # end - start would lose digits to a large ts
        info["end"] = info["start"] + info["duration"]
        info["call"] = call_at(windows, info["start"])
        spans.append(info)
    spans.sort(key=lambda s: s["start"])
    return spans


def measured_calls(host_calls, warmup):
    """``(indices kept, note)``: the recorded host calls from index ``warmup`` on; where every
    recorded call is a warm-up call, all of them, with a note saying so."""
    recorded = [c["call"] for c in host_calls]
    kept = [i for i in recorded if i >= warmup]
    if kept or not recorded:
        return set(kept), None
    return set(recorded), (f"every recorded host call is a warm-up call (index < {warmup}): the figures "
                           f"include them; record later calls (openpop.firstProfiledRun) for steady-state figures")


class _StageLocator:
    """Which stage span ran on a thread at a time: spans per thread, by start."""

    def __init__(self, spans):
        self.by_thread = {}
        for span in spans:
            self.by_thread.setdefault(span["thread"], []).append(span)
        for values in self.by_thread.values():
            values.sort(key=lambda s: s["start"])
        self.starts = {t: [s["start"] for s in v] for t, v in self.by_thread.items()}

    def at(self, thread, ts):
        spans = self.by_thread.get(thread)
        if not spans:
            return None
        i = bisect.bisect_right(self.starts[thread], ts) - 1
        # Spans of one thread may nest (a backward span around recomputation): look back a little.
        for span in reversed(spans[max(0, i - 4):i + 1]):
            if span["start"] <= ts <= span["end"]:
                return span
        return None


def op_table(trace: dict, spans, windows, kept, top=TOP_OPS) -> list:
    """Per stage (and one row group for operators outside every stage span), the ``top``
    operators by self time over the kept host calls: ``[{"stage", "ipu", "self_us",
    "ops": [{"name", "calls", "self_us", "total_us"}]}]``, stages first, by number."""
    locator = _StageLocator(spans)
    per_thread = {}
    for event in trace.get("traceEvents", []):
        if event.get("ph") == "X" and event.get("cat") == "cpu_op":
            per_thread.setdefault(event.get("tid"), []).append(event)
    groups = {}
    for thread, events in per_thread.items():
        events.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur", 0))))
        for event, self_us in _self_times(events):
            ts = float(event["ts"])
            call = call_at(windows, ts)
            if windows and call not in kept:
                continue
            span = locator.at(thread, ts)
            key = (span["stage"], span["ipu"]) if span is not None else (None, None)
            group = groups.setdefault(key, {})
            entry = group.setdefault(event["name"], {"name": event["name"], "calls": 0, "self_us": 0.0,
                                                     "total_us": 0.0})
            entry["calls"] += 1
            entry["self_us"] += self_us
            entry["total_us"] += float(event.get("dur", 0))
    table = []
    for (stage, ipu), ops in sorted(groups.items(), key=lambda kv: (kv[0][0] is None, kv[0][0] or 0)):
        ordered = sorted(ops.values(), key=lambda o: -o["self_us"])
        table.append({"stage": stage, "ipu": ipu, "self_us": sum(o["self_us"] for o in ordered),
                      "operators": len(ordered), "ops": ordered[:top]})
    return table


def _self_times(events):
    """``[(event, self time)]`` of one thread's operator events sorted by start (longest first
    among equal starts): each event's duration less its direct children's."""
    stack = []  # [end, event, children's time]
    selfs = []

    def pop():
        _, event, children = stack.pop()
        selfs.append((event, max(float(event.get("dur", 0)) - children, 0.0)))

    for event in events:
        start = float(event["ts"])
        while stack and stack[-1][0] <= start:
            pop()
        duration = float(event.get("dur", 0))
        if stack:
            stack[-1][2] += duration
        stack.append([start + duration, event, 0.0])
    while stack:
        pop()
    return selfs


def memory_timeline(trace: dict, spans, windows, kept, ipus: int) -> dict:
    """Bytes live per virtual IPU (and outside stages) over the kept host calls, and the
    profiler's running total, from the ``[memory]`` events; ``{}`` without such events.
    Times in ms from the first kept call's start; ``calls``: ``[index, start ms, end ms]``."""
    events = [e for e in trace.get("traceEvents", []) if e.get("name") == "[memory]" and "args" in e]
    if not events:
        return {}
    events.sort(key=lambda e: float(e["ts"]))
    chosen = [w for w in windows if w[0] in kept] or windows
    if chosen:
        begin, finish = chosen[0][1], chosen[-1][2]
    else:
        begin, finish = float(events[0]["ts"]), float(events[-1]["ts"])
    locator = _StageLocator(spans)
    owners = {}  # address -> (series key, bytes)
    live = {}
    points = {}
    totals = {}  # device -> the profiler's running total of bytes allocated on it
    for event in events:
        args = event["args"]
        ts = float(event["ts"])
        size = int(args.get("Bytes", 0))
        address = args.get("Addr")
        if size > 0:
            span = locator.at(event.get("tid"), ts)
            key = span["ipu"] if span is not None else OUTSIDE
            owners[address] = (key, size)
        else:
            owned = owners.pop(address, None)
            if owned is None:
                continue  # allocated before the profiler started: not counted
            key, size = owned[0], -owned[1]
        live[key] = live.get(key, 0) + size
        if begin <= ts <= finish:
            at = (ts - begin) / 1000.0
            points.setdefault(key, [[0.0, live[key] - size]]).append([at, live[key]])
            totals.setdefault(_device(args), []).append([at, int(args.get("Total Allocated", 0))])
    series = []
    for key in list(range(ipus)) + [OUTSIDE]:
        values = points.get(key)
        if not values:
            continue
        name = f"virtual IPU {key}" if key != OUTSIDE else OUTSIDE
        series.append({"name": name, "ipu": key if key != OUTSIDE else None,
                       "peak_bytes": max(v for _, v in values), "points": _peaks(values)})
    length = (finish - begin) / 1000.0
    result = {"length_ms": length, "series": series,
              "calls": [[w[0], (w[1] - begin) / 1000.0, (w[2] - begin) / 1000.0] for w in chosen]}
    # Per device: the profiler's running total of all allocations there since it started.
    result["totals"] = [{"name": f"all allocations on {device}", "device": device,
                         "peak_bytes": max(v for _, v in points), "points": _peaks(points)}
                        for device, points in sorted(totals.items())]
    return result


def _device(args) -> str:
    """A memory event's device: ``cpu`` or ``cuda:<i>`` (``Device Type`` 0 or 1, as in c10)."""
    kind, index = args.get("Device Type", 0), args.get("Device Id", -1)
    if kind == 0:
        return "cpu"
    name = {1: "cuda"}.get(kind, f"device type {kind}")
    return f"{name}:{index}" if index is not None and index >= 0 else name


def _peaks(points, limit=MAX_POINTS):
    """At most ``limit`` points: per time bucket its highest value (a peak is never lost)."""
    if len(points) <= limit:
        return [[round(t, 4), v] for t, v in points]
    first, last = points[0][0], points[-1][0]
    width = (last - first) / limit or 1.0
    buckets = {}
    for t, v in points:
        b = min(int((t - first) / width), limit - 1)
        if b not in buckets or v > buckets[b][1]:
            buckets[b] = [round(t, 4), v]
    result = [buckets[b] for b in sorted(buckets)]
    if result[-1][0] != round(last, 4):
        result.append([round(last, 4), points[-1][1]])
    return result


# ---------------------------------------------------------------------- units
def fmt_bytes(value) -> str:
    """``1536`` -> ``1.5 KiB`` (binary units); None -> ``n/a``."""
    if value is None:
        return "n/a"
    value = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def fmt_time_us(value) -> str:
    """Microseconds as ``µs``, ``ms`` or ``s``, three significant digits or so; None -> ``n/a``."""
    if value is None:
        return "n/a"
    value = float(value)
    if value == 0:
        return "0"
    if abs(value) < 1000:
        return f"{value:.1f} µs"
    if abs(value) < 1_000_000:
        return f"{value / 1000:.2f} ms"
    return f"{value / 1_000_000:.2f} s"


def fmt_seconds(value) -> str:
    return "n/a" if value is None else fmt_time_us(float(value) * 1e6)
