"""What a trace session hands the profile report besides the trace: the model's options as a
reader wants them (enum names, defaults beside them), its compile breakdown, and one summary per
recorded host call."""
import enum

from .. import enums
from . import compile_phases

# Options stored as plain integers whose meaning is an enum (``Options.toDict()``).
_ENUM_KEYS = {
    "output_mode": enums.OutputMode,
    "connection_type": enums.ConnectionType,
    "sync_pattern": enums.SyncPattern,
}
_EXECUTION_MODES = {0: "PipelinedExecution", 1: "ShardedExecution", 2: "ParallelPhasedExecution"}


def readable(key, value):
    """A JSON-friendly, readable value: enum names (``OutputMode.All``), not their integers."""
    if key == "execution_mode" and isinstance(value, int) and value in _EXECUTION_MODES:
        return _EXECUTION_MODES[value]
    kind = _ENUM_KEYS.get(key)
    if kind is not None and isinstance(value, int) and not isinstance(value, bool):
        try:
            return f"{kind.__name__}.{kind(value).name}"
        except ValueError:
            return value
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    return repr(value)


def options_of(options) -> dict:
    """``{"values": {key: readable value}, "defaults": {key: readable default}}``; the defaults
    are a fresh ``Options()``'s, with the same output mode (it has no default to compare)."""
    try:
        raw = options.toDict()
        values = {str(k): readable(k, v) for k, v in raw.items()}
    except Exception as exc:  # the report shows what it can
        return {"values": {"error": str(exc)}, "defaults": {}}
    try:
        fresh = type(options)()
        fresh.outputMode(enums.OutputMode(raw["output_mode"]))
        defaults = {str(k): readable(k, v) for k, v in fresh.toDict().items()}
    except Exception:
        defaults = {}
    return {"values": values, "defaults": defaults}


def compile_breakdown(executor) -> dict:
    """Seconds of the model's compile pass by phase: graph capture and placement
    (``compile_phases``), the backend's compile (torch.compile: ``compileSeconds()`` less
    openpop's own pass, as it stands when the report is written), the rest of openpop's pass;
    with the executable cache's directory and torch's compile-cache counters since the capture."""
    try:
        total = executor.compileSeconds()
    except Exception:
        total = None
    if total is None:
        return {}
    own = float(getattr(executor, "_compile_seconds", total))
    record = compile_phases.of(executor._model)
    phases = dict(record.get("phases", {}))
    phases.setdefault(compile_phases.PLACEMENT, 0.0)  # (nothing to place: every virtual IPU on the host CPU)
    order = [compile_phases.GRAPH_CAPTURE, compile_phases.PLACEMENT]
    rows = [{"phase": name, "seconds": phases[name]} for name in order if name in phases]
    rows += [{"phase": name, "seconds": seconds} for name, seconds in phases.items() if name not in order]
    rows.append({"phase": "other (checks, optimizer state, hooks)", "seconds": max(own - sum(phases.values()), 0.0)})
    rows.append({"phase": "backend compile (torch.compile)", "seconds": max(total - own, 0.0)})
    cache = getattr(executor, "_compile_cache", None)
    return {"total_seconds": total, "phases": rows,
            "executable_cache": None if cache is None else getattr(cache, "path", str(cache)),
            "cache_counters": {k: v for k, v in record.get("cache", {}).items() if v}}


def samples_of(inputs):
    """Rows of the combined batch this call consumed (its first batched input's length)."""
    for pos in inputs.tensor_positions:
        tensor = inputs.leaves[pos]
        if tensor.dim() > 0:
            return int(tensor.shape[0])
    return None


def host_call_summary(index, seconds, perf, samples, training) -> dict:
    """Wall time of one call, and its compute time from the perf counters (the rest is host)."""
    starts = perf["input_complete"][0] if perf["input_complete"] else []
    computed = perf["output"][0] if perf["output"] else []
    steps = [b - a for a, b in zip([starts[0]] + computed[:-1], computed)] if starts else []
    compute = sum(steps)
    return {"call": index, "seconds": seconds, "compute_seconds": compute,
            "host_seconds": max(seconds - compute, 0.0), "steps": len(steps),
            "step_seconds": steps, "perf_counters": perf, "training": training, "samples": samples}
