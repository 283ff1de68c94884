"""MatMul (numpy matmul semantics) and Gemm."""
import torch

from .registry import register


@register("MatMul")
def matmul(ctx, inputs, attrs):
    return torch.matmul(inputs[0], inputs[1])


@register("Gemm")
def gemm(ctx, inputs, attrs):
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    if attrs.get("transA", 0):
        a = a.t()
    if attrs.get("transB", 0):
        b = b.t()
    out = attrs.get("alpha", 1.0) * (a @ b) if attrs.get("alpha", 1.0) != 1.0 else a @ b
    if c is not None:
        beta = attrs.get("beta", 1.0)
        out = out + (beta * c if beta != 1.0 else c)
    return out
