"""Reductions (axes as an attribute before opset 13, ReduceSum's as an input from 13), arg-max/min,
cumulative sum and top-k."""
import torch

from .. import messages
from .common import fail, ints, norm_axes, norm_axis
from .registry import register


def _axes(ctx, inputs, attrs, op_type):
    if ctx.opset >= 13 and op_type == "ReduceSum":
        return ints(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else None
    axes = attrs.get("axes")
    # PopART: axes given, even empty, are the axes reduced (none: the identity); absent: all of them.
    return None if axes is None else list(axes)


def _reduction(op_type, fn):
    @register(op_type, non_differentiable_inputs=(1,))
    def impl(ctx, inputs, attrs):
        x = inputs[0]
        axes = _axes(ctx, inputs, attrs, op_type)
        keep = bool(attrs.get("keepdims", 1))
        if axes is None:
            if attrs.get("noop_with_empty_axes", 0):
                return x
            axes = list(range(x.dim()))
        axes = norm_axes(axes, x.dim())
        if not axes:
            return x
        return fn(x, axes, keep)
    return impl


def _prod(x, axes, keep):
    for a in sorted(axes, reverse=True):
        x = torch.prod(x, dim=a, keepdim=keep)
    return x


_reduction("ReduceSum", lambda x, a, k: torch.sum(x, dim=a, keepdim=k))
_reduction("ReduceMean", lambda x, a, k: torch.mean(x, dim=a, keepdim=k))
_reduction("ReduceMax", lambda x, a, k: torch.amax(x, dim=a, keepdim=k))
_reduction("ReduceMin", lambda x, a, k: torch.amin(x, dim=a, keepdim=k))
_reduction("ReduceProd", _prod)
_reduction("ReduceL1", lambda x, a, k: torch.sum(torch.abs(x), dim=a, keepdim=k))
_reduction("ReduceL2", lambda x, a, k: torch.sqrt(torch.sum(x * x, dim=a, keepdim=k)))
_reduction("ReduceLogSum", lambda x, a, k: torch.log(torch.sum(x, dim=a, keepdim=k)))
_reduction("ReduceLogSumExp", lambda x, a, k: torch.logsumexp(x, dim=a, keepdim=k))
_reduction("ReduceSumSquare", lambda x, a, k: torch.sum(x * x, dim=a, keepdim=k))


def _arg(op_type, fn):
    @register(op_type, differentiable=False)
    def impl(ctx, inputs, attrs):
        x = inputs[0]
        axis = norm_axis(attrs.get("axis", 0), x.dim())
        keep = bool(attrs.get("keepdims", 1))
        if attrs.get("select_last_index", 0):
            flipped = torch.flip(x, [axis])
            idx = x.shape[axis] - 1 - fn(flipped, dim=axis, keepdim=keep)
        else:
            idx = fn(x, dim=axis, keepdim=keep)
        return idx.to(torch.int64)
    return impl


_arg("ArgMax", torch.argmax)
_arg("ArgMin", torch.argmin)


@register("CumSum", non_differentiable_inputs=(1,))
def cumsum(ctx, inputs, attrs):
    x, axis = inputs
    axis = norm_axis(ints(axis)[0], x.dim())
    if attrs.get("reverse", 0):
        x = torch.flip(x, [axis])
    out = torch.cumsum(x, dim=axis)
    if attrs.get("exclusive", 0):
        out = out - x
    if attrs.get("reverse", 0):
        out = torch.flip(out, [axis])
    return out.to(inputs[0].dtype)


@register("TopK", positional=("axis",), non_differentiable_inputs=(1,))
def topk(ctx, inputs, attrs):
    x = inputs[0]
    if ctx.opset < 10:
        k = attrs["k"]
    else:
        k = ints(inputs[1])[0]
    axis = norm_axis(attrs.get("axis", -1), x.dim())
    largest = bool(attrs.get("largest", 1))
    if k > x.shape[axis]:
        fail(ctx, messages.TOPK_K_TOO_LARGE.format(k=k, axis_size=x.shape[axis]))
    values, indices = torch.topk(x, k, dim=axis, largest=largest, sorted=True)
    return [values, indices.to(torch.int64)]


