"""Convolutions, pooling, normalisations, dropout and resizing (NCHW, 1-3 spatial dims)."""
import math

import numpy as np
import torch
import torch.nn.functional as F

from .. import messages
from ..errors import popart_exception
from .common import fail, ints
from .registry import GRAPHCORE_DOMAIN, register

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _pads(ctx, attrs, spatial, in_sizes, kernel, strides, dilations):
    """ONNX ``pads`` ([begins..., ends...]) honouring ``auto_pad``."""
    auto = attrs.get("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begins, ends = [], []
        for size, k, s, d in zip(in_sizes, kernel, strides, dilations):
            out = math.ceil(size / s)
            total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
            small, big = total // 2, total - total // 2
            begins.append(small if auto == "SAME_UPPER" else big)
            ends.append(big if auto == "SAME_UPPER" else small)
        return begins + ends
    if auto == "VALID":
        return [0] * (2 * spatial)
    pads = attrs.get("pads") or [0] * (2 * spatial)
    if len(pads) != 2 * spatial:
        fail(ctx, messages.PADS_COUNT.format(n_pads=len(pads), expected=2 * spatial))
    return list(pads)


def _apply_pads(x, pads, spatial, value=0.0):
    """Pad ``x`` explicitly; returns (x, symmetric padding for the torch op)."""
    begins, ends = pads[:spatial], pads[spatial:]
    if begins == ends:
        return x, begins
    torch_pads = []
    for b, e in zip(reversed(begins), reversed(ends)):
        torch_pads += [b, e]
    return F.pad(x, torch_pads, value=value), [0] * spatial


@register("Conv")
def conv(ctx, inputs, attrs):
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    spatial = x.dim() - 2
    if spatial not in _CONV:
        fail(ctx, messages.SPATIAL_RANK_UNSUPPORTED.format(spatial=spatial))
    kernel = attrs.get("kernel_shape") or list(w.shape[2:])
    strides = attrs.get("strides") or [1] * spatial
    dilations = attrs.get("dilations") or [1] * spatial
    pads = _pads(ctx, attrs, spatial, list(x.shape[2:]), kernel, strides, dilations)
    x, padding = _apply_pads(x, pads, spatial)
    return _CONV[spatial](x, w, b, strides, padding, dilations, attrs.get("group", 1))


@register("ConvTranspose")
def conv_transpose(ctx, inputs, attrs):
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    spatial = x.dim() - 2
    strides = attrs.get("strides") or [1] * spatial
    dilations = attrs.get("dilations") or [1] * spatial
    pads = attrs.get("pads") or [0] * (2 * spatial)
    output_padding = attrs.get("output_padding") or [0] * spatial
    if pads[:spatial] != pads[spatial:]:
        fail(ctx, messages.CONV_TRANSPOSE_ASYMMETRIC_PADS)
    return _CONV_T[spatial](x, w, b, strides, pads[:spatial], output_padding, attrs.get("group", 1), dilations)


@register("MaxPool", positional=("num_outputs",))
def max_pool(ctx, inputs, attrs):
    x = inputs[0]
    spatial = x.dim() - 2
    kernel = attrs["kernel_shape"]
    strides = attrs.get("strides") or [1] * spatial
    dilations = attrs.get("dilations") or [1] * spatial
    pads = _pads(ctx, attrs, spatial, list(x.shape[2:]), kernel, strides, dilations)
    x, padding = _apply_pads(x, pads, spatial, value=float("-inf"))
    out, idx = _MAX_POOL[spatial](x, kernel, strides, padding, dilations, ceil_mode=bool(attrs.get("ceil_mode", 0)),
                                  return_indices=True)
    plane = math.prod(x.shape[2:])
    # ONNX indices are flat over the whole (N, C, spatial...) tensor; torch's are per plane.
    offsets = torch.arange(x.shape[0] * x.shape[1], device=x.device).reshape(x.shape[0], x.shape[1],
                                                                           *([1] * spatial)) * plane
    return [out, idx + offsets]


@register("AveragePool")
def average_pool(ctx, inputs, attrs):
    x = inputs[0]
    spatial = x.dim() - 2
    kernel = attrs["kernel_shape"]
    strides = attrs.get("strides") or [1] * spatial
    pads = _pads(ctx, attrs, spatial, list(x.shape[2:]), kernel, strides, [1] * spatial)
    include_pad = bool(attrs.get("count_include_pad", 0))
    x2, padding = _apply_pads(x, pads, spatial)
    if padding != [0] * spatial or x2 is x:
        return _AVG_POOL[spatial](x2, kernel, strides, padding, ceil_mode=bool(attrs.get("ceil_mode", 0)),
                                  count_include_pad=include_pad)
    if include_pad:
        return _AVG_POOL[spatial](x2, kernel, strides, 0, ceil_mode=bool(attrs.get("ceil_mode", 0)))
    ones = F.pad(torch.ones_like(x[:1, :1]), _torch_pads(pads, spatial))
    summed = _AVG_POOL[spatial](x2, kernel, strides, 0, ceil_mode=bool(attrs.get("ceil_mode", 0))) * math.prod(kernel)
    counts = _AVG_POOL[spatial](ones, kernel, strides, 0, ceil_mode=bool(attrs.get("ceil_mode", 0))) * math.prod(kernel)
    return summed / counts


def _torch_pads(pads, spatial):
    out = []
    for b, e in zip(reversed(pads[:spatial]), reversed(pads[spatial:])):
        out += [b, e]
    return out


@register("GlobalAveragePool")
def global_average_pool(ctx, inputs, attrs):
    x = inputs[0]
    return x.mean(dim=tuple(range(2, x.dim())), keepdim=True)


@register("GlobalMaxPool")
def global_max_pool(ctx, inputs, attrs):
    x = inputs[0]
    return x.amax(dim=tuple(range(2, x.dim())), keepdim=True)


@register("BatchNormalization", positional=("num_outputs", "epsilon", "momentum"), updated_inputs=(3, 4))
def batch_norm(ctx, inputs, attrs):
    """Inference: normalise with the running statistics. Training (PopART: 5 outputs): batch
    statistics, and the running mean/variance initializers are updated in place."""
    x, scale, bias, mean, var = inputs[:5]
    eps = attrs.get("epsilon", 1e-5)
    momentum = attrs.get("momentum", 0.9)
    outputs = len(ctx.node.output) if ctx.node is not None else 1
    if ctx.training and outputs > 1 and not attrs.get("training_mode_off", False):
        dims = [0] + list(range(2, x.dim()))
        batch_mean = x.mean(dim=dims)
        batch_var = x.var(dim=dims, unbiased=False)
        shape = [1, -1] + [1] * (x.dim() - 2)
        y = (x - batch_mean.reshape(shape)) / torch.sqrt(batch_var.reshape(shape) + eps) * scale.reshape(shape) \
            + bias.reshape(shape)
        with torch.no_grad():
            new_mean = mean * momentum + batch_mean.detach() * (1 - momentum)
            new_var = var * momentum + batch_var.detach() * (1 - momentum)
            if x.device.type != "meta" and not getattr(ctx.graph, "recomputing", False):
                mean.copy_(new_mean)
                var.copy_(new_var)
        return [y, new_mean, new_var, batch_mean, batch_var][:outputs]
    y = F.batch_norm(x, mean, var, scale, bias, False, 0.0, eps)
    return [y] + [mean, var, mean, var][:outputs - 1]


@register("InstanceNormalization")
def instance_norm(ctx, inputs, attrs):
    x, scale, bias = inputs
    return F.instance_norm(x, weight=scale, bias=bias, eps=attrs.get("epsilon", 1e-5))


@register("LRN")
def lrn(ctx, inputs, attrs):
    return F.local_response_norm(inputs[0], attrs["size"], attrs.get("alpha", 1e-4), attrs.get("beta", 0.75),
                                 attrs.get("bias", 1.0))


@register("GroupNormalization", GRAPHCORE_DOMAIN, positional=("num_groups", "epsilon"))
def group_norm(ctx, inputs, attrs):
    """PopART's groupnormalization: outputs (y, mean, inverse standard deviation), per (sample, group)."""
    x, scale, bias = inputs
    groups = int(attrs["num_groups"])
    eps = attrs.get("epsilon", 1e-5)
    n = x.shape[0]
    grouped = x.reshape(n, groups, -1)
    mean = grouped.mean(-1)
    var = grouped.var(-1, unbiased=False)
    inv_std = torch.rsqrt(var + eps)
    y = ((grouped - mean.unsqueeze(-1)) * inv_std.unsqueeze(-1)).reshape(x.shape)
    shape = [1, -1] + [1] * (x.dim() - 2)
    y = y * scale.reshape(shape) + bias.reshape(shape)
    return [y, mean.reshape(-1), inv_std.reshape(-1)]


@register("Dropout", positional=("num_outputs", "ratio"))
def dropout(ctx, inputs, attrs):
    x = inputs[0]
    ratio = attrs.get("ratio", 0.5)
    if ctx.opset >= 12 and len(inputs) > 1 and inputs[1] is not None:
        ratio = float(inputs[1])
    if ctx.training and ratio > 0:  # PopART: dropout is active in training sessions only
        mask = (torch.rand_like(x, dtype=torch.float32) >= ratio)
        y = x * mask.to(x.dtype) / (1 - ratio)
    else:
        mask = torch.ones_like(x, dtype=torch.bool)
        y = x
    return [y, mask]


@register("Resize", non_differentiable_inputs=(1, 2, 3))
def resize(ctx, inputs, attrs):
    """PopART's Resize: every dimension can be resized; opset 10 takes ``scales`` (input 1), 11 ``scales``
    or ``sizes`` (inputs 2, 3). Coordinates are ``half_pixel`` unless given, nearest rounding is PopART's
    ``pytorch`` mode in opset 10 and ``round_prefer_floor`` after."""
    x = inputs[0]
    if ctx.opset == 10:
        scales, sizes = inputs[1], None
    else:
        scales = inputs[2] if len(inputs) > 2 else None
        sizes = inputs[3] if len(inputs) > 3 else None
    if scales is not None and scales.numel() and sizes is not None and sizes.numel():
        raise popart_exception(messages.RESIZE_SCALES_AND_SIZES)
    if sizes is not None and sizes.numel():
        out = ints(sizes)
        factors = [np.float32(o) / np.float32(i) for o, i in zip(out, x.shape)]
    else:
        factors = [np.float32(v) for v in scales.reshape(-1).tolist()]
        out = [math.floor(np.float32(i) * f) for i, f in zip(x.shape, factors)]
    if len(factors) != x.dim():
        fail(ctx, messages.RESIZE_SCALES_RANK.format(scales=len(factors), rank=x.dim()))
    nearest = attrs.get("nearest_mode", "pytorch" if ctx.opset == 10 else "round_prefer_floor")
    return _resize(ctx, x, factors, out, attrs.get("mode", "nearest"), nearest,
                   attrs.get("coordinate_transformation_mode", "half_pixel"))


@register("Upsample", non_differentiable_inputs=(1,))
def upsample(ctx, inputs, attrs):
    """PopART turns Upsample into its Resize with the ``pytorch`` nearest mode and ``half_pixel``."""
    x = inputs[0]
    scales = attrs["scales"] if "scales" in attrs else inputs[1].reshape(-1).tolist()
    factors = [np.float32(v) for v in scales]
    out = [math.floor(np.float32(i) * f) for i, f in zip(x.shape, factors)]
    return _resize(ctx, x, factors, out, attrs.get("mode", "nearest"), "pytorch", "half_pixel")


def _coordinate(i, transform, scale, size, nearest=None):
    """PopART's source coordinate of output index ``i`` (float32, as its backend)."""
    i, scale = np.float32(i), np.float32(scale)
    if nearest == "pytorch":
        return i / scale
    if transform in ("half_pixel", "tf_half_pixel_for_nn"):
        shift = np.float32(0.0) if transform == "tf_half_pixel_for_nn" else np.float32(0.5)
        return (i + np.float32(0.5)) / scale - shift
    if transform == "pytorch_half_pixel":
        return (i + np.float32(0.5)) / scale - np.float32(0.5) if np.float32(size) * scale > 1 else np.float32(0)
    if transform == "asymmetric":
        return i / scale
    if transform == "align_corners":
        length = np.float32(size) * scale
        return np.float32(0) if length == 1 else i * np.float32(size - 1) / (length - np.float32(1))
    raise ValueError(transform)


def _round(x, nearest):
    """PopART's rounding of a coordinate: C's round (half away from zero) for round_prefer_ceil."""
    if nearest == "round_prefer_ceil":
        return math.floor(x + 0.5) if x >= 0 else -math.floor(-x + 0.5)
    if nearest == "round_prefer_floor":
        return math.floor(x) if x - math.floor(x) <= 0.5 else math.ceil(x)
    if nearest == "ceil":
        return math.ceil(x)
    return math.floor(x)  # floor, pytorch


def _nearest_1d(x, dim, scale, out, nearest, transform):
    size = x.shape[dim]
    rounded = round(float(scale))
    if (abs(rounded - float(scale)) <= 1e-5 and rounded >= 0 and nearest not in ("floor", "ceil")
            and transform == "half_pixel"):
        return torch.repeat_interleave(x, rounded, dim=dim)
    index = [min(max(_round(_coordinate(i, transform, scale, size, nearest), nearest), 0), size - 1)
             for i in range(out)]
    return torch.index_select(x, dim, torch.tensor(index, device=x.device))


def _cubic_coefficients(ratio, a=-0.75):
    r = float(ratio)
    return [((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
            ((a + 2) * r - (a + 3)) * r * r + 1,
            ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1,
            ((a * ((1 - r) + 1) - 5 * a) * ((1 - r) + 1) + 8 * a) * ((1 - r) + 1) - 4 * a]


def _resize(ctx, x, factors, out, mode, nearest, transform):
    """One dimension at a time, as PopART's backend: nearest gathers (or repeats for whole scales with
    half_pixel), linear mixes the floor and ceil neighbours, cubic four neighbours with A = -0.75
    (indices clamped to the input)."""
    if mode not in ("nearest", "linear", "cubic"):
        fail(ctx, messages.UNSUPPORTED_RESIZE_MODE.format(mode=mode))
    y = x
    for dim in range(x.dim()):
        scale, size = factors[dim], y.shape[dim]
        if (out[dim] == size) if (mode == "nearest" and nearest == "pytorch") else (scale == 1.0):
            continue
        if mode == "nearest":
            y = _nearest_1d(y, dim, scale, out[dim], nearest, transform)
            continue
        coords = [_coordinate(i, transform, scale, size) for i in range(out[dim])]
        if mode == "linear":
            lo = _nearest_1d(y, dim, scale, out[dim], "floor", transform)
            hi = _nearest_1d(y, dim, scale, out[dim], "ceil", transform)
            c = [float(max(v, 0.0) - math.floor(max(v, 0.0))) for v in coords]
            shape = [1] * y.dim()
            shape[dim] = out[dim]
            coeff = torch.tensor(c, dtype=y.dtype, device=y.device).reshape(shape)
            y = lo * (1 - coeff) + hi * coeff
            continue
        terms = []
        weights = [_cubic_coefficients(v - math.floor(v)) for v in coords]
        for k in range(4):
            index = [min(max(math.floor(v) - 1 + k, 0), size - 1) for v in coords]
            shape = [1] * y.dim()
            shape[dim] = out[dim]
            w = torch.tensor([wk[k] for wk in weights], dtype=y.dtype, device=y.device).reshape(shape)
            terms.append(torch.index_select(y, dim, torch.tensor(index, device=y.device)) * w)
        y = terms[0] + terms[1] + terms[2] + terms[3]
    return y
