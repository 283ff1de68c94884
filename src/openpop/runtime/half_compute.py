"""How ops run on float16/bfloat16 tensors: ``LowPrecisionOps`` and the policy it follows.

``LowPrecisionOps`` is a torch function mode, active during every forward pass (and every
recomputation of one) of a model that holds float16/bfloat16 weights or buffers, and during
autocast forwards whose dtype is slow on this CPU. Three rules, one mechanism:

1. **Mixed float32/float16 operands** (PopTorch's rule). PopTorch 3 resolves an op that mixes
   float32 and float16 (or bfloat16) inputs by upcasting: the op computes in float32 and returns
   float32, as PyTorch's type promotion does for element-wise ops (PopTorch 2's opposite
   default, ``HalfFloatCastingBehavior.FloatDowncastToHalf``, is gone; ``halfFloatCasting`` is a
   deprecated no-op). PyTorch itself refuses the mix for matmuls, convolutions, RNNs and a few
   more (``mat1 and mat2 must have the same dtype``): openpop runs those in the promoted dtype.
   Ops PyTorch accepts mixed (element-wise ops, ``layer_norm`` of a half input with float
   weights, attention with a float mask) keep PyTorch's result. So a ``.half()`` model fed
   float32 inputs computes in float32 and returns float32 outputs and losses, and gradients
   reach its float16 parameters through the casts. In-place ops (``half_buffer[i] = x``) write
   the other operands converted to the destination's dtype, as ``copy_`` does. Out of reach:
   checks in a module's Python code before any op runs (``nn.LSTM`` compares its input's dtype
   with its weights'), and models without half tensors fed half inputs (the mode is not active).
2. **Slow half matmuls/convolutions run in float32.** Where this device's float16/bfloat16
   GEMMs or convolutions are slower than its float32 ones (``HalfComputePolicy``), an op of the
   matmul or convolution family (``linear``, ``matmul``, ``bmm``, ``einsum``, attention, RNNs,
   ``conv*``; see ``_OPS``) whose operands are all float16/bfloat16 runs on float32 copies of
   them, and its results are rounded back to the half dtype. That is what an IPU does with
   float32 partials (half operands, float32 accumulation, half result), so numerics stay within
   half-precision tolerance; tensors the user sees keep their dtype. Autograd records the casts,
   so the backward matmuls run in float32 too. Under ``torch.autocast`` with a slow dtype, the
   ops autocast would lower are computed the same way from operands rounded to the autocast
   dtype (autocast's own casts), and return the autocast dtype: autocast's dtype flow is
   unchanged, only the arithmetic moves to float32.
3. **Missing kernels.** An op with no kernel for float16/bfloat16 on this device (torch 2.13
   CPU: ``cdist``, ``pdist``, ``ctc_loss``, ``rrelu``, ``quantile``, FFTs, linalg's
   decompositions ...) runs in float32 and its results are cast back.

``HalfComputePolicy`` decides rule 2 per device type, dtype and op family. CUDA (and every
other accelerator) computes half natively. On the CPU it follows ``OPENPOP_HALF_COMPUTE``:
``auto`` (default) measures, once per process, float32 and float16/bfloat16 matmul and
convolution rates (a few tens of ms; ``CpuHalfSpeeds``) and computes a half dtype natively
only where it is at least as fast as float32; ``native`` and ``float32`` force either path.
torch 2.13 runs half GEMMs through oneDNN's fast kernels only on CPUs with AVX512-BF16/FP16 or
AMX; elsewhere (AVX2 CPUs) it falls back to scalar loops 20-100x slower than float32. The choice
is logged once per process (INFO).
"""
import contextlib
import functools
import re
import threading
import time
from dataclasses import dataclass
from typing import Optional

import torch
from torch.overrides import TorchFunctionMode

from .. import openpop_settings
from ..log import logger
from ..torch_compat import NN_FUNCTIONS_MODULE, DisableTorchFunction, disable_current_modes, pytree
from . import messages
from .machine_rates import remembered

