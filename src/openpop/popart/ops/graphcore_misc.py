"""More of PopART's ai.graphcore ops: bucketize, sort, reducemedian, grouped gather, scatterreduce,
sequenceslice, incrementmod, rounding, bitwise ops, scaledadd, geluerf, normalize_image, shaped
dropout, the graphcore BatchNormalization and DepthToSpace, copyvarupdate and abort. Attribute names
are those PopART's builder writes; index outputs are INT32, as PopART's."""
import torch
import torch.nn.functional as F

from .. import messages
from .common import fail, int_index, norm_axes, norm_axis
from .registry import GRAPHCORE_DOMAIN, register


@register("Bucketize", GRAPHCORE_DOMAIN, differentiable=False)
def bucketize(ctx, inputs, attrs):
    x, boundaries = inputs
    if boundaries.dim() != 1:
        fail(ctx, messages.BUCKETIZE_BOUNDARIES_RANK.format(rank=boundaries.dim()))
    return torch.bucketize(x, boundaries, out_int32=True, right=bool(attrs.get("right", 0)))


@register("Sort", GRAPHCORE_DOMAIN, non_differentiable_inputs=())
def sort(ctx, inputs, attrs):
    values, indices = torch.sort(inputs[0], dim=int(attrs.get("axis", -1)),
                                 descending=bool(attrs.get("descending", 0)), stable=bool(attrs.get("stable", 0)))
    return [values, indices.to(torch.int32)]


@register("ReduceMedian", GRAPHCORE_DOMAIN)
def reduce_median(ctx, inputs, attrs):
    """The lower median over ``axes`` (all when absent), and its index in the flattened reduced axes."""
    x = inputs[0]
    keep = bool(attrs.get("keepdims", 1))
    axes = norm_axes(attrs["axes"], x.dim()) if attrs.get("axes") is not None else list(range(x.dim()))
    if not axes:
        return [x, torch.zeros(x.shape, dtype=torch.int32, device=x.device)]
    rest = [d for d in range(x.dim()) if d not in axes]
    moved = x.permute(rest + axes).reshape([x.shape[d] for d in rest] + [-1])
    values, indices = moved.median(dim=-1)
    if keep:
        shape = [1 if d in axes else x.shape[d] for d in range(x.dim())]
        values, indices = values.reshape(shape), indices.reshape(shape)
    return [values, indices.to(torch.int32)]


@register("GroupedGather", GRAPHCORE_DOMAIN, non_differentiable_inputs=(1,))
def grouped_gather(ctx, inputs, attrs):
    """Gather along ``axis`` within each of the ``group_size`` groups of the leading dimension."""
    data, indices = inputs
    group = int(attrs.get("group_size", 1))
    axis = norm_axis(int(attrs.get("axis", 0)), data.dim())
    indices = int_index(indices)
    if group <= 1:
        return torch.index_select(data, axis, indices.reshape(-1)).reshape(
            list(data.shape[:axis]) + list(indices.shape) + list(data.shape[axis + 1:]))
    outs = [torch.index_select(data[g], axis - 1, indices[g].reshape(-1)).reshape(
        list(data.shape[1:axis]) + list(indices.shape[1:]) + list(data.shape[axis + 1:])) for g in range(group)]
    return torch.stack(outs)


_SCATTER_REDUCTIONS = {"sum": "sum", "max": "amax", "min": "amin", "mul": "prod", "none": None}


@register("ScatterReduce", GRAPHCORE_DOMAIN, non_differentiable_inputs=(1,))
def scatter_reduce(ctx, inputs, attrs):
    """``out[..., indices[i], ...] (reduction)= data[..., i, ...]`` along ``axis`` into ``axis_size`` slots
    (starting from the optional initial values, else from zeros); indices broadcast over the other
    dimensions."""
    data, indices = inputs[0], int_index(inputs[1])
    initial = inputs[2] if len(inputs) > 2 else None
    axis = norm_axis(int(attrs.get("axis", -1)), data.dim())
    reduction = attrs.get("reduction", "sum")
    reduction = reduction.decode() if isinstance(reduction, bytes) else str(reduction)
    if reduction not in _SCATTER_REDUCTIONS:
        reduction = ["sum", "max", "min", "mul", "none"][int(reduction)]
    shape = list(data.shape)
    shape[axis] = int(attrs["axis_size"])
    out = initial.clone() if initial is not None else torch.zeros(shape, dtype=data.dtype, device=data.device)
    if indices.dim() == 1 and data.dim() > 1:
        view = [1] * data.dim()
        view[axis] = -1
        indices = indices.reshape(view)
    indices = indices.expand_as(data)
    if _SCATTER_REDUCTIONS[reduction] is None:
        return out.scatter(axis, indices, data)
    return out.scatter_reduce(axis, indices, data, _SCATTER_REDUCTIONS[reduction], include_self=initial is not None)


