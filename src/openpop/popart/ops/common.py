"""Helpers shared by the op families."""
from collections.abc import Sequence

import torch

from .. import messages
from ..errors import popart_exception

# ONNX TensorProto data type -> torch dtype
ONNX_TO_TORCH = {1: torch.float32, 2: torch.uint8, 3: torch.int8, 4: torch.uint16, 5: torch.int16, 6: torch.int32,
                 7: torch.int64, 9: torch.bool, 10: torch.float16, 11: torch.float64, 12: torch.uint32,
                 13: torch.uint64, 16: torch.bfloat16}


def ints(t) -> list[int]:
    """A 1-D int tensor (a shape, axes...) as a list of Python ints."""
    if t is None:
        return []
    if t.device.type == "meta":
        raise popart_exception(messages.SHAPE_INPUT_NOT_CONSTANT)
    return [int(v) for v in t.reshape(-1).tolist()]


def norm_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def norm_axes(axes: Sequence[int], rank: int) -> list[int]:
    return [norm_axis(int(a), rank) for a in axes]


def fail(ctx, message: str):
    """An op refusing its inputs or attributes (PopART's error at op creation): shape inference passes it on."""
    error = popart_exception(messages.OP_FAILED.format(op_type=ctx.op_type, node_name=ctx.node_name, message=message))
    error.op_refused = True
    raise error


def int_index(t: torch.Tensor) -> torch.Tensor:
    return t.long() if t.dtype != torch.int64 else t