LOW_PRECISION = (torch.float16, torch.bfloat16)
SETTING_ENV = openpop_settings.env("half_compute")
SETTINGS = ("auto", "native", "float32")
MATMUL, CONVOLUTION = "matmul", "convolution"
# A half dtype is computed natively when its measured rate is at least this fraction of float32's.
NATIVE_MIN_SPEEDUP = 1.0


# ---------------------------------------------------------------------- op families
@dataclass(frozen=True)
class _Op:
    family: str
    result: str           # "promote": mixed operands give the promoted dtype; "first": the first operand's
    autocast_lowers: bool  # torch.autocast (CPU) computes it in the autocast dtype


def _op_table() -> dict[object, _Op]:
    table = {}

    def add(op, owner, names):
        for name in names.split():
            func = getattr(owner, name, None)
            if func is not None:
                table[func] = op

    gemm, gemm_fp32 = _Op(MATMUL, "promote", True), _Op(MATMUL, "promote", False)
    attention, conv = _Op(MATMUL, "first", True), _Op(CONVOLUTION, "promote", True)
    add(gemm, torch, "matmul mm bmm addmm baddbmm addbmm inner tensordot einsum chain_matmul lstm rnn_tanh rnn_relu")
    add(gemm, torch.Tensor, "matmul __matmul__ __rmatmul__ mm bmm addmm baddbmm addbmm inner")
    add(gemm, torch.linalg, "matmul multi_dot vecdot")
    add(gemm, torch.nn.functional, "linear")
    add(gemm_fp32, torch, "mv addmv dot vdot bilinear gru lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell")
    add(gemm_fp32, torch.Tensor, "mv addmv dot vdot")
    add(attention, torch.nn.functional, "scaled_dot_product_attention multi_head_attention_forward")
    add(conv, torch, "conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d convolution conv_tbc")
    return table


_OPS = _op_table()


# ---------------------------------------------------------------------- policy
def setting_from_env() -> str:
    """``OPENPOP_HALF_COMPUTE`` (default ``auto``); a bad value raises ``ValueError`` naming the fix."""
    return openpop_settings.choice("half_compute", SETTINGS, messages.HALF_COMPUTE_ENV)


@contextlib.contextmanager
def measuring():
    """Where this CPU's rates are measured: on real tensors, outside the user's modes, autocast and
    autograd. (The first need can come inside a trace on fake tensors - the executable cache's
    shapes-only trace - where every op takes no time and a comparison would be a coin toss.)"""
    with disable_current_modes(), DisableTorchFunction(), torch.autocast("cpu", enabled=False), \
            torch.no_grad():
        yield


