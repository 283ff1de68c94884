"""Shape and data-movement ops: reshape, transpose, slice, gather, concat, split, squeeze/unsqueeze,
expand, pad, tile, flatten, shape, constants, range, one-hot, scatter, and PopART's dynamic
slicing ops. Shape-like inputs (Reshape's shape, Slice's starts, ...) must be constants or
computed from shapes."""
import math

import numpy as np
import torch
import torch.nn.functional as F
from onnx import numpy_helper

from .. import messages
from .common import ONNX_TO_TORCH, fail, int_index, ints, norm_axes, norm_axis
from .registry import GRAPHCORE_DOMAIN, register


@register("Reshape", non_differentiable_inputs=(1,))
def reshape(ctx, inputs, attrs):
    x, shape = inputs[0], ints(inputs[1])
    if not attrs.get("allowzero", 0):
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    if -1 not in shape and math.prod(shape) != x.numel():
        fail(ctx, messages.RESHAPE_SIZE_MISMATCH.format(shape=list(x.shape), new_shape=shape))
    return x.reshape(shape)


@register("Transpose")
def transpose(ctx, inputs, attrs):
    x = inputs[0]
    perm = attrs.get("perm") or list(reversed(range(x.dim())))
    return x.permute(*perm)


@register("Flatten")
def flatten(ctx, inputs, attrs):
    x = inputs[0]
    axis = norm_axis(attrs.get("axis", 1), x.dim())
    return x.reshape(math.prod(x.shape[:axis]), -1)


@register("Slice", non_differentiable_inputs=(1, 2, 3, 4))
def slice_(ctx, inputs, attrs):
    x = inputs[0]
    if ctx.opset < 10:
        starts, ends = attrs["starts"], attrs["ends"]
        axes = attrs.get("axes") or list(range(len(starts)))
        steps = [1] * len(starts)
    else:
        starts, ends = ints(inputs[1]), ints(inputs[2])
        axes = ints(inputs[3]) if len(inputs) > 3 and inputs[3] is not None else list(range(len(starts)))
        steps = ints(inputs[4]) if len(inputs) > 4 and inputs[4] is not None else [1] * len(starts)
    index = [slice(None)] * x.dim()
    flips = []
    for start, end, axis, step in zip(starts, ends, norm_axes(axes, x.dim()), steps):
        if step == 0:
            fail(ctx, messages.SLICE_STEP_ZERO)
        begin, stop, stride = slice(start, end, step).indices(x.shape[axis])
        if stride > 0:
            index[axis] = slice(begin, max(begin, stop), stride)
        else:
            flips.append((axis, list(range(begin, stop, stride))))
    out = x[tuple(index)]
    for axis, positions in flips:
        out = out.index_select(axis, torch.tensor(positions, dtype=torch.long, device=x.device))
    return out


@register("Gather", positional=("axis",), non_differentiable_inputs=(1,))
def gather(ctx, inputs, attrs):
    x, idx = inputs
    axis = norm_axis(attrs.get("axis", 0), x.dim())
    idx = int_index(idx)
    idx = torch.where(idx < 0, idx + x.shape[axis], idx)
    out = x.index_select(axis, idx.reshape(-1))
    return out.reshape(*x.shape[:axis], *idx.shape, *x.shape[axis + 1:])


@register("GatherElements", non_differentiable_inputs=(1,))
def gather_elements(ctx, inputs, attrs):
    x, idx = inputs
    axis = norm_axis(attrs.get("axis", 0), x.dim())
    idx = int_index(idx)
    return torch.gather(x, axis, torch.where(idx < 0, idx + x.shape[axis], idx))


@register("ScatterElements", non_differentiable_inputs=(1,))
def scatter_elements(ctx, inputs, attrs):
    x, idx, updates = inputs
    axis = norm_axis(attrs.get("axis", 0), x.dim())
    idx = int_index(idx)
    return torch.scatter(x, axis, torch.where(idx < 0, idx + x.shape[axis], idx), updates)


register("Scatter", non_differentiable_inputs=(1,))(scatter_elements)


@register("Concat", positional=("axis",))
def concat(ctx, inputs, attrs):
    axis = norm_axis(attrs["axis"], inputs[0].dim())
    return torch.cat(inputs, dim=axis)


