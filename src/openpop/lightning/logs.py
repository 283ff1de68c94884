"""``self.log`` inside steps: collected per micro-batch, reduced, logged once per host call.

One host call runs a step on ``device_iterations x gradient_accumulation x replicas``
micro-batches. Every ``self.log(name, value, ...)`` they make is recorded with the micro-batch's
size (``batch_size=`` if given, else inferred from the micro-batch as Lightning does). When the
host call returns, each name is logged once with the value its ``reduce_fx`` gives over the
micro-batches, in micro-batch order:

* ``"mean"`` (default): the mean weighted by batch size, logged with the summed batch size, so
  Lightning's epoch-level mean equals the mean over every sample, as on the CPU;
* ``"sum"``, ``"max"``, ``"min"``: over all micro-batches;
* any other callable: applied to the stacked values.

``torchmetrics.Metric`` objects are passed on unchanged (they accumulate by themselves). Logging
from hooks (``on_before_optimizer_step``, ``configure_gradient_clipping`` ...) that run during
the host call is not collected: it goes straight to Lightning. ``predict_step`` has no result
collection in Lightning; its logs go to the Trainer's loggers (``log_metrics``, step = batch
index). Records made during the compile pass are discarded.
"""
import contextlib
import inspect
import threading
from typing import Any

import torch

from . import instances, messages
from ._framework import module, pl

_LOG_PARAMETERS = list(inspect.signature(pl.LightningModule.log).parameters.values())[3:]  # after self, name, value
_LOG_NAMES = [p.name for p in _LOG_PARAMETERS]
_LOG_DEFAULTS = {p.name: p.default for p in _LOG_PARAMETERS}
_extract_batch_size = module("utilities.data").extract_batch_size
try:
    from torchmetrics import Metric as _Metric
except ImportError:  # pragma: no cover - torchmetrics is a Lightning dependency
    _Metric = ()
_MEAN, _SUM, _MAX, _MIN = ("mean", torch.mean), ("sum", torch.sum), ("max", torch.max), ("min", torch.min)


class _Record:
    __slots__ = ("batch_size", "options", "position", "value")

    def __init__(self, position, value, options, batch_size):
        self.position = position
        self.value = value
        self.options = options
        self.batch_size = batch_size


class StepLogs:
    """The ``self.log`` calls of one host call's micro-batches (thread-safe: micro-batches may
    run concurrently when virtual IPUs live on several devices)."""

    def __init__(self, lightning_module):
        self.module = lightning_module
        self._records: dict[str, list[_Record]] = {}
        self._lock = threading.Lock()
        self._local = threading.local()

    @contextlib.contextmanager
    def installed(self):
        """Route ``lightning_module.log`` through this collector for the host call."""
        self.module.log = self._log
        try:
            yield self
        finally:
            self.module.__dict__.pop("log", None)

    def micro_batch(self, position: int, batch: Any, discard: bool = False) -> "_MicroBatch":
        """Context: calls to ``self.log`` in it belong to micro-batch ``position``."""
        return _MicroBatch(self._local, (position, batch, discard))

    def _log(self, name, value, *args, **kwargs):
        state = getattr(self._local, "state", None)
        if state is None:  # a hook running during the host call: Lightning's own logging
            return type(self.module).log(self.module, name, value, *args, **kwargs)
        position, batch, discard = state
        if discard:
            return None
        options = log_options(args, kwargs)
        batch_size = options.get("batch_size")
        if batch_size is None and not _is_metric(value):
            batch_size = logged_batch_size(batch)
        if isinstance(value, torch.Tensor):
            value = value.detach()
        with self._lock:
            self._records.setdefault(name, []).append(_Record(position, value, options, batch_size))
        return None

    def discard(self) -> None:
        """Forget what the host call logged so far (it runs again: ``StepModule.openpop_restart_host_call``)."""
        with self._lock:
            self._records.clear()

    def add_micro_batches(self, spec, stacked) -> None:
        """A compiled host call's logs: ``stacked[i][p]`` is what micro-batch ``p`` logged as
        ``spec.entries[i]`` (``compiled_steps.py``)."""
        with self._lock:
            for (name, options, batch_size), values in zip(spec.entries, stacked):
                self._records.setdefault(name, []).append(_Record(-1, values, options, batch_size))

    def reduced(self) -> dict[str, tuple]:
        """``{name: (value, options)}`` with the micro-batch values reduced (see the module doc)."""
        result = {}
        with self._lock:
            records, self._records = self._records, {}
        for name, items in records.items():
            items.sort(key=lambda r: r.position)
            last = items[-1]
            options = dict(last.options)
            if _is_metric(last.value):
                result[name] = (last.value, options)
                continue
            values, sizes = _stacked(items)
            fx = options.get("reduce_fx", "mean")
            if fx in _MEAN:
                shape = (-1,) + (1,) * (values.dim() - 1)
                weighted = (values.double() * (sizes / sizes.sum()).view(shape)).sum(0)
                value = weighted.to(values.dtype)
            elif fx in _SUM:
                value = values.sum(0)
            elif fx in _MAX:
                value = values.max(0).values
            elif fx in _MIN:
                value = values.min(0).values
            else:
                value = fx(values)
            options["batch_size"] = int(sizes.sum().item())
            result[name] = (value, options)
        return result

    def flush(self) -> None:
        """Log the reduced values through Lightning (in the step's hook context). ``sync_dist``
        values are reduced over poprun's instances first (Lightning itself syncs only for its
        distributed strategies)."""
        for name, (value, options) in self.reduced().items():
            if options.get("sync_dist") and not _is_metric(value):
                value = instances.reduce(value, _sync_op(options.get("reduce_fx", "mean")))
            type(self.module).log(self.module, name, value, **options)

    def flush_to_loggers(self, step: int) -> None:
        """``predict_step``: Lightning keeps no results, so the loggers get the values."""
        metrics = {name: (value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value)
                   for name, (value, _) in self.reduced().items()}
        trainer = self.module.trainer
        if metrics:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)