def best_seconds(fn, repeats: int) -> float:
    """The fastest of ``repeats`` timed calls of ``fn``."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure_cpu_rates(dtype: torch.dtype, family: str) -> tuple[float, float]:
    """(``dtype`` GFLOP/s, float32 GFLOP/s) of one matmul or convolution on one core of this CPU.

    One thread: on a busy machine multi-threaded kernels wait for their threads' time slices, which
    would make the comparison depend on the load rather than on the kernels. Each is warmed up
    first (oneDNN generates its kernels on first use); float32 is timed best of 5, the half dtype
    once if it is clearly slower, else both are re-timed best of 3.

    The sizes are the smallest where a half kernel's speed is what it is on real layers: on an
    AMX CPU a 128 x 128 bfloat16 matmul measured 0.8-0.95x float32 (oneDNN's setup dominates),
    which chose float32 compute and made BERT-base's bf16 autocast steps 2x slower than a plain
    autocast loop, while at 256 it is 4x float32 (384 and above: 7x, BERT's layers); likewise the
    convolution (2 x 16 x 16 x 16: 1.05x, 4 x 64 x 16 x 16: 2.7x). Each costs well under a
    millisecond in float32."""
    generator = torch.Generator().manual_seed(0)
    if family == MATMUL:
        n = 256
        operands = [torch.randn(n, n, generator=generator) for _ in range(2)]
        op, flops = torch.mm, 2 * n ** 3
    else:
        batch, channels, size = 4, 64, 16
        operands = [torch.randn(batch, channels, size, size, generator=generator),
                    torch.randn(channels, channels, 3, 3, generator=generator)]
        op = functools.partial(torch.nn.functional.conv2d, padding=1)
        flops = 2 * batch * channels * size * size * channels * 9
    low = [t.to(dtype) for t in operands]
    full_run, low_run = (lambda: op(*operands)), (lambda: op(*low))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        full_run()
        full = best_seconds(full_run, 5)
        low_run()
        half = best_seconds(low_run, 1)
        if half < 4 * full:  # close: measure both again
            half = min(half, best_seconds(low_run, 3))
            full = min(full, best_seconds(full_run, 3))
    finally:
        torch.set_num_threads(threads)
    return flops / half / 1e9, flops / full / 1e9


class CpuHalfSpeeds:
    """This CPU's float16/bfloat16 vs float32 matmul and convolution rates, measured once (on first
    need, for every dtype and family at once) and logged in one line."""

    def __init__(self, measure=measure_cpu_rates):
        self._measure = measure
        self._rates = None
        self._lock = threading.Lock()

    def rates(self) -> dict[tuple[torch.dtype, str], tuple[float, float]]:
        if self._rates is None:
            with self._lock:
                if self._rates is None:
                    self._rates = self._measure_all()
        return self._rates

    def half_is_fast(self, dtype: torch.dtype, family: str) -> bool:
        half, full = self.rates()[(dtype, family)]
        return half >= NATIVE_MIN_SPEEDUP * full

    def _measure_all(self):
        if self._measure is measure_cpu_rates:  # this machine's, measured once (machine_rates.py)
            table = _machine_half_rates()
            rates = {(dtype, family): tuple(table[f"{_dtype_name(dtype)} {family}"])
                     for dtype in LOW_PRECISION for family in (MATMUL, CONVOLUTION)}
        else:
            rates = _measure_table(self._measure)
        parts = []
        for dtype in LOW_PRECISION:
            fields = []
            for family in (MATMUL, CONVOLUTION):
                half, full = rates[(dtype, family)]
                choice = "native" if half >= NATIVE_MIN_SPEEDUP * full else "float32 compute"
                fields.append(f"{family} {half:.1f} vs float32 {full:.1f} GFLOP/s -> {choice}")
            parts.append(f"{_dtype_name(dtype)}: " + ", ".join(fields))
        logger.info("Half precision on this CPU (%s): %s. %s=native|float32 overrides.",
                    torch.backends.cpu.get_cpu_capability(), "; ".join(parts), SETTING_ENV)
        return rates


def _measure_table(measure) -> dict:
    with measuring():  # (the user's RNG is not drawn from)
        return {(dtype, family): measure(dtype, family) for dtype in LOW_PRECISION for family in (MATMUL, CONVOLUTION)}


@remembered("cpu_half_rates")
def _machine_half_rates() -> dict:
    """``{"<dtype> <family>": [half GFLOP/s, float32 GFLOP/s]}`` of this machine (JSON's keys)."""
    return {f"{_dtype_name(dtype)} {family}": list(rates) for (dtype, family), rates in
            _measure_table(measure_cpu_rates).items()}


CPU_SPEEDS = CpuHalfSpeeds()  # the process's measurement
_forced_logged = set()


class HalfComputePolicy:
    """Whether float16/bfloat16 ops of a family compute natively on a device type (see the module
    docstring). ``setting`` is ``auto``, ``native`` or ``float32``; it applies to the CPU only."""

    def __init__(self, setting: str = "auto", speeds: CpuHalfSpeeds = None):
        if setting not in SETTINGS:
            raise ValueError(messages.HALF_COMPUTE_SETTING.format(settings=SETTINGS, setting=setting))
        self.setting = setting
        self.speeds = speeds if speeds is not None else CPU_SPEEDS

    @classmethod
    def from_env(cls) -> "HalfComputePolicy":
        return cls(setting_from_env())

    def native(self, device_type: str, dtype: torch.dtype, family: str) -> bool:
        if device_type != "cpu":
            return True  # CUDA's half kernels are its fast path
        if self.setting == "auto":
            return self.speeds.half_is_fast(dtype, family)
        if self.setting not in _forced_logged:
            _forced_logged.add(self.setting)
            logger.info("Half precision on this CPU: %s=%s", SETTING_ENV, self.setting)
        return self.setting == "native"

    def all_native(self, device_type: str, dtype: torch.dtype) -> bool:
        return all(self.native(device_type, dtype, family) for family in (MATMUL, CONVOLUTION))


def low_precision_is_faster(dtype: torch.dtype = torch.bfloat16, device_type: Optional[str] = None) -> bool:
    """Whether ``dtype`` matmuls beat float32 ones on ``device_type`` (default: the device openpop
    runs on by default, CUDA if there is one, else the CPU) under ``OPENPOP_HALF_COMPUTE``."""
    if device_type is None:
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    return HalfComputePolicy.from_env().native(device_type, dtype, MATMUL)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# ---------------------------------------------------------------------- the mode
# How torch 2.13's CPU kernels say they have no float16/bfloat16 implementation.
_MISSING_KERNEL = re.compile(r"not implemented for '(Half|BFloat16)'|Low precision dtypes not supported"
                             r"|Unsupported dtype (Half|BFloat16)|must be either float or double dtype")
_OP_ERRORS = (RuntimeError, ValueError, TypeError, NotImplementedError)
_upcast_logged = set()


class LowPrecisionOps(TorchFunctionMode):
    """The three rules of the module docstring, for the ops of one forward pass."""

    def __init__(self, policy: HalfComputePolicy):
        super().__init__()
        self.policy = policy

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            op = _OPS.get(func)
        except TypeError:  # an unhashable callable
            op = None
        if op is not None and "out" not in kwargs:
            plan = self._family_plan(op, func, args, kwargs)
            if plan is not None:
                return plan()
        try:
            return func(*args, **kwargs)
        except _OP_ERRORS as error:
            retry = _retry_plan(func, args, kwargs, error)
            if retry is None:
                raise
        return retry()  # its own error, if any, is the real one (say, a shape mismatch)

    def _family_plan(self, op: _Op, func, args, kwargs):
        """How to run a matmul/convolution-family op: in float32 where its half compute is slow
        here (rule 2, autocast included), in the promoted dtype when its operands mix float32 and
        half (rule 1) - or None to run it as it is."""
        tensors = _floating_tensors(args, kwargs)
        if not tensors:
            return None
        device_type = tensors[0].device.type
        if device_type in ("cpu", "cuda") and torch.is_autocast_enabled(device_type):
            if not op.autocast_lowers:
                return None
            dtype = torch.get_autocast_dtype(device_type)
            if self.policy.native(device_type, dtype, op.family):
                return None
            return functools.partial(_autocast_in_float32, func, args, kwargs, dtype, device_type)
        dtypes = {t.dtype for t in tensors}
        if not dtypes & set(LOW_PRECISION):
            return None
        result = tensors[0].dtype if op.result == "first" else functools.reduce(torch.promote_types, dtypes)
        if result not in LOW_PRECISION:
            # Mixed operands: PopTorch's upcast (rule 1) without a failed attempt first.
            return functools.partial(_call_cast, func, args, kwargs, result)
        if self.policy.native(device_type, result, op.family):
            return None
        return functools.partial(_in_float32, func, args, kwargs, result)


def _floating_tensors(args, kwargs):
    return [leaf for leaf in pytree.tree_leaves((args, kwargs))
            if isinstance(leaf, torch.Tensor) and leaf.is_floating_point()]


def _cast_floating(value, dtype, only=None):
    """``value`` with its floating tensors (those of dtypes ``only``, if given) converted to ``dtype``."""
    def cast(leaf):
        if (isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.dtype != dtype
                and (only is None or leaf.dtype in only)):
            return leaf.to(dtype)
        return leaf
    return pytree.tree_map(cast, value)


def _call_cast(func, args, kwargs, dtype, only=None):
    args, kwargs = _cast_floating((args, kwargs), dtype, only)
    return func(*args, **kwargs)


def _in_float32(func, args, kwargs, result_dtype):
    """``func`` on float32 copies of its half operands, float32 results rounded to ``result_dtype``."""
    return _cast_floating(_call_cast(func, args, kwargs, torch.float32, LOW_PRECISION),
                          result_dtype, (torch.float32,))


def _autocast_in_float32(func, args, kwargs, dtype, device_type):
    """What autocast computes for ``func`` - operands rounded to ``dtype``, result in ``dtype`` -
    with the arithmetic in float32."""
    rounded = _cast_floating((args, kwargs), dtype, (torch.float32,) + LOW_PRECISION)
    with torch.autocast(device_type, enabled=False):
        return _in_float32(func, *rounded, dtype)


def _writes_in_place(func, kwargs) -> bool:
    name = getattr(func, "__name__", "")
    return "out" in kwargs or name == "__setitem__" or (name.endswith("_") and not name.startswith("__")) \
        or (name.startswith("__i") and name not in ("__index__", "__int__", "__invert__", "__iter__"))


def _retry_plan(func, args, kwargs, error):
    """After ``func`` failed: how to run it with its half operands resolved (rules 1 and 3), or None."""
    dtypes = {t.dtype for t in _floating_tensors(args, kwargs)}
    low = dtypes & set(LOW_PRECISION)
    if not low:
        return None
    in_place = _writes_in_place(func, kwargs)
    if len(dtypes) > 1:
        if not in_place:
            return functools.partial(_call_cast, func, args, kwargs, functools.reduce(torch.promote_types, dtypes))
        if "out" in kwargs or not args or not isinstance(args[0], torch.Tensor):
            return None
        rest, rest_kwargs = _cast_floating((args[1:], kwargs), args[0].dtype)
        return functools.partial(func, args[0], *rest, **rest_kwargs)
    if in_place or _MISSING_KERNEL.search(str(error)) is None:
        return None
    (dtype,) = low
    name = op_name(func)
    if name not in _upcast_logged:
        _upcast_logged.add(name)
        logger.info("%s has no %s kernel on this device: computing it in float32", name, dtype)
    return functools.partial(_in_float32, func, args, kwargs, dtype)


def op_name(func) -> str:
    """A readable name of a torch function: ``torch.mm``, ``Tensor.add_``, ``torch.nn.functional.linear``."""
    name = getattr(func, "__name__", repr(func))
    qualname = getattr(func, "__qualname__", "") or ""
    module = getattr(func, "__module__", None)
    if qualname.startswith(("TensorBase.", "Tensor.")):
        return f"Tensor.{name}"
    if module == NN_FUNCTIONS_MODULE or module == "torch.nn.functional":
        return f"torch.nn.functional.{name}"
    if module == "torch" or qualname.startswith("_VariableFunctionsClass."):
        return f"torch.{name}"
    return f"{module}.{name}" if module else name


def autocast_contexts(dtype: torch.dtype, policy: HalfComputePolicy = None):
    """``(factories, function_mode)``: zero-argument factories of ``torch.autocast`` to ``dtype``
    on the CPU (and CUDA when present) and, when the CPU's ``dtype`` matmuls/convolutions are slow,
    ``LowPrecisionOps`` computing them in float32 (rule 2); ``function_mode``: whether that torch
    function mode is among them (a compiled program then runs stepwise). For autocast outside an
    executor's forward (Lightning's ``*-mixed`` precisions)."""
    policy = policy if policy is not None else HalfComputePolicy.from_env()
    factories = [functools.partial(torch.autocast, "cpu", dtype=dtype)]
    if torch.cuda.is_available():
        factories.append(functools.partial(torch.autocast, "cuda", dtype=dtype))
    if policy.all_native("cpu", dtype):
        return factories, False
    return factories + [functools.partial(LowPrecisionOps, policy)], True


@contextlib.contextmanager
def autocast(dtype: torch.dtype, policy: HalfComputePolicy = None):
    """The contexts of ``autocast_contexts``, entered."""
    with contextlib.ExitStack() as stack:
        for factory in autocast_contexts(dtype, policy)[0]:
            stack.enter_context(factory())
        yield
