"""Activations and the softmax family (ONNX < 13 softmax works on the input coerced to 2-D at ``axis``)."""
import math

import torch
import torch.nn.functional as F

from .common import norm_axis
from .registry import GRAPHCORE_DOMAIN, register


@register("Relu")
def relu(ctx, inputs, attrs):
    return F.relu(inputs[0])


@register("LeakyRelu")
def leaky_relu(ctx, inputs, attrs):
    return F.leaky_relu(inputs[0], attrs.get("alpha", 0.01))


@register("Elu")
def elu(ctx, inputs, attrs):
    return F.elu(inputs[0], attrs.get("alpha", 1.0))


@register("Celu")
def celu(ctx, inputs, attrs):
    return F.celu(inputs[0], attrs.get("alpha", 1.0))


@register("Selu")
def selu(ctx, inputs, attrs):
    alpha = attrs.get("alpha", 1.67326319217681884765625)
    gamma = attrs.get("gamma", 1.05070102214813232421875)
    x = inputs[0]
    return gamma * torch.where(x > 0, x, alpha * (torch.exp(x) - 1))


@register("Sigmoid")
def sigmoid(ctx, inputs, attrs):
    return torch.sigmoid(inputs[0])


@register("HardSigmoid")
def hard_sigmoid(ctx, inputs, attrs):
    return torch.clamp(attrs.get("alpha", 0.2) * inputs[0] + attrs.get("beta", 0.5), 0, 1)


@register("Softplus")
def softplus(ctx, inputs, attrs):
    return F.softplus(inputs[0])


@register("Softsign")
def softsign(ctx, inputs, attrs):
    return F.softsign(inputs[0])


@register("Tanh")
def tanh(ctx, inputs, attrs):
    return torch.tanh(inputs[0])


@register("PRelu")
def prelu(ctx, inputs, attrs):
    x, slope = inputs
    return torch.where(x >= 0, x, x * slope)


@register("ThresholdedRelu")
def thresholded_relu(ctx, inputs, attrs):
    x = inputs[0]
    return torch.where(x > attrs.get("alpha", 1.0), x, torch.zeros_like(x))


@register("Gelu", GRAPHCORE_DOMAIN)
def gelu(ctx, inputs, attrs):
    # PopART's Gelu is the tanh approximation.
    return F.gelu(inputs[0], approximate="tanh")


@register("Swish", GRAPHCORE_DOMAIN)
def swish(ctx, inputs, attrs):
    return inputs[0] * torch.sigmoid(inputs[0])


def _softmax_like(ctx, x, attrs, fn):
    rank = x.dim()
    if ctx.opset >= 13:
        return fn(x, norm_axis(attrs.get("axis", -1), rank))
    axis = norm_axis(attrs.get("axis", 1), rank)
    shape = x.shape
    rows = math.prod(shape[:axis])
    return fn(x.reshape(rows, -1), 1).reshape(shape)


def _hardmax(x, dim):
    return F.one_hot(torch.argmax(x, dim=dim), x.shape[dim]).movedim(-1, dim).to(x.dtype)


@register("Softmax")
def softmax(ctx, inputs, attrs):
    return _softmax_like(ctx, inputs[0], attrs, lambda t, d: torch.softmax(t, d))


@register("LogSoftmax")
def log_softmax(ctx, inputs, attrs):
    return _softmax_like(ctx, inputs[0], attrs, lambda t, d: torch.log_softmax(t, d))


@register("Hardmax", differentiable=False)
def hardmax(ctx, inputs, attrs):
    return _softmax_like(ctx, inputs[0], attrs, _hardmax)