@register("SequenceSlice", GRAPHCORE_DOMAIN, non_differentiable_inputs=(2, 3, 4))
def sequence_slice(ctx, inputs, attrs):
    """Copy ``N[i]`` rows of ``source`` from ``source_offset[i]`` to ``dest`` at ``dest_offset[i]``
    (``zeroUnused``: rows no slice writes are zero)."""
    source, dest, n, source_offset, dest_offset = inputs
    out = torch.zeros_like(dest) if attrs.get("zeroUnused", 0) else dest.clone()
    if n.device.type == "meta":  # shape inference
        return out
    for count, src, dst in zip(n.reshape(-1).tolist(), source_offset.reshape(-1).tolist(),
                               dest_offset.reshape(-1).tolist()):
        if count:
            out[int(dst):int(dst) + int(count)] = source[int(src):int(src) + int(count)]
    return out


@register("IncrementMod", GRAPHCORE_DOMAIN, differentiable=False)
def increment_mod(ctx, inputs, attrs):
    x = inputs[0]
    inc = torch.tensor(attrs["increment"], dtype=x.dtype)
    mod = torch.tensor(attrs["modulus"], dtype=x.dtype)
    return torch.fmod(x + inc, mod)


@register("NearbyInt", GRAPHCORE_DOMAIN)
def nearby_int(ctx, inputs, attrs):
    """Round half to even (the current rounding mode's)."""
    return torch.round(inputs[0])


@register("Round", GRAPHCORE_DOMAIN)
def round_half_away(ctx, inputs, attrs):
    """Round half away from zero."""
    x = inputs[0]
    return torch.sign(x) * torch.floor(x.abs() + 0.5)


def _bitwise(op_type, fn):
    @register(op_type, GRAPHCORE_DOMAIN, differentiable=False)
    def impl(ctx, inputs, attrs):
        return fn(*inputs)
    return impl


_bitwise("BitwiseNot", torch.bitwise_not)
_bitwise("BitwiseAnd", torch.bitwise_and)
_bitwise("BitwiseOr", torch.bitwise_or)
_bitwise("BitwiseXor", torch.bitwise_xor)
_bitwise("BitwiseXnor", lambda a, b: torch.bitwise_not(torch.bitwise_xor(a, b)))


@register("ScaledAdd", GRAPHCORE_DOMAIN)
def scaled_add(ctx, inputs, attrs):
    """``scale0 * a + scale1 * b``; a third and fourth input, when given, are the scales."""
    a, b = inputs[0], inputs[1]
    s0 = inputs[2] if len(inputs) > 2 and inputs[2] is not None else float(attrs.get("scale0", 1.0))
    s1 = inputs[3] if len(inputs) > 3 and inputs[3] is not None else float(attrs.get("scale1", 1.0))
    return a * s0 + b * s1


@register("GeluErf", GRAPHCORE_DOMAIN)
def gelu_erf(ctx, inputs, attrs):
    return F.gelu(inputs[0], approximate="none")


@register("NormalizeImage", GRAPHCORE_DOMAIN, differentiable=False, method="normalize_image")
def normalize_image(ctx, inputs, attrs):
    """``((img * scale) - offsets) * scales`` over the last (channel) axis, padded to 4 channels;
    uint8 images give float16."""
    img, offsets, scales = inputs
    dtype = torch.float16 if img.dtype == torch.uint8 else img.dtype
    out = ((img.to(dtype) * float(attrs.get("scale", 1.0))) - offsets.to(dtype)) * scales.to(dtype)
    return F.pad(out, (0, 4 - out.shape[-1]))