@register("Split", positional=("num_outputs", "axis", "split"), non_differentiable_inputs=(1,))
def split(ctx, inputs, attrs):
    x = inputs[0]
    axis = norm_axis(attrs.get("axis", 0), x.dim())
    if ctx.opset >= 13:
        sizes = ints(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else None
    else:
        sizes = attrs.get("split") or None
    count = len(ctx.node.output) if ctx.node is not None else len(sizes or [1])
    if sizes is None:
        if x.shape[axis] % count:
            fail(ctx, messages.SPLIT_NOT_EVEN.format(axis_size=x.shape[axis], count=count))
        sizes = [x.shape[axis] // count] * count
    if sum(sizes) != x.shape[axis]:
        fail(ctx, messages.SPLIT_SIZES_MISMATCH.format(sizes=sizes, axis_size=x.shape[axis]))
    return list(torch.split(x, sizes, dim=axis))


def _axes_input_or_attr(ctx, inputs, attrs):
    if ctx.opset >= 13:
        return ints(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else None
    return attrs.get("axes")


@register("Squeeze", positional=("axes",), non_differentiable_inputs=(1,))
def squeeze(ctx, inputs, attrs):
    x = inputs[0]
    axes = _axes_input_or_attr(ctx, inputs, attrs)
    if not axes:
        return x.reshape([d for d in x.shape if d != 1])
    axes = norm_axes(axes, x.dim())
    for a in axes:
        if x.shape[a] != 1:
            fail(ctx, messages.SQUEEZE_NON_UNIT_AXIS.format(axis=a, axis_size=x.shape[a]))
    return x.reshape([d for i, d in enumerate(x.shape) if i not in axes])


@register("Unsqueeze", positional=("axes",), non_differentiable_inputs=(1,))
def unsqueeze(ctx, inputs, attrs):
    x = inputs[0]
    axes = _axes_input_or_attr(ctx, inputs, attrs)
    rank = x.dim() + len(axes)
    axes = sorted(norm_axes(axes, rank))
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return x.reshape(shape)


@register("Expand", non_differentiable_inputs=(1,))
def expand(ctx, inputs, attrs):
    x, shape = inputs[0], ints(inputs[1])
    target = torch.broadcast_shapes(tuple(x.shape), tuple(shape))  # ONNX: bidirectional broadcast
    return x.expand(target)


@register("Tile", non_differentiable_inputs=(1,))
def tile(ctx, inputs, attrs):
    return inputs[0].repeat(*ints(inputs[1]))


@register("Pad", non_differentiable_inputs=(1, 2))
def pad(ctx, inputs, attrs):
    x = inputs[0]
    mode = attrs.get("mode", "constant")
    if ctx.opset < 11:
        pads, value = attrs["pads"], attrs.get("value", 0.0)
    else:
        pads = ints(inputs[1])
        value = float(inputs[2].reshape(())) if len(inputs) > 2 and inputs[2] is not None else 0.0
    rank = x.dim()
    begins, ends = pads[:rank], pads[rank:]
    torch_pads = []
    for b, e in zip(reversed(begins), reversed(ends)):
        torch_pads += [b, e]
    if mode == "constant":
        return F.pad(x, torch_pads, value=value)
    padded_dims = [i for i in range(rank) if begins[i] or ends[i]]
    torch_mode = {"reflect": "reflect", "edge": "replicate"}.get(mode)
    if torch_mode is None:
        fail(ctx, messages.UNSUPPORTED_PAD_MODE.format(mode=mode))
    if not padded_dims:
        return x
    first = min(padded_dims)
    trailing = rank - first
    if trailing > 3:
        fail(ctx, messages.PAD_TOO_MANY_DIMENSIONS.format(mode=mode))
    lead = x.shape[:first]
    y = x.reshape(1, -1, *x.shape[first:]) if trailing < rank - 1 or first < 2 else x
    y = F.pad(y, torch_pads[:2 * trailing], mode=torch_mode)
    return y.reshape(*lead, *y.shape[-trailing:])


@register("Shape", differentiable=False)
def shape_(ctx, inputs, attrs):
    return torch.tensor(list(inputs[0].shape), dtype=torch.int64)


@register("Size", differentiable=False)
def size_(ctx, inputs, attrs):
    return torch.tensor(inputs[0].numel(), dtype=torch.int64)


@register("Constant", differentiable=False)
def constant(ctx, inputs, attrs):
    if "value" in attrs:
        return torch.from_numpy(numpy_helper.to_array(attrs["value"]).copy())
    for key, dtype in (("value_float", torch.float32), ("value_floats", torch.float32),
                       ("value_int", torch.int64), ("value_ints", torch.int64)):
        if key in attrs:
            return torch.tensor(attrs[key], dtype=dtype)
    fail(ctx, messages.CONSTANT_WITHOUT_VALUE)


@register("ConstantOfShape", differentiable=False, non_differentiable_inputs=(0,))
def constant_of_shape(ctx, inputs, attrs):
    value = attrs.get("value")
    fill = numpy_helper.to_array(value).reshape(-1) if value is not None else np.zeros(1, np.float32)
    fill_t = torch.from_numpy(fill.copy())
    return torch.full(ints(inputs[0]), fill_t[0].item(), dtype=fill_t.dtype)


@register("Range", differentiable=False)
def range_(ctx, inputs, attrs):
    start, limit, delta = (t.reshape(()) for t in inputs)
    return torch.arange(start.item(), limit.item(), delta.item(), dtype=inputs[0].dtype)


@register("OneHot", non_differentiable_inputs=(0, 1))
def one_hot(ctx, inputs, attrs):
    idx, depth, values = inputs
    depth = int(depth.reshape(-1)[0].item())
    idx = int_index(idx)
    idx = torch.where(idx < 0, idx + depth, idx)
    hot = F.one_hot(idx.clamp(0, depth - 1), depth) * ((idx >= 0) & (idx < depth)).unsqueeze(-1)
    axis = attrs.get("axis", -1)
    out = values[0] + (values[1] - values[0]) * hot.to(values.dtype)
    return out.movedim(-1, norm_axis(axis, out.dim()))


@register("DepthToSpace")
def depth_to_space(ctx, inputs, attrs):
    x = inputs[0]
    b = attrs["blocksize"]
    n, c, h, w = x.shape
    if attrs.get("mode", "DCR") == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (b * b), h * b, w * b)


@register("SpaceToDepth")
def space_to_depth(ctx, inputs, attrs):
    x = inputs[0]
    b = attrs["blocksize"]
    n, c, h, w = x.shape
    y = x.reshape(n, c, h // b, b, w // b, b).permute(0, 3, 5, 1, 2, 4)
    return y.reshape(n, c * b * b, h // b, w // b)


# ---------------------------------------------------------------- ai.graphcore
@register("Subsample", GRAPHCORE_DOMAIN, positional=("strides",))
def subsample(ctx, inputs, attrs):
    x = inputs[0]
    strides = attrs["strides"]
    return x[tuple(slice(None, None, int(s)) for s in strides)]


@register("Reverse", GRAPHCORE_DOMAIN, positional=("dimensions",))
def reverse(ctx, inputs, attrs):
    x = inputs[0]
    return torch.flip(x, norm_axes(attrs.get("dimensions", []), x.dim()))


@register("Init", GRAPHCORE_DOMAIN, positional=("shape", "data_type", "init_type", "batch_axis"), differentiable=False)
def init(ctx, inputs, attrs):
    """A zero (``InitType.Zero``) or uninitialised (here: also zero) tensor."""
    data_type = attrs.get("data_type", 1)
    dtype = ONNX_TO_TORCH.get(int(data_type), torch.float32) if not isinstance(data_type, str) else \
        _by_name(data_type)
    return torch.zeros(list(attrs["shape"]), dtype=dtype)


def _by_name(name):
    from ..tensorinfo import torch_dtype
    return torch_dtype(name)


def _dynamic_indices(x, offset, attrs):
    """(axis, index tensor) per sliced axis: ``size`` positions from the offset, clamped into range as
    PopART clamps them. The offset is data (a stream input, a loop counter): tensor arithmetic only, so
    shapes are known without it (meta tensors) and programs compile without reading it on the host."""
    axes = norm_axes(attrs["axes"], x.dim())
    sizes = attrs["sizes"]
    starts = offset.reshape(-1).to(dtype=torch.int64)
    starts = starts.to(x.device) if starts.device.type != "meta" else starts
    result = []
    for k, (axis, size) in enumerate(zip(axes, sizes)):
        start = starts[k].clamp(0, max(x.shape[axis] - size, 0))
        result.append((axis, start + torch.arange(size, device=start.device)))
    return result


def _on_meta_if_any(*tensors):
    """Shape inference gives meta tensors for data and real ones for constants: all on meta then."""
    if any(t.device.type == "meta" for t in tensors):
        return [t.to("meta") for t in tensors]
    return list(tensors)


def _take(x, indices):
    for axis, index in indices:
        x = x.index_select(axis, index)
    return x


def _put(x, indices, region):
    """``x`` with the block at ``indices`` replaced by ``region`` (out of place, differentiable)."""
    if not indices:  # (an update may leave out the block's leading 1s)
        return region.to(device=x.device, dtype=x.dtype).reshape(x.shape)
    (axis, index), rest = indices[0], indices[1:]
    inner = _put(x.index_select(axis, index), rest, region)
    return x.index_copy(axis, index, inner)


@register("DynamicSlice", GRAPHCORE_DOMAIN, positional=("axes", "sizes", "noOverlap"), non_differentiable_inputs=(1,))
def dynamic_slice(ctx, inputs, attrs):
    x, offset = _on_meta_if_any(*inputs[:2])
    return _take(x, _dynamic_indices(x, offset, attrs))


@register("DynamicUpdate", GRAPHCORE_DOMAIN, positional=("axes", "sizes", "noOverlap"),
          non_differentiable_inputs=(1,))
def dynamic_update(ctx, inputs, attrs):
    x, offset, update = _on_meta_if_any(*inputs)
    return _put(x, _dynamic_indices(x, offset, attrs), update)


@register("DynamicZero", GRAPHCORE_DOMAIN, positional=("axes", "sizes"), non_differentiable_inputs=(1,))
def dynamic_zero(ctx, inputs, attrs):
    x, offset = _on_meta_if_any(*inputs[:2])
    indices = _dynamic_indices(x, offset, attrs)
    return _put(x, indices, torch.zeros_like(_take(x, indices)))


@register("DynamicAdd", GRAPHCORE_DOMAIN, positional=("axes", "sizes"), non_differentiable_inputs=(1,))
def dynamic_add(ctx, inputs, attrs):
    x, offset, update = _on_meta_if_any(*inputs)
    indices = _dynamic_indices(x, offset, attrs)
    return _put(x, indices, _take(x, indices) + update)