class _MicroBatch:
    __slots__ = ("local", "previous", "state")

    def __init__(self, local, state):
        self.local, self.state = local, state

    def __enter__(self):
        self.previous = getattr(self.local, "state", None)
        self.local.state = self.state

    def __exit__(self, *exc_info):
        self.local.state = self.previous


def _sync_op(fx) -> str:
    if fx in _SUM:
        return "sum"
    if fx in _MAX:
        return "max"
    if fx in _MIN:
        return "min"
    return "mean"


def _is_metric(value) -> bool:
    return isinstance(value, _Metric) if _Metric else False


def _as_tensor(value) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.float() if not value.is_floating_point() else value
    return torch.tensor(float(value))


def log_options(args, kwargs) -> dict:
    """``self.log``'s options from its arguments after ``name, value``, with Lightning's defaults."""
    options = dict(_LOG_DEFAULTS)
    options.update(zip(_LOG_NAMES, args))
    unknown = set(kwargs) - options.keys()
    if unknown:
        raise TypeError(messages.LOG_UNEXPECTED_KWARGS.format(names=sorted(unknown)))
    options.update(kwargs)
    return options


def _stacked(items):
    """Values and batch sizes of a name's records, in micro-batch order. Records of a compiled
    call (position -1) hold every micro-batch's values stacked: several of them (the name logged
    more than once per step) interleave, as the eager records sort."""
    if items[0].position >= 0:
        values = torch.stack([_as_tensor(r.value) for r in items])
        return values, torch.tensor([float(r.batch_size or 1) for r in items], dtype=torch.float64)
    if len(items) == 1:
        values = _as_tensor(items[0].value)
        return values, torch.full((values.shape[0],), float(items[0].batch_size or 1), dtype=torch.float64)
    values = torch.stack([_as_tensor(r.value) for r in items], dim=1).flatten(0, 1)
    sizes = torch.tensor([float(r.batch_size or 1) for r in items], dtype=torch.float64).repeat(items[0].value.shape[0])
    return values, sizes


def logged_batch_size(batch) -> int:
    if isinstance(batch, torch.Tensor) and batch.dim() > 0:
        return batch.shape[0]
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor) and batch[0].dim() > 0:
        return batch[0].shape[0]  # what Lightning's search finds first, without the search
    try:
        return _extract_batch_size(batch)
    except Exception:  # Lightning raises when no tensor is found; count the micro-batch once
        return 1