@register("ShapedDropout", GRAPHCORE_DOMAIN)
def shaped_dropout(ctx, inputs, attrs):
    """Dropout with one mask of ``shape``, broadcast over the input (training sessions only)."""
    x = inputs[0]
    ratio = float(attrs.get("ratio", 0.5))
    if not ctx.training or ratio == 0:
        return x
    mask = (torch.rand(list(attrs["shape"]), device=x.device) >= ratio).to(x.dtype)
    return x * mask / (1 - ratio)


@register("BatchNormalization", GRAPHCORE_DOMAIN, updated_inputs=(3, 4))
def graphcore_batch_norm(ctx, inputs, attrs):
    """PopART's own BatchNormalization (any rank), as ONNX's."""
    from .nn import batch_norm
    return batch_norm(ctx, inputs, attrs)


@register("DepthToSpace", GRAPHCORE_DOMAIN)
def graphcore_depth_to_space(ctx, inputs, attrs):
    from .shape import depth_to_space
    return depth_to_space(ctx, inputs, attrs)


@register("CopyVarUpdate", GRAPHCORE_DOMAIN, differentiable=False)
def copy_var_update(ctx, inputs, attrs):
    """Copy the second input into the first (a variable) and return it."""
    target, value = inputs
    if target.device.type != "meta":
        with torch.no_grad():
            target.copy_(value)
    return target


@register("Abort", GRAPHCORE_DOMAIN, differentiable=False)
def abort(ctx, inputs, attrs):
    """Abort the program (with an input: when it is non-zero)."""
    if ctx.graph is None:  # shape inference
        return []
    condition = inputs[0] if inputs else None
    if condition is not None and (condition.device.type == "meta" or not bool(condition.reshape(-1).any())):
        return []
    fail(ctx, messages.ABORT_OP)



@register("Ctc", GRAPHCORE_DOMAIN, non_differentiable_inputs=(1, 2, 3), method="ctcloss")
def ctc_loss(ctx, inputs, attrs):
    """Connectionist temporal classification loss of ``log_probs`` [T, N, C] for ``targets`` [N, S], with the
    inputs' and targets' lengths [N], as torch's ``CTCLoss`` (Mean: each loss over its target length)."""
    log_probs, targets, input_lengths, target_lengths = inputs
    reduction = attrs.get("reduction", 1)
    if isinstance(reduction, (bytes, str)):
        reduction = {"sum": 0, "mean": 1, "none": 2, "noreduction": 2}[
            (reduction.decode() if isinstance(reduction, bytes) else reduction).lower()]
    if log_probs.device.type == "meta":  # shape inference: torch has no meta kernel for ctc_loss
        shape = [log_probs.shape[1]] if int(reduction) == 2 else []
        return torch.empty(shape, dtype=log_probs.dtype, device="meta")
    loss = F.ctc_loss(log_probs, targets.long(), input_lengths.long(), target_lengths.long(),
                      blank=int(attrs.get("blank", 0)), reduction={0: "sum", 1: "mean", 2: "none"}[int(reduction)],
                      zero_infinity=bool(attrs.get("zeroInfinity", 0)))
    return loss.to(log_probs.dtype)


@register("MultiConv", GRAPHCORE_DOMAIN)
def multi_conv(ctx, inputs, attrs):
    """Several convolutions in one op: inputs (data, weights, bias or '') per convolution, their window
    parameters concatenated in ``strides``, ``pads``, ``dilations`` (as PopART's builder writes them)."""
    from .nn import conv
    outputs, offsets = [], {"strides": 0, "pads": 0, "dilations": 0}
    for i in range(int(attrs.get("numConvs", len(inputs) // 3))):
        x, w, b = inputs[3 * i], inputs[3 * i + 1], inputs[3 * i + 2]
        spatial = x.dim() - 2
        own = {}
        for key, per_conv in (("strides", spatial), ("pads", 2 * spatial), ("dilations", spatial)):
            if attrs.get(key):
                own[key] = list(attrs[key][offsets[key]:offsets[key] + per_conv])
                offsets[key] += per_conv
        outputs.append(conv(ctx, [x, w] + ([b] if b is not None else []), own))
    return outputs
