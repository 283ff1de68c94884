"""PopTorch's ops (reference section 6), computed for real on CPU/GPU.

IPU-only hints (available memory, matmul serialisation, I/O overlap, multi-convolutions,
name scopes, attributes) are validated and then leave values unchanged. Control flow
(``for_loop``, ``cond``) and slicing ops compute their results with plain PyTorch.
"""
import builtins
import contextlib
from typing import Callable, Optional, Union

import torch

from . import enums, errors
from .arg_parsers import ICustomArgParser, registerCustomArgParser
from .compile_hooks import registerPostCompileHook, registerPreCompileHook
from .custom_ops import call_custom_op, register_custom_op
from .errors import COND_TRAINING, FOR_LOOP_TRAINING, Error, createPoptorchError
from .printing import module_repr, print  # pylint: disable=redefined-builtin
from .runtime import context
from .special_ops import ctc_beam_search_decoder, fps, nearest
from .torch_compat import PRINT_OPTS, format_tensor

__all__ = [
    "CPU",
    "Attribute",
    "ICustomArgParser",
    "MultiConv",
    "NameScope",
    "cond",
    "ctc_beam_search_decoder",
    "custom_op",
    "dynamic_slice",
    "dynamic_update",
    "for_loop",
    "fps",
    "ipu_print_tensor",
    "module_repr",
    "nearest",
    "nop",
    "print",
    "recomputationCheckpoint",
    "registerCustomArgParser",
    "registerPostCompileHook",
    "registerPreCompileHook",
    "register_custom_op",
    "serializedMatMul",
    "set_available_memory",
    "set_overlap_for_input",
    "set_overlap_for_output",
]


def _require_tensor(value, message: str) -> None:
    if not isinstance(value, torch.Tensor):
        raise createPoptorchError(errors.UNSUPPORTED_VALUE_TYPE.format(message=message, value_type=type(value)))


# --- ipu_print_tensor -------------------------------------------------------------

_FLOAT_FORMATS = {"auto": None, "fixed": False, "scientific": True, "none": None}


class _TensorFormat:
    """The formatting arguments of ``ipu_print_tensor``, applied with torch's printer."""

    def __init__(self, summarise_threshold, edge_items, max_line_width, digits, float_format,
                 separator, open_bracket, close_bracket):
        if float_format not in _FLOAT_FORMATS:
            raise ValueError(errors.FLOAT_FORMAT.format(float_format=float_format,
                                                        choices=", ".join(_FLOAT_FORMATS)))
        self.options = dict(
            threshold=summarise_threshold if summarise_threshold > 0 else float("inf"),
            edgeitems=edge_items,
            linewidth=max_line_width if max_line_width > 0 else 1 << 30,
            precision=digits if digits > 0 else 4,
            sci_mode=_FLOAT_FORMATS[float_format])
        self.separator = separator
        self.brackets = (open_bracket, close_bracket)

    def format(self, tensor: torch.Tensor) -> str:
        with _torch_print_options(**self.options):
            text = format_tensor(tensor.detach().cpu(), 0)
        # torch separates elements with ", " and rows with ",\n"; brackets are "[" "]".
        text = text.replace(",\n", self.separator.rstrip() + "\n").replace(", ", self.separator)
        return text.replace("[", self.brackets[0]).replace("]", self.brackets[1])


@contextlib.contextmanager
def _torch_print_options(**options):
    saved = {name: getattr(PRINT_OPTS, name) for name in options}
    torch.set_printoptions(**options)
    try:
        yield
    finally:
        torch.set_printoptions(**saved)


def _print_titled(title: str, text: str) -> None:
    builtins.print(f"{title}: {text}" if title else text, flush=True)


class _PrintGradient(torch.autograd.Function):
    """Identity whose backward prints the incoming gradient."""

    @staticmethod
    def forward(ctx, tensor, title, fmt):
        ctx.title, ctx.fmt = title, fmt
        return tensor.clone()

    @staticmethod
    def backward(ctx, grad):
        _print_titled(f"{ctx.title}_gradient" if ctx.title else "gradient", ctx.fmt.format(grad))
        return grad, None, None


