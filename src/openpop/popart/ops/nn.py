"""Convolutions, pooling, normalisations, dropout and resizing (NCHW, 1-3 spatial dims)."""
import math

import torch
import torch.nn.functional as F

from .. import messages
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
    x = inputs[0]
    if ctx.opset == 10:
        scales = inputs[1]
        sizes = None
    else:
        scales = inputs[2] if len(inputs) > 2 else None
        sizes = inputs[3] if len(inputs) > 3 else None
    return _resize(ctx, x, scales, sizes, attrs)


@register("Upsample", non_differentiable_inputs=(1,))
def upsample(ctx, inputs, attrs):
    return _resize(ctx, inputs[0], inputs[1], None, attrs)


def _resize(ctx, x, scales, sizes, attrs):
    mode = attrs.get("mode", "nearest")
    spatial = x.dim() - 2
    if sizes is not None and sizes.numel():
        out = ints(sizes)[2:]
    else:
        factors = [float(v) for v in scales.reshape(-1).tolist()]
        if factors[:2] != [1.0, 1.0]:
            fail(ctx, messages.RESIZE_NON_SPATIAL)
        out = [math.floor(s * f) for s, f in zip(x.shape[2:], factors[2:])]
    if mode == "nearest":
        coord = attrs.get("coordinate_transformation_mode", "half_pixel" if ctx.opset >= 11 else "asymmetric")
        nearest = attrs.get("nearest_mode", "round_prefer_floor")
        if coord == "asymmetric" and nearest in ("floor", "round_prefer_floor") and ctx.opset < 11:
            return F.interpolate(x, size=out, mode="nearest")
        if coord == "asymmetric" and nearest == "floor":
            return F.interpolate(x, size=out, mode="nearest")
        if coord == "half_pixel" and nearest in ("round_prefer_ceil", "round_prefer_floor"):
            return F.interpolate(x, size=out, mode="nearest-exact")
        return F.interpolate(x, size=out, mode="nearest")
    if mode == "linear":
        torch_mode = {1: "linear", 2: "bilinear", 3: "trilinear"}[spatial]
        align = attrs.get("coordinate_transformation_mode", "half_pixel") == "align_corners"
        return F.interpolate(x, size=out, mode=torch_mode, align_corners=align)
    if mode == "cubic":
        align = attrs.get("coordinate_transformation_mode", "half_pixel") == "align_corners"
        return F.interpolate(x, size=out, mode="bicubic", align_corners=align)
    fail(ctx, messages.UNSUPPORTED_RESIZE_MODE.format(mode=mode))
