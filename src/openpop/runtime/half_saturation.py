"""Float16 arithmetic that saturates on overflow, as the IPU's does by default.

An IPU's float16 result too large for float16 becomes ±65504 (float16's largest finite value), not
±inf: the hardware's "NaN on overflow" mode is off unless floating-point exceptions are enabled
(Poplar's ``FloatingPointBehaviour.nanoo``; PopART turns it on only with
``enableFloatingPointChecks``, which ``Precision.enableFloatingPointExceptions(True)`` sets, and
then overflow raises). Graphcore's applications rely on it: MAE's configurations train a float16
model with a loss scale of 2**23, which overflows float16 at the loss itself; saturated, the
backward starts from 65504 and training goes on (IEEE arithmetic gives inf gradients, then NaN
weights).

openpop does the same for float16 results (not bfloat16, whose range is float32's) of every
forward, backward and optimizer step of a model computing in float16: its weights or buffers are
float16, or autocast lowers to float16. Each op that computes values - arithmetic, reductions,
conversions to float16 - has its float16 results clamped to ±65504; ops that only select, move or
create given values (``where``, ``masked_fill``, ``cat``, ``index``, ``full``, views ...) keep
them, so a ``-inf`` attention mask stays ``-inf`` until arithmetic uses it. Finer than the
hardware cannot be done without per-element provenance: an op's infinite result is clamped
whether it overflowed or came from an infinite operand (``x + (-inf)`` gives -65504, not
``-inf``; in a softmax both give zeros). NaN stays NaN. Infinities
that are not overflows (``log(0)``, ``1 / 0``) are clamped as well.

* eager: ``SaturatingHalf``, a torch dispatch mode around the host call's steps (it sees the
  backward's and the optimizer's ops too). A dispatch mode costs Python work on every op
  (1.4-2.8x the step time of small float16 MLPs), and saturation changes nothing until a value
  overflows, so an executor starts without it and watches: a training call whose loss or
  gradients hold an inf or NaN (checked with the gradients' unscaling, in the same pass) raises
  ``HalfOverflow`` before its optimizer update, is rolled back (``transaction.py``) and runs again
  saturating, as do all later calls; an inference call with such outputs runs again the same
  way (buffers and generators put back). Where a call cannot be rolled back
  (``Training.rollbackFailedCalls(False)``) it saturates from the start. A call run again runs
  the model's Python code again (prints, counters, torchmetrics updates inside ``forward``);
  Lightning's ``self.log`` records of the first run are dropped (the model's
  ``openpop_restart_host_call``). An overflow whose inf
  vanishes before the loss, outputs and gradients (``exp(-inf)``) is not seen: those values then
  differ from the IPU's;
* compiled programs: ``compiled/half_saturation_pass.py`` inserts the same clamps into the
  program's graph, where Inductor fuses them into the kernels computing the values.

Not where no executor runs the step: Lightning's manual optimization calls the user's
``training_step`` directly (IEEE overflow there). Not with automatic loss scaling: openpop's
(``loss_scaling.py``, torch's ``GradScaler`` rule) finds an overflow by its inf gradients, which
saturation would hide (PopART's counted gradients near 65504 instead). Its steps keep IEEE
overflow. ``OPENPOP_HALF_OVERFLOW=inf`` gives IEEE overflow everywhere.
"""
import threading

import torch

from .. import openpop_settings
from ..torch_compat import TorchDispatchMode, pytree
from . import messages

FLOAT16_MAX = 65504.0
SATURATE, INF = "saturate", "inf"

