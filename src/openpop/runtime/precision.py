"""Numeric precision of a run: what ``Options.Precision`` (and automatic loss scaling) change.

``RunPrecision`` is the executor's one object for it, built from the options when a model is
wrapped:

* ``forward(model)`` — entered around every forward pass (compile trace, training and
  inference micro-batches). It applies
  - **autocast** (``Precision.autocast(True, dtype)``, openpop's mixed precision): fp32 weights,
    matmuls/convolutions in bf16 (default) or fp16 through ``torch.autocast`` on the CPU (and
    CUDA when present); backward follows autocast's casts;
  - **low-precision ops** (``half_compute.LowPrecisionOps``) for models holding float16/bfloat16
    weights or buffers, and for autocast to a dtype whose matmuls are slow on this CPU: mixed
    float32/float16 operands resolved as PopTorch does (upcast to float32), half matmuls and
    convolutions computed in float32 where half is slow here (``OPENPOP_HALF_COMPUTE``), ops
    without a half kernel run in float32;
  - **floating-point exceptions** (``Precision.enableFloatingPointExceptions(True)``, not during
    the compile trace): ``FloatingPointChecker``.
* ``running(model)`` — around a whole host call: the matmul partials type
  (``Precision.setPartialsType``). CPU kernels (oneDNN/MKL and ATen's fallbacks) always
  accumulate float16/bfloat16 products in float32 and have no switch for lower-precision
  accumulation, so on the CPU both settings give fp32 accumulation. On CUDA, "float" (PopTorch's
  default) turns cuBLAS's reduced-precision reductions and fp16 accumulation off for the call,
  and "half" turns them on (``torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction``,
  ``allow_bf16_reduced_precision_reduction``, ``allow_fp16_accumulation``); the previous values
  are restored afterwards.
* ``saturating(model, watching)`` — around an eager host call's steps: float16 results that
  overflow become +-65504, as on the IPU, once a watched call overflowed
  (``watches_half_overflow``, ``half_saturation.py``; compiled programs insert the clamps).
* ``loss_scaler(optimizer)`` — automatic loss scaling (``loss_scaling.py``).
* ``optimizer_step(optimizer)`` — the optimizer's ``step()`` (``optim.checks.optimizer_method``); with
  ``Precision.enableStochasticRounding(True)``, float16/bfloat16 parameters are updated in
  float32 (the optimizer sees float32 copies of them and of their gradients) and the result is
  rounded stochastically back to the parameter's dtype: up or down with probabilities given by
  the distance to each neighbour, so the rounding is unbiased. Works on every device; the
  random bits come from a generator of openpop's (seeded from ``Options.randomSeed`` if set,
  else ``torch.initial_seed()``), so the user's RNG stream is not disturbed. Only weight updates
  are rounded stochastically (optimizer state in float16 is rounded to nearest).
"""
import contextlib
import functools
import threading

import torch
from torch.overrides import TorchFunctionMode

from .. import errors
from ..log import logger
from ..optim.checks import optimizer_method
from ..torch_compat import pytree
from . import half_saturation, messages
from .half_compute import LOW_PRECISION, HalfComputePolicy, LowPrecisionOps, op_name
from .half_saturation import SaturatingHalf
from .loss_scaling import DynamicLossScaling, StaticLossScaling

_NO_CONTEXT = contextlib.nullcontext()


