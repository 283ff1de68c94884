"""Where a model's compile pass spent its time, for the profile report's compile breakdown.

The compile pass (``PoplarExecutor._compile``, the first host call or ``compile()``) runs, in
order: graph capture (``executable.trace_model``: one micro-batch traced to find the loss and
record the blocks), placement (``session.DeviceSession``: weights and replicas onto the virtual
IPUs' devices), and, where the compiled backend is chosen, the backend's compile
(torch.compile). Each of the first two is timed here with ``phase(model, name)``, keyed by the
model object both receive; a new graph capture starts a new record (a recompile after
``destroy()`` or a changed input shape). The backend's compile is timed by the backend itself
(``compileSeconds()``); the report adds it and torch's compile-cache counters to this record.

Timing costs two ``perf_counter`` calls per phase and nothing else.
"""
import contextlib
import time
import weakref

GRAPH_CAPTURE = "graph capture"
PLACEMENT = "placement"

_records = weakref.WeakKeyDictionary()  # model -> {"phases": {name: seconds}, "counters": {...}}


@contextlib.contextmanager
def phase(model, name: str):
    """Time the block as phase ``name`` of ``model``'s compile; graph capture starts a record."""
    if name == GRAPH_CAPTURE:
        _start(model)
    started = time.perf_counter()
    try:
        yield
    finally:
        record = _record(model)
        if record is not None:
            record["phases"][name] = record["phases"].get(name, 0.0) + time.perf_counter() - started


def _start(model) -> None:
    try:
        _records[model] = {"phases": {}, "counters": _cache_counters()}
    except TypeError:  # an object that takes no weak reference: not recorded
        pass


def _record(model):
    try:
        return _records.get(model)
    except TypeError:
        return None


def of(model) -> dict:
    """``{"phases": {name: seconds}, "cache": {counter: count since the capture began}}`` of
    ``model``'s latest compile, or an empty dict when none was recorded."""
    record = _record(model)
    if record is None:
        return {}
    now = _cache_counters()
    return {"phases": dict(record["phases"]),
            "cache": {name: now[name] - record["counters"].get(name, 0) for name in now}}


def _cache_counters() -> dict:
    """torch's compile-cache counters (process-wide), as ``compile_cache`` reads them."""
    try:
        from .compile_cache import _counter_values
        return _counter_values()
    except Exception:  # the report shows what it can
        return {}
