"""Per-step timestamps of a host call (``getPerfCounters``) and the latencies derived from them."""
import time

PERF_KEYS = ("input", "input_complete", "output", "output_complete")


class PerfRecorder:
    """Timestamps per device iteration: input start/complete, output start/complete."""

    def __init__(self):
        self.starts = []
        self.computed_at = []

    def start(self):
        self.starts.append(time.time())

    def computed(self):
        self.computed_at.append(time.time())

    def finish(self):
        done = time.time()
        return {"input": [list(self.starts)], "input_complete": [list(self.starts)],
                "output": [list(self.computed_at)], "output_complete": [[done] * len(self.starts)]}


class UniformCounters:
    """The counters of a host call whose steps all share its start and end (the compiled backend
    does not time the steps apart), made into ``PerfRecorder.finish``'s dict only when asked."""
    __slots__ = ("done", "started", "steps")

    def __init__(self, started: float, done: float, steps: int):
        self.started, self.done, self.steps = started, done, steps

    def counters(self) -> dict:
        starts, ends = [[self.started] * self.steps], [[self.done] * self.steps]
        return {"input": starts, "input_complete": [list(starts[0])], "output": ends,
                "output_complete": [list(ends[0])]}


def as_counters(perf) -> dict:
    """An executor's last counters (a dict or ``UniformCounters``) as the dict."""
    return perf.counters() if isinstance(perf, UniformCounters) else perf


def empty_counters() -> dict:
    return {key: [] for key in PERF_KEYS}


def latency(counters: dict, start_key: str, end_key: str):
    """(min, max, mean) seconds from ``start_key`` to ``end_key`` over the last call's steps."""
    starts = counters[start_key][0] if counters[start_key] else []
    ends = counters[end_key][0] if counters[end_key] else []
    durations = [e - s for s, e in zip(starts, ends)]
    if not durations:
        return (0.0, 0.0, 0.0)
    return (min(durations), max(durations), sum(durations) / len(durations))
