"""Elementwise ops with ONNX's multidirectional (numpy) broadcasting, comparisons and logic."""
import torch

from .. import messages
from .common import ONNX_TO_TORCH, fail
from .registry import GRAPHCORE_DOMAIN, register


def _binary(op_type, fn):
    @register(op_type)
    def impl(ctx, inputs, attrs):
        a, b = inputs
        return fn(a, b)
    return impl


_binary("Add", torch.add)
_binary("Sub", torch.sub)
_binary("Mul", torch.mul)
_binary("Equal", torch.eq)
_binary("Less", torch.lt)
_binary("Greater", torch.gt)
_binary("LessOrEqual", torch.le)
_binary("GreaterOrEqual", torch.ge)
_binary("And", torch.logical_and)
_binary("Or", torch.logical_or)
_binary("Xor", torch.logical_xor)


@register("BitShift")
def bitshift(ctx, inputs, attrs):
    a, b = inputs
    return a << b if attrs.get("direction", "LEFT") == "LEFT" else a >> b


@register("Div")
def div(ctx, inputs, attrs):
    a, b = inputs
    if a.dtype.is_floating_point:
        return a / b
    return torch.div(a, b, rounding_mode="trunc")  # ONNX: integer division truncates


@register("Pow")
def power(ctx, inputs, attrs):
    a, b = inputs
    return torch.pow(a, b).to(a.dtype)  # ONNX: the result has the base's type


@register("Mod")
def mod(ctx, inputs, attrs):
    a, b = inputs
    if attrs.get("fmod", 0):
        return torch.fmod(a, b)
    if a.dtype.is_floating_point:
        fail(ctx, messages.FMOD_ZERO_ON_FLOATS)
    return torch.remainder(a, b)  # the sign of the divisor, as numpy's mod


def _variadic(op_type, fn):
    @register(op_type)
    def impl(ctx, inputs, attrs):
        result = inputs[0]
        for x in inputs[1:]:
            result = fn(result, x)
        return result
    return impl


_variadic("Max", torch.maximum)
_variadic("Min", torch.minimum)
_variadic("Sum", torch.add)


@register("Mean")
def mean(ctx, inputs, attrs):
    result = inputs[0]
    for x in inputs[1:]:
        result = result + x
    return result / len(inputs)


def _unary(op_type, fn, domain="ai.onnx", method=None):
    @register(op_type, domain, method=method)
    def impl(ctx, inputs, attrs):
        return fn(inputs[0])
    return impl


for _name, _fn in {
    "Neg": torch.neg, "Abs": torch.abs, "Sqrt": torch.sqrt, "Exp": torch.exp, "Log": torch.log,
    "Reciprocal": torch.reciprocal, "Floor": torch.floor, "Ceil": torch.ceil, "Round": torch.round,
    "Sign": torch.sign, "Sin": torch.sin, "Cos": torch.cos, "Tan": torch.tan, "Asin": torch.asin,
    "Acos": torch.acos, "Atan": torch.atan, "Sinh": torch.sinh, "Cosh": torch.cosh, "Asinh": torch.asinh,
    "Acosh": torch.acosh, "Atanh": torch.atanh, "Erf": torch.erf, "Not": torch.logical_not,
    "IsNaN": torch.isnan, "Identity": lambda x: x,
}.items():
    _unary(_name, _fn)

_unary("Expm1", torch.expm1, GRAPHCORE_DOMAIN)
_unary("Log1p", torch.log1p, GRAPHCORE_DOMAIN)
_unary("Detach", lambda x: x.detach(), GRAPHCORE_DOMAIN)
_unary("Nop", lambda x: x, GRAPHCORE_DOMAIN)


@register("IsInf")
def isinf(ctx, inputs, attrs):
    x = inputs[0]
    pos, neg = attrs.get("detect_positive", 1), attrs.get("detect_negative", 1)
    return (torch.isposinf(x) & bool(pos)) | (torch.isneginf(x) & bool(neg))


@register("Where", non_differentiable_inputs=(0,))
def where(ctx, inputs, attrs):
    cond, a, b = inputs
    return torch.where(cond.bool(), a, b)


@register("Clip")
def clip(ctx, inputs, attrs):
    x = inputs[0]
    if ctx.opset < 11:
        lo, hi = attrs.get("min"), attrs.get("max")
    else:
        lo = inputs[1] if len(inputs) > 1 and inputs[1] is not None else None
        hi = inputs[2] if len(inputs) > 2 and inputs[2] is not None else None
        lo = None if lo is None else lo.reshape(())
        hi = None if hi is None else hi.reshape(())
    if lo is not None:
        x = torch.maximum(x, torch.as_tensor(lo, dtype=x.dtype, device=x.device))
    if hi is not None:
        x = torch.minimum(x, torch.as_tensor(hi, dtype=x.dtype, device=x.device))
    return x


@register("Cast", positional=("to",), differentiable=True)
def cast(ctx, inputs, attrs):
    return inputs[0].to(ONNX_TO_TORCH[int(attrs["to"])])


@register("Atan2", GRAPHCORE_DOMAIN)
def atan2(ctx, inputs, attrs):
    return torch.atan2(inputs[0], inputs[1])


@register("Remainder", GRAPHCORE_DOMAIN)
def remainder(ctx, inputs, attrs):
    return torch.remainder(inputs[0], inputs[1])


@register("Fmod", GRAPHCORE_DOMAIN)
def fmod(ctx, inputs, attrs):
    return torch.fmod(inputs[0], inputs[1])


@register("Scale", GRAPHCORE_DOMAIN, positional=("scale",))
def scale(ctx, inputs, attrs):
    return inputs[0] * float(attrs.get("scale", 1.0))