_aten = torch.ops.aten
# Ops whose float16 results are values of their operands or values the model gave: never an
# overflow, so never clamped (an explicit inf stays inf). Views are recognised from their schema.
_KEEP_VALUES = {
    _aten.where, _aten.masked_fill, _aten.masked_fill_, _aten.fill, _aten.fill_, _aten.full,
    _aten.full_like, _aten.zeros, _aten.zeros_like, _aten.ones, _aten.ones_like, _aten.empty,
    _aten.empty_like, _aten.empty_strided, _aten.new_empty, _aten.new_empty_strided, _aten.new_zeros,
    _aten.new_ones, _aten.new_full, _aten.scalar_tensor, _aten.index_put, _aten.index_put_,
    _aten._unsafe_index_put, _aten.index, _aten._unsafe_index, _aten.index_select, _aten.gather,
    _aten.cat, _aten.stack, _aten.clone, _aten.constant_pad_nd, _aten.embedding, _aten.max_pool2d_with_indices,
    _aten.max_pool3d_with_indices, _aten.amax, _aten.amin, _aten.max, _aten.min, _aten.maximum,
    _aten.minimum, _aten.sort, _aten.topk, _aten.relu, _aten.relu_, _aten.abs, _aten.neg, _aten.clamp,
    _aten.clamp_, _aten.clamp_min, _aten.clamp_max, _aten.hardtanh, _aten.detach, _aten.lift_fresh_copy,
    _aten.flip, _aten.roll, _aten.repeat, _aten.slice_scatter, _aten.select_scatter,
    _aten.diagonal_scatter, _aten.as_strided_scatter, _aten.masked_scatter, _aten.pixel_shuffle,
    _aten.pixel_unshuffle, _aten.channel_shuffle, _aten.upsample_nearest1d, _aten.upsample_nearest2d,
    _aten.upsample_nearest3d, _aten.narrow_copy, _aten.masked_select, _aten.sign, _aten.scatter,
    _aten.scatter_,
}


_COPIES = {_aten.copy_, _aten._to_copy, _aten.copy}  # conversions: overflow only from a wider dtype
_ACCUMULATES = {_aten.index_put, _aten.index_put_, _aten._unsafe_index_put}  # accumulate=True adds


def computes_values(op, args=(), kwargs=None) -> bool:
    """Whether the aten op ``op`` (an ``OpOverload``) computes its results, so that a float16 result
    may have overflowed (and is clamped). ``args``/``kwargs``: its operands (tensors or anything with
    a ``dtype``), for the ops that compute only sometimes: a copy converts only from another dtype,
    ``index_put`` adds only with ``accumulate``."""
    packet = op.overloadpacket
    if packet in _COPIES:
        source = args[1] if packet is _aten.copy_ or packet is _aten.copy else (args[0] if args else None)
        return getattr(source, "dtype", None) not in (torch.float16, None)
    if packet in _ACCUMULATES:
        accumulate = (kwargs or {}).get("accumulate", args[3] if len(args) > 3 else False)
        return bool(accumulate)
    keeps = packet in _KEEP_VALUES and "reduce" not in op._overloadname  # (scatter's reduce= adds)
    return not (op.is_view or keeps)


def setting_from_env() -> str:
    """``OPENPOP_HALF_OVERFLOW``: ``saturate`` (default) or ``inf``; another value raises
    ``ValueError`` naming the fix."""
    return openpop_settings.choice("half_overflow", (SATURATE, INF), messages.HALF_OVERFLOW_ENV, default=SATURATE)


def applies(model: torch.nn.Module, precision) -> bool:
    """Whether ``model``'s float16 arithmetic saturates under ``precision`` (a ``RunPrecision``):
    it computes in float16, floating-point exceptions and automatic loss scaling are off and
    ``OPENPOP_HALF_OVERFLOW`` is not ``inf``."""
    if precision.fp_exceptions or precision.dynamic is not None or precision.half_overflow != SATURATE:
        return False
    if precision.autocast_enabled and precision.autocast_dtype == torch.float16:
        return True
    return any(t.dtype == torch.float16 for t in model.parameters()) or \
        any(t.dtype == torch.float16 for t in model.buffers())


class HalfOverflow(Exception):
    """A call of a watched float16 model overflowed: it runs again, saturating (module docstring)."""


def saturate_(tensor: torch.Tensor) -> None:
    tensor.clamp_(-FLOAT16_MAX, FLOAT16_MAX)


_active = threading.local()


def active() -> bool:
    """Whether this thread runs under ``SaturatingHalf`` (a thread a host call starts - pipeline
    stages on threads of their own - enters it again: dispatch modes are per thread)."""
    return getattr(_active, "depth", 0) > 0


class SaturatingHalf(TorchDispatchMode):
    """Clamps the float16 results of ops that compute values to ±65504 (module docstring)."""

    def __enter__(self):
        _active.depth = getattr(_active, "depth", 0) + 1
        return super().__enter__()

    def __exit__(self, *exc_info):
        _active.depth -= 1
        return super().__exit__(*exc_info)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if computes_values(func, args, kwargs):
            for leaf in (out,) if isinstance(out, torch.Tensor) else pytree.tree_leaves(out):
                if isinstance(leaf, torch.Tensor) and leaf.dtype == torch.float16 and leaf.numel():
                    saturate_(leaf)
        return out