def ipu_print_tensor(tensor: torch.Tensor, title: str = "", print_gradient: bool = True,
                     summarise_threshold: int = 1000, edge_items: int = 3,
                     max_line_width: int = 80, digits: int = 4, float_format: str = "auto",
                     separator: str = ", ", open_bracket: str = "(",
                     close_bracket: str = ")") -> torch.Tensor:
    """Print ``tensor`` (after ``title``) and return it unchanged; in the backward pass, print
    its gradient (after ``<title>_gradient``) when ``print_gradient`` is set.

    Nothing is printed during the executor's compile (tracing) pass.
    ``summarise_threshold`` / ``max_line_width`` of 0 disable summarising / line wrapping;
    ``float_format`` is one of "auto", "fixed", "scientific", "none".
    """
    _require_tensor(tensor, errors.PRINT_TENSOR_NOT_TENSOR)
    fmt = _TensorFormat(summarise_threshold, edge_items, max_line_width, digits, float_format,
                        separator, open_bracket, close_bracket)
    ctx = context.current()
    if getattr(ctx, "tracing", False):
        ctx.host_io = "ipu_print_tensor"  # the compiled backend cannot run it: runtime/compiled
        return tensor  # the executor's compile pass is a dry run: print when the model runs
    _print_titled(title, fmt.format(tensor))
    if print_gradient and tensor.requires_grad and torch.is_grad_enabled():
        return _PrintGradient.apply(tensor, title, fmt)
    return tensor


# --- identity-like hints ----------------------------------------------------------

def nop(tensor: torch.Tensor) -> torch.Tensor:
    """Identity (on IPUs: one that the graph optimiser never removes)."""
    _require_tensor(tensor, errors.NOP_NOT_TENSOR)
    return tensor


def recomputationCheckpoint(*tensors):
    """Identity marking tensors to keep (not recompute) in pipelined recomputation.

    One tensor gives a tensor; several tensors give a tuple; a single list/tuple gives one
    of the same type. During a run whose context has a ``checkpoints`` list, the tensors
    are appended to it.
    """
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        result = recomputationCheckpoint(*tensors[0])
        return type(tensors[0])(result if isinstance(result, tuple) else (result,))
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise ValueError(errors.INPUTS_NOT_TENSORS)
    checkpoints = getattr(context.current(), "checkpoints", None)
    if isinstance(checkpoints, list):
        checkpoints.extend(tensors)
    return tensors[0] if len(tensors) == 1 else tuple(tensors)


def set_available_memory(tensor: torch.Tensor,
                         available_memory_proportion: float) -> torch.Tensor:
    """Identity; on IPUs, the temporary-memory budget (0..1) of the op producing ``tensor``."""
    _require_tensor(tensor, errors.AVAILABLE_MEMORY_NOT_TENSOR)
    if not isinstance(available_memory_proportion, (int, float)) or \
            not 0.0 <= available_memory_proportion <= 1.0:
        raise ValueError(errors.AVAILABLE_MEMORY_PROPORTION.format(value=available_memory_proportion))
    return tensor


def serializedMatMul(lhs: torch.Tensor, rhs: torch.Tensor,
                     mode: enums.MatMulSerializationMode, factor: int = 0,
                     keep_precision: bool = False) -> torch.Tensor:
    """``torch.matmul(lhs, rhs)``; on IPUs it was computed in ``factor`` serial pieces."""
    if not isinstance(mode, enums.MatMulSerializationMode):
        raise AssertionError(errors.MATMUL_SERIALIZATION_MODE.format(mode=mode))
    if not isinstance(factor, int) or isinstance(factor, bool):
        raise AssertionError(errors.MATMUL_SERIALIZATION_FACTOR.format(factor=factor))
    if not isinstance(keep_precision, bool):
        raise AssertionError(errors.MATMUL_KEEP_PRECISION.format(keep_precision=keep_precision))
    return torch.matmul(lhs, rhs)


