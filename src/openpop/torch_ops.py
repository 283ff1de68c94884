"""PopTorch's operators in the ``torch.ops.poptorch`` namespace.

PopTorch registered its operators with the PyTorch dispatcher, and some of Graphcore's code calls
them there rather than through ``poptorch.*`` (``torch.ops.poptorch.push_name_scope(name)`` in a
forward hook, ``torch.ops.poptorch.internal_cast(x, "FLOAT")`` around a float32 GELU). openpop
registers the user-facing ones with the same schemas, each implemented with openpop's own
functions as a ``CompositeImplicitAutograd`` kernel: autograd and ``torch.compile`` see the
ordinary torch operations they are made of.

PopTorch's internal operators (``begin_ipu_block``, ``start_for_loop``, ``custom_operation``,
``call_cpu_op``...) are not registered: PopTorch's Python API emitted them while tracing, and
openpop's API does not trace. Importing ``poptorch`` imports this module.
"""
import torch

from . import errors
from .ops import (
    Attribute,
    NameScope,
    dynamic_slice,
    dynamic_update,
    ipu_print_tensor,
    nop,
    recomputationCheckpoint,
    set_available_memory,
)
from .runtime.losses import identity_loss

# ``internal_cast``'s type names: PopART's (ONNX's) data type names.
CAST_TYPES = {
    "FLOAT": torch.float32, "FLOAT32": torch.float32, "FLOAT16": torch.float16, "HALF": torch.float16,
    "BFLOAT16": torch.bfloat16, "DOUBLE": torch.float64, "FLOAT64": torch.float64,
    "INT8": torch.int8, "INT16": torch.int16, "INT32": torch.int32, "INT64": torch.int64,
    "UINT8": torch.uint8, "BOOL": torch.bool,
}
# PopTorch's ``ReductionType`` numbering, as ``identity_loss`` takes it in the dispatcher.
_LOSS_REDUCTIONS = {0: "sum", 1: "mean", 2: "none"}
_FLOAT_FORMATS = {0: "auto", 1: "fixed", 2: "scientific", 3: "none"}


def internal_cast(tensor: torch.Tensor, dtype: str) -> torch.Tensor:
    """Cast ``tensor`` to the PopART type named ``dtype`` (``"FLOAT"``, ``"FLOAT16"``, ...)."""
    target = CAST_TYPES.get(str(dtype).upper())
    if target is None:
        raise ValueError(errors.INTERNAL_CAST_TYPE.format(dtype=dtype, known=", ".join(CAST_TYPES)))
    return tensor.to(target)


def _push_name_scope(name: str) -> None:
    NameScope._active.append(name)


def _pop_name_scope() -> None:
    if NameScope._active:
        NameScope._active.pop()


def _set_attribute(attribute: str, key: str, value: str) -> None:
    Attribute._active.append({attribute: {key: value}})


def _clear_attribute(attribute: str, key: str) -> None:
    for i in range(len(Attribute._active) - 1, -1, -1):
        if key in Attribute._active[i].get(attribute, {}):
            del Attribute._active[i]
            return


def _no_effect(*_args) -> None:
    """Memory and planning hints of the IPU's compiler: nothing to do on CPUs and GPUs."""


def _identity(tensor: torch.Tensor, *_hints) -> torch.Tensor:
    return tensor


def _print_tensor(tensor, title, print_gradient, summarize_threshold, edge_items, max_line_width, digits,
                  float_format, separator, open_bracket, close_bracket):
    return ipu_print_tensor(tensor, title, bool(print_gradient), summarize_threshold, edge_items, max_line_width,
                            digits, _FLOAT_FORMATS.get(float_format, "auto"), separator, open_bracket,
                            close_bracket)


def _identity_loss(x: torch.Tensor, reduction: int) -> torch.Tensor:
    if reduction not in _LOSS_REDUCTIONS:
        raise ValueError(errors.IDENTITY_LOSS_REDUCTION_CODE.format(reduction=reduction))
    return identity_loss(x, _LOSS_REDUCTIONS[reduction])


#: schema -> implementation, as PopTorch declared the schemas.
OPERATORS = {
    "push_name_scope(str name) -> ()": _push_name_scope,
    "pop_name_scope() -> ()": _pop_name_scope,
    "set_attribute(str attribute, str key, str value) -> ()": _set_attribute,
    "clear_attribute(str attribute, str key) -> ()": _clear_attribute,
    "optimizer_group(int group, Tensor[] inputs) -> ()": _no_effect,
    "begin_multi_conv() -> ()": _no_effect,
    "end_multi_conv(float[]? available_memory_proportions, int[]? partials_types, int? plan_type, "
    "int? per_conv_reserved_tiles, float? cycle_back_off, int[]? enableConvDithering) -> ()": _no_effect,
    "ipu_print_tensor(Tensor self, str title, int print_gradient, int summarize_threshold, int edge_items, "
    "int max_line_width, int digits, int float_format, str separator, str open_bracket, str close_bracket) "
    "-> Tensor": _print_tensor,
    "nop(Tensor self) -> Tensor": nop,
    "set_matmul_serialization(Tensor matmul, str mode, int factor, bool keep_precision) -> Tensor": _identity,
    "set_overlap_for_input(Tensor t, str mode) -> Tensor": _identity,
    "set_overlap_for_output(Tensor t, str mode) -> Tensor": _identity,
    "recomputation_checkpoint(Tensor self) -> Tensor": recomputationCheckpoint,
    "set_available_memory(Tensor t, float mem) -> Tensor": set_available_memory,
    "dynamic_slice(Tensor self, int dim, Tensor start, int size, int step) -> Tensor": dynamic_slice,
    "dynamic_update(Tensor self, Tensor src, int dim, Tensor start, int size) -> Tensor": dynamic_update,
    "identity_loss(Tensor x, int reduction) -> Tensor": _identity_loss,
    "internal_cast(Tensor self, str dtype) -> Tensor": internal_cast,
}


def _register() -> torch.library.Library:
    library = torch.library.Library("poptorch", "DEF")
    for schema, implementation in OPERATORS.items():
        name = schema.split("(", 1)[0]
        library.define(schema)
        library.impl(name, implementation, "CompositeImplicitAutograd")
    return library


_LIBRARY = _register()