class RunPrecision:
    """Everything precision-related one executor does (see the module docstring)."""

    def __init__(self, options):
        precision = options.Precision
        self.autocast_enabled = precision.autocast_enabled
        self.autocast_dtype = precision.autocast_dtype
        self.fp_exceptions = precision.floating_point_exceptions
        self.stochastic_rounding = precision.stochastic_rounding
        self.half_partials = precision.partials_type == "half"
        self.dynamic = DynamicLossScaling.from_options(options)
        self._seed = options.random_seed if options.exists("random_seed") else None
        self._generators = {}
        self.half_compute = HalfComputePolicy.from_env()  # validates OPENPOP_HALF_COMPUTE
        self.half_overflow = half_saturation.setting_from_env()  # validates OPENPOP_HALF_OVERFLOW
        self.overflow_seen = False  # a watched call overflowed (half_saturation.py)
        self._saturation_applies = None  # half_saturation.applies, decided at the first eager call
        self._low_precision_ops = None  # decided on the first forward

    # ------------------------------------------------------------------ forward
    def forward(self, model: torch.nn.Module, tracing: bool = False):
        """Context for one forward pass of ``model``."""
        if self._low_precision_ops is None:
            self._low_precision_ops = self._needs_low_precision_ops(model)
        if not (self.autocast_enabled or self._low_precision_ops or (self.fp_exceptions and not tracing)):
            return _NO_CONTEXT
        return self._forward(model, tracing)

    def _needs_low_precision_ops(self, model) -> bool:
        """Whether ``model``'s forward needs ``LowPrecisionOps``: it holds float16/bfloat16 tensors,
        or autocasts to a dtype that is slow on the CPU it runs on. Asking the policy here, outside
        any forward, is what measures this CPU's half rates (once per process) when it must. A
        model whose ``computes_low_precision`` is true applies the rules itself (PopART's graphs:
        popart/graph.py); a compiled program then loops over its steps without the mode."""
        if not self.autocast_enabled and getattr(model, "computes_low_precision", False):
            return False
        tensors = list(model.parameters()) + list(model.buffers())
        low = {t.dtype for t in tensors if t.dtype in LOW_PRECISION}
        if self.autocast_enabled:
            low.add(self.autocast_dtype)
        on_cpu = not tensors or any(t.device.type == "cpu" for t in tensors)
        slow = on_cpu and not all(self.half_compute.all_native("cpu", dtype) for dtype in low)
        return slow or any(t.dtype in LOW_PRECISION for t in tensors)

    @contextlib.contextmanager
    def _forward(self, model, tracing):
        with contextlib.ExitStack() as stack:
            if self.autocast_enabled:
                stack.enter_context(torch.autocast("cpu", dtype=self.autocast_dtype))
                if torch.cuda.is_available():
                    stack.enter_context(torch.autocast("cuda", dtype=self.autocast_dtype))
            if self._low_precision_ops:
                stack.enter_context(LowPrecisionOps(self.half_compute))
            if self.fp_exceptions and not tracing:
                stack.enter_context(FloatingPointChecker(model))
            yield

    def traced_forward(self, model: torch.nn.Module):
        """``(factories, mode)``: the contexts ``forward`` enters, as zero-argument factories a
        compiled program enters inside its traced forward (autocast, ``LowPrecisionOps``), and
        whether one is a torch function mode. Floating-point exceptions have no traced form (the
        compiled backend declines them)."""
        if self._low_precision_ops is None:
            self._low_precision_ops = self._needs_low_precision_ops(model)
        factories = []
        if self.autocast_enabled:
            factories.append(functools.partial(torch.autocast, "cpu", dtype=self.autocast_dtype))
            if torch.cuda.is_available():
                factories.append(functools.partial(torch.autocast, "cuda", dtype=self.autocast_dtype))
        if self._low_precision_ops:
            factories.append(functools.partial(LowPrecisionOps, self.half_compute))
        return factories, self._low_precision_ops

    @contextlib.contextmanager
    def running(self, model: torch.nn.Module):
        """Context for one host call: the matmul partials type on CUDA."""
        if not torch.cuda.is_available() or not any(p.is_cuda for p in model.parameters()):
            yield
            return
        with cuda_matmul_partials(half=self.half_partials):
            yield

    def watches_half_overflow(self, model: torch.nn.Module, rerun_possible: bool) -> bool:
        """Whether an eager host call of ``model`` runs without saturation and watches for
        overflow (``half_saturation.py``): it computes in float16, no overflow was seen yet, and a
        call that overflows can be run again (``rerun_possible``)."""
        return rerun_possible and not self.overflow_seen and self.saturates(model)

    def saturating(self, model: torch.nn.Module, watching: bool):
        """Context for an eager host call's steps: float16 results clamped to +-65504 where the
        model computes in float16 and the call is not ``watching`` for overflow."""
        return SaturatingHalf() if not watching and self.saturates(model) else _NO_CONTEXT

    def saturates(self, model: torch.nn.Module) -> bool:
        """Whether ``model``'s float16 overflow saturates (``half_saturation.applies``), decided
        once per executor."""
        if self._saturation_applies is None:  # decided at the first call, as the low-precision ops are
            self._saturation_applies = half_saturation.applies(model, self)
        return self._saturation_applies

    def start_saturating(self) -> None:
        """A watched call overflowed: this and every later call saturate."""
        self.overflow_seen = True
        logger.info(messages.HALF_OVERFLOW_SEEN)

    # ------------------------------------------------------------------ training
    def loss_scaler(self, optimizer):
        """The loss scaling of one host call with ``optimizer``: automatic (bound to it) or static
        (its ``loss_scaling``)."""
        return StaticLossScaling(optimizer) if self.dynamic is None else self.dynamic.bind(optimizer)

    def optimizer_step(self, optimizer) -> None:
        step = optimizer_method(optimizer, "step")
        if not self.stochastic_rounding:
            step()
            return
        low = [(p, p.data, p.grad) for group in optimizer.param_groups for p in group["params"]
               if p.grad is not None and p.dtype in LOW_PRECISION]
        if not low:
            step()
            return
        masters = []
        try:
            for p, data, grad in low:
                p.data = data.float()
                p.grad = grad.float()
                masters.append(p.data)
            step()
        finally:
            for p, data, grad in low:
                p.data = data
                p.grad = grad
        with torch.no_grad():
            for (_, data, _), master in zip(low, masters):
                data.copy_(stochastic_round(master, data.dtype, self._generator(data.device)))

    def rounding_noise(self, params, steps: int):
        """Per parameter of ``params`` the uniform numbers ``steps`` optimizer steps' stochastic
        rounding of it draws, ``[steps, *shape]`` float32, taken from openpop's generators in
        ``optimizer_step``'s order (step after step, parameter after parameter): the compiled
        program rounds as eager would."""
        noise = [torch.empty((steps, *p.shape), dtype=torch.float32, device=p.device) for p in params]
        for step in range(steps):
            for p, values in zip(params, noise):
                values[step].uniform_(0.0, 1.0, generator=self._generator(p.device))
        return noise

    def rounding_draws(self, params) -> "RoundingDraws":
        """``rounding_noise`` for ``params`` as a compiled program draws it (``RoundingDraws``)."""
        return RoundingDraws(self, params)

    @contextlib.contextmanager
    def generators_kept(self, always: bool = False):
        """openpop's generators as they were when the block raises (``always``: also when it
        returns, for ``compile()``'s dry run); generators the block created are dropped."""
        saved = generator_states(self._generators)
        try:
            yield
        except BaseException:
            restore_generator_states(self._generators, saved)
            raise
        if always:
            restore_generator_states(self._generators, saved)

    @property
    def generators(self) -> dict:
        """openpop's stochastic-rounding generators, ``{device: torch.Generator}`` (made on first use)."""
        return self._generators

    def _generator(self, device: torch.device) -> torch.Generator:
        generator = self._generators.get(device)
        if generator is None:
            generator = torch.Generator(device=device)
            seed = self._seed if self._seed is not None else torch.initial_seed()
            generator.manual_seed((seed * 2654435761 + 12345) % (2**63))
            self._generators[device] = generator
        return generator