def _map_tensors(structure, fn):
    """Apply ``fn`` to every tensor of a (nested) tensor / list / tuple / dict."""
    if isinstance(structure, torch.Tensor):
        return fn(structure)
    if isinstance(structure, dict):
        return type(structure)((k, _map_tensors(v, fn)) for k, v in structure.items())
    if isinstance(structure, tuple) and hasattr(structure, "_fields"):  # namedtuple
        return type(structure)(*(_map_tensors(v, fn) for v in structure))
    if isinstance(structure, (list, tuple)):
        return type(structure)(_map_tensors(v, fn) for v in structure)
    return fn(structure)


def _set_overlap(tensors, mode, what: str):
    if not isinstance(mode, enums.OverlapMode):
        raise createPoptorchError(errors.OVERLAP_MODE.format(mode=mode))

    def check(t):
        _require_tensor(t, errors.OVERLAP_NOT_TENSOR.format(what=what))
        return t

    return _map_tensors(tensors, check)


def set_overlap_for_input(input_tensors, mode: enums.OverlapMode):
    """Identity on a tensor or a nested list/tuple/dict of tensors (an IPU I/O hint)."""
    return _set_overlap(input_tensors, mode, "inputs")


def set_overlap_for_output(output_tensors, mode: enums.OverlapMode):
    """Identity on a tensor or a nested list/tuple/dict of tensors (an IPU I/O hint)."""
    return _set_overlap(output_tensors, mode, "outputs")


# --- dynamic slices ---------------------------------------------------------------

def _check_slice_args(op: str, tensor, dim, start, size) -> int:
    """Validate the common arguments; return ``dim`` made non-negative."""
    _require_tensor(tensor, errors.SLICE_INPUT_NOT_TENSOR.format(op=op))
    if not isinstance(dim, int):
        raise createPoptorchError(errors.DIMENSION_NOT_INTEGER)
    _require_tensor(start, errors.SLICE_START_NOT_TENSOR.format(op=op))
    if not isinstance(size, int):
        raise createPoptorchError(errors.SIZE_NOT_INTEGER)
    if not -tensor.dim() <= dim < max(tensor.dim(), 1):
        raise createPoptorchError(errors.DIMENSION_OUT_OF_RANGE.format(dim=dim, rank=tensor.dim()))
    if start.numel() != 1 or start.is_floating_point() or start.is_complex():
        raise createPoptorchError(errors.SLICE_START_NOT_ONE_INTEGER.format(op=op, dtype=start.dtype,
                                                                            shape=list(start.shape)))
    if size == 0:
        raise createPoptorchError(errors.SLICE_EMPTY)
    if size < 0:
        raise createPoptorchError(
            errors.SLICE_END_BEFORE_START)
    return dim % tensor.dim()


def _slice_indices(tensor, dim, start, size, step, op):
    """Indices ``start, start+step, ... < start+size`` along ``dim``, as a tensor on device."""
    if start.device.type == "cpu":  # checking costs nothing here; on accelerators it would sync
        first = int(start.reshape(()))
        if first < 0 or first + size > tensor.shape[dim]:
            raise createPoptorchError(
                errors.SLICE_OUTSIDE_DIMENSION.format(op=op, first=first, end=first + size, dim=dim,
                                                      length=tensor.shape[dim]))
    offsets = torch.arange(0, size, step, device=tensor.device)
    return start.reshape(()).to(device=tensor.device, dtype=torch.long) + offsets


def dynamic_slice(tensor: torch.Tensor, dim: int, start: torch.Tensor, size: int,
                  step: int) -> torch.Tensor:
    """``tensor[start:start+size:step]`` along ``dim``, with ``start`` a tensor."""
    dim = _check_slice_args("dynamic_slice", tensor, dim, start, size)
    if not isinstance(step, int):
        raise createPoptorchError(errors.STEP_NOT_INTEGER)
    if step < 1:
        raise createPoptorchError(errors.STEP_NOT_POSITIVE.format(step=step))
    return tensor.index_select(dim, _slice_indices(tensor, dim, start, size, step,
                                                   "dynamic_slice"))


def dynamic_update(input: torch.Tensor, src: torch.Tensor, dim: int, start: torch.Tensor,
                   size: int) -> torch.Tensor:
    """A copy of ``input`` whose slice ``[start:start+size]`` along ``dim`` is ``src``
    (``torch.slice_scatter`` with a tensor ``start``)."""
    # pylint: disable=redefined-builtin
    _require_tensor(src, errors.DYNAMIC_UPDATE_SRC_NOT_TENSOR)
    dim = _check_slice_args("dynamic_update", input, dim, start, size)
    if input.dim() != src.dim():
        raise createPoptorchError(errors.DYNAMIC_UPDATE_DIMENSIONALITY.format(
            input_rank=input.dim(), src_rank=src.dim()))
    if input.dtype != src.dtype:
        raise createPoptorchError(errors.DYNAMIC_UPDATE_DTYPE.format(input_dtype=input.dtype, src_dtype=src.dtype))
    expected = list(input.shape)
    expected[dim] = size
    if list(src.shape) != expected:
        raise createPoptorchError(errors.DYNAMIC_UPDATE_SHAPE.format(expected=expected, dim=dim, size=size,
                                                                     shape=list(src.shape)))
    return input.index_copy(dim, _slice_indices(input, dim, start, size, 1, "dynamic_update"),
                            src)


# --- control flow -----------------------------------------------------------------

def _as_list(outputs) -> list[torch.Tensor]:
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