# ---------------------------------------------------------------------- stochastic rounding
class RoundingDraws:
    """A compiled program's stochastic-rounding numbers: ``draws(steps)`` is
    ``RunPrecision.rounding_noise(params, steps)``. With automatic loss scaling a step may be
    skipped, and eager draws nothing for a skipped step: the program takes ``mark()`` before a
    step's draw and ``undo(mark)`` once it knows the step was skipped, so the generators go on as
    eager's do."""

    def __init__(self, precision: RunPrecision, params):
        self._precision = precision
        self._params = params

    def __call__(self, steps: int):
        return self._precision.rounding_noise(self._params, steps)

    def mark(self) -> dict:
        return generator_states(self._precision.generators)

    def undo(self, mark: dict) -> None:
        restore_generator_states(self._precision.generators, mark)


def generator_states(generators: dict) -> dict:
    """``{device: state}`` of openpop's rounding generators (``RunPrecision.generators``)."""
    return {device: g.get_state() for device, g in generators.items()}


def restore_generator_states(generators: dict, saved: dict) -> None:
    """Put ``generators`` back to ``saved`` (``generator_states``): generators made since are dropped."""
    for device in [d for d in generators if d not in saved]:
        del generators[device]
    for device, state in saved.items():
        generators[device].set_state(state)