def for_loop(count: int, body: Callable[..., list[torch.Tensor]],
             inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Run ``body`` ``count`` times, feeding each iteration's outputs back as its inputs.

    ``body`` takes and returns as many tensors as ``inputs`` holds. Inference only.
    """
    if not isinstance(inputs, list):
        raise ValueError(errors.FOR_LOOP_INPUTS_NOT_LIST)
    for index, tensor in enumerate(inputs):
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(errors.FOR_LOOP_INPUT_NOT_TENSOR.format(index=index))
    if context.is_training():
        raise Error(FOR_LOOP_TRAINING)
    if not isinstance(count, int) or count < 0:
        raise ValueError(errors.FOR_LOOP_COUNT.format(count=count))
    # The body receives its inputs by value: it must not see the caller's tensors change.
    values = [t.clone() for t in inputs]
    for _ in range(count):
        values = _as_list(body(*values))
        if len(values) != len(inputs):
            raise createPoptorchError(
                errors.FOR_LOOP_BODY_OUTPUTS.format(values_count=len(values), inputs_count=len(inputs)))
    return values


def cond(condition, then_body: Callable, then_inps: list[torch.Tensor], else_body: Callable,
         else_inps: list[torch.Tensor]) -> list[torch.Tensor]:
    """``then_body(*then_inps)`` if ``condition`` else ``else_body(*else_inps)``, as a list.

    Inference only.
    """
    if not isinstance(then_inps, list) or not isinstance(else_inps, list):
        raise ValueError(errors.COND_INPUTS_NOT_LIST)
    if context.is_training():
        raise Error(COND_TRAINING)
    if bool(condition):
        return _as_list(then_body(*then_inps))
    return _as_list(else_body(*else_inps))


# --- host callback ----------------------------------------------------------------

class CPU:
    """Runs ``layer_to_call`` on the host: inputs are moved to the CPU and the results back
    to the device of the (first tensor) input. A module's parameters are frozen, as in PopTorch.
    """

    def __init__(self, layer_to_call: Callable, ID: str):
        self._layer_to_call = layer_to_call
        if isinstance(layer_to_call, torch.nn.Module):
            layer_to_call.requires_grad_(False)
        self._ID = ID

    @property
    def ID(self) -> str:
        return self._ID

    def __call__(self, *inputs, **kwargs):
        devices = [t.device for t in inputs if isinstance(t, torch.Tensor)]
        device = devices[0] if devices else torch.device("cpu")
        to_cpu = lambda t: t.cpu() if isinstance(t, torch.Tensor) else t  # noqa: E731
        outputs = self._layer_to_call(*(to_cpu(t) for t in inputs),
                                      **{k: to_cpu(v) for k, v in kwargs.items()})
        return _map_tensors(outputs,
                            lambda t: t.to(device) if isinstance(t, torch.Tensor) else t)


# --- IPU-only configuration scopes ------------------------------------------------

def _per_conv(name: str, value, scalar_type):
    """``value`` as a tuple of ``scalar_type`` (one per convolution), None stays None."""
    if value is None:
        return None
    if isinstance(value, scalar_type):
        return (value,)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, scalar_type)
                                                          for v in value):
        return tuple(value)
    raise AssertionError(f"Invalid {name}!")


class MultiConv:
    """Scope whose convolutions IPUs ran as one multi-convolution; numerically an identity.

    The setters validate their values and return ``self`` for chaining.
    """

    def __init__(self):
        self._available_memory_proportions = None
        self._partials_types = None
        self._enable_conv_ditherings = None
        self._plan_type = None
        self._per_conv_reserved_tiles = None
        self._cycle_back_off = None

    def availableMemoryProportions(self, value: Union[float, list[float]]) -> "MultiConv":
        self._available_memory_proportions = _per_conv("available memory proportion", value,
                                                       float)
        return self

    def partialsTypes(self, value: Union[torch.dtype, list[torch.dtype]]) -> "MultiConv":
        values = value if isinstance(value, (list, tuple)) else [value]
        for dtype in values:
            if dtype not in (torch.float32, torch.float16):
                raise ValueError(errors.PARTIALS_TYPE)
        self._partials_types = tuple(values)
        return self

    def enableConvDithering(self, value: Union[bool, list[bool]]) -> "MultiConv":
        values = value if isinstance(value, (list, tuple)) else [value]
        if value is not None and not all(isinstance(v, bool) for v in values):
            raise ValueError(errors.ENABLE_CONV_DITHERING_VALUE)
        self._enable_conv_ditherings = None if value is None else tuple(values)
        return self

    def planType(self, value: enums.MultiConvPlanType) -> "MultiConv":
        if value is not None and not isinstance(value, enums.MultiConvPlanType):
            raise AssertionError(errors.CONVOLUTION_PLAN_TYPE)
        self._plan_type = value
        return self

    def perConvReservedTiles(self, value: int) -> "MultiConv":
        if not isinstance(value, int):
            raise AssertionError(errors.PER_CONV_RESERVED_TILES.format(value=value))
        self._per_conv_reserved_tiles = value
        return self

    def cycleBackOff(self, value: float) -> "MultiConv":
        if not isinstance(value, float):
            raise AssertionError(errors.CYCLE_BACK_OFF.format(value=value))
        self._cycle_back_off = value
        return self

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        return None


class NameScope:
    """Scope prefixing the names of the ops created inside it (IR naming only)."""

    _active: list[str] = []

    def __init__(self, name: str):
        if not isinstance(name, str):
            raise AssertionError(errors.NAME_SCOPE_NOT_STRING)
        self.name = name

    @classmethod
    def current(cls) -> str:
        """The active scope names joined by "/" ("" outside any scope)."""
        return "/".join(cls._active)

    def __enter__(self):
        NameScope._active.append(self.name)
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        NameScope._active.pop()


class Attribute:
    """Scope attaching backend attributes to the ops inside it, e.g.
    ``Attribute(__outline={"layer": "embedding"})``; numerically an identity."""

    _active: list[dict] = []

    def __init__(self, **attributes):
        self.attributes = attributes

    def __enter__(self):
        Attribute._active.append(self.attributes)
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        Attribute._active.pop()


def custom_op(inputs, name: str, domain: str, domain_version: int, example_outputs,
              attributes: Optional[dict] = None) -> list[torch.Tensor]:
    """Applies the PopART custom op ``domain::name`` to ``inputs``: runs the PyTorch
    implementation registered for it (``register_custom_op``; Graphcore's applications' ops
    come registered) as ``fn(*inputs, **attributes)``.

    Args:
        inputs (list or tuple): The op's inputs, for example ``[x, y]``.
        name (str): The op's name.
        domain (str): The op's domain.
        domain_version (int): The domain's version (any version runs the same implementation).
        example_outputs (iterable): Tensors with the shapes and dtypes of the op's outputs.
        attributes (dict): The op's attributes: string keys; float, int or string values, or
            lists/tuples of one of those types (PopTorch's rules).

    Returns:
        The op's outputs, a list of tensors shaped and typed like ``example_outputs``.
    """
    return call_custom_op(inputs, name, domain, example_outputs, attributes)