def stochastic_round(x: torch.Tensor, dtype: torch.dtype, generator: torch.Generator = None) -> torch.Tensor:
    """Round float32 ``x`` to ``dtype`` (float16 or bfloat16) stochastically: to the neighbour
    above with probability ``(x - below) / (above - below)``, else to the one below. Values
    already representable are unchanged; inf/NaN stay inf/NaN; values beyond the largest finite
    number round to it or to inf."""
    u = torch.rand(x.shape, generator=generator, device=x.device, dtype=torch.float32)
    return round_with_noise(x, dtype, u)


def round_with_noise(x: torch.Tensor, dtype: torch.dtype, noise: torch.Tensor) -> torch.Tensor:
    """``stochastic_round`` with its uniform numbers given: ``noise``, float32 in [0, 1) of ``x``'s
    shape (pure tensor maths: the compiled program rounds with numbers drawn before it runs)."""
    x = x.float()
    nearest = x.to(dtype)
    nearest_f = nearest.float()
    other = _neighbour(nearest, nearest_f < x)  # the representable neighbour on x's other side
    gap = (other.float() - nearest_f).abs()
    p_other = (x - nearest_f).abs() / gap
    return torch.where(noise < p_other, other, nearest)


def _neighbour(value: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``torch.nextafter(value, +inf if up else -inf)`` for float16/bfloat16 ``value``, on the bits
    (Inductor's half ``nextafter`` returns ``value`` itself, torch 2.13): one step of the 16-bit
    pattern away from or towards zero; from a zero, the smallest subnormal; infinities stay."""
    bits = value.view(torch.int16)
    away = up == (bits >= 0)
    step = torch.where(away, 1, -1).to(torch.int16)  # sign and magnitude: +1 is away from zero
    from_zero = torch.where(up, 1, -32767).to(torch.int16)  # 0x0001, 0x8001
    moved = torch.where(value == 0, from_zero, bits + step).view(value.dtype)
    return torch.where(value.isinf() & away, value, moved)


# ---------------------------------------------------------------------- partials (CUDA)
@contextlib.contextmanager
def cuda_matmul_partials(half: bool):
    """Set cuBLAS's reduced-precision switches for the duration (see the module docstring)."""
    matmul = torch.backends.cuda.matmul
    names = ["allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction",
             "allow_fp16_accumulation"]
    saved = {}
    for name in names:
        try:
            saved[name] = getattr(matmul, name)
        except AttributeError:
            continue
    try:
        for name in saved:
            setattr(matmul, name, half)
        yield
    finally:
        for name, value in saved.items():
            setattr(matmul, name, value)


# ---------------------------------------------------------------------- FP exceptions
_ORDERED_COMPARISONS = frozenset(["lt", "le", "gt", "ge", "less", "less_equal", "greater", "greater_equal",
                                  "__lt__", "__le__", "__gt__", "__ge__"])


# The checks read values detached: ``isfinite``/``isinf`` decompose into ops autograd records
# (``abs`` saves its input), and a checkpointed block's recomputation, which runs without the
# checker, must save exactly the tensors its forward saved.


def _flags(values):
    """(has NaN, has +-inf) over the floating tensors and Python floats in ``values``."""
    nan = inf = False
    for value in values:
        if isinstance(value, torch.Tensor):
            if not (value.is_floating_point() or value.is_complex()) or value.numel() == 0:
                continue
            value = value.detach()
            if value.is_complex():
                value = torch.view_as_real(value)
            nan = nan or bool(torch.isnan(value).any())
            inf = inf or bool(torch.isinf(value).any())
        elif isinstance(value, float):
            nan = nan or value != value
            inf = inf or value in (float("inf"), float("-inf"))
    return nan, inf


def _all_finite(values) -> bool:
    for value in values:
        if isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex()):
            if value.numel() and not bool(torch.isfinite(value.detach()).all()):
                return False
    return True


def _is_inplace(name: str, kwargs) -> bool:
    if "out" in kwargs:
        return True
    if name.startswith("__"):
        return name.startswith("__i") and name not in ("__index__", "__int__", "__invert__", "__iter__")
    return name.endswith("_")


def _violation(inputs, outputs, input_flags=None):
    """What IEEE exception an op raised, judged from its inputs and outputs, or None: NaN out of
    NaN-free inputs is an invalid operation; inf out of finite inputs is an overflow or a
    division by zero. ``input_flags`` are the inputs' (NaN, inf) flags if already known."""
    if _all_finite(outputs):
        return None
    in_nan, in_inf = input_flags if input_flags is not None else _flags(inputs)
    out_nan, out_inf = _flags(outputs)
    if out_nan and not in_nan:
        return "produced NaN (invalid operation such as 0/0, inf-inf, 0*inf or sqrt of a negative number)"
    if out_inf and not in_nan and not in_inf:
        return "produced inf (overflow or division by zero)"
    return None


class FloatingPointChecker(TorchFunctionMode):
    """Raises ``poptorch.Error`` when an op of the forward pass, or the backward of one,
    produces inf/NaN from finite values, naming the op and the module that ran it.

    Forward ops are checked as they run (a tensor ``isfinite`` per op), ordered comparisons
    with NaN raise too. For backward, each forward op's autograd node gets a hook checking the
    gradients it produces. Active only with ``enableFloatingPointExceptions(True)``."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.modules = []   # names of the modules currently running, innermost last
        self.handles = []
        self.thread = threading.get_ident()  # module hooks fire for every thread: keep ours

    def __enter__(self):
        for name, module in self.model.named_modules():
            kind = type(module).__name__
            label = f"module '{name}' ({kind})" if name else f"the top-level module ({kind})"
            self.handles.append(module.register_forward_pre_hook(self._enter_module(label)))
            self.handles.append(module.register_forward_hook(self._leave_module(), always_call=True))
        return super().__enter__()

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
        self.handles = []
        return super().__exit__(*exc)

    def _enter_module(self, label):
        def hook(module, args):
            if threading.get_ident() == self.thread:
                self.modules.append(label)
        return hook

    def _leave_module(self):
        def hook(module, args, output):
            if self.modules and threading.get_ident() == self.thread:
                self.modules.pop()
        return hook

    def _where(self, func) -> str:
        where = op_name(func)
        if self.modules:
            where += f" in {self.modules[-1]}"
        return where

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "__get__":
            return func(*args, **kwargs)
        inputs = pytree.tree_leaves((args, kwargs))
        # In-place ops overwrite their inputs: judge those by the values they had before.
        before = _flags(inputs) if _is_inplace(name, kwargs) else None
        result = func(*args, **kwargs)
        outputs = [leaf for leaf in pytree.tree_leaves(result) if isinstance(leaf, torch.Tensor)]
        problem = _violation(inputs, outputs, before)
        if problem is None and name in _ORDERED_COMPARISONS:
            if (before or _flags(inputs))[0]:
                problem = "compared with NaN (invalid operation)"
        if problem is not None:
            raise errors.createPoptorchError(
                messages.FP_EXCEPTION_FORWARD.format(where=self._where(func), problem=problem))
        if torch.is_grad_enabled():
            self._watch_backward(func, outputs)
        return result

    def _watch_backward(self, func, outputs):
        nodes = []
        for out in outputs:
            node = out.grad_fn
            if node is not None and all(node is not n for n in nodes):
                nodes.append(node)
        if not nodes:
            return
        where = self._where(func)
        for node in nodes:
            node.register_hook(_backward_check(where, node.name()))


def _backward_check(where: str, node_name: str):
    def hook(grad_inputs, grad_outputs):
        produced = [g for g in grad_inputs if g is not None]
        received = [g for g in grad_outputs if g is not None]
        problem = _violation(received, produced)
        if problem is not None:
            raise errors.createPoptorchError(
                messages.FP_EXCEPTION_BACKWARD.format(node=node_name, where=where, problem=problem))
    return hook
