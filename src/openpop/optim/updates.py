"""Every optimizer update, written once: SGD, Adam/AdamW, LAMB and RMSprop (and the
gradient-norm clipping coefficient).

Three callers run these bodies, as ``torch.optim.adam`` serves its single-tensor, foreach and
fused paths from one place:

* the eager optimizers (``optim/sgd.py``, ``adam.py``, ``lamb.py``, ``rmsprop.py``: ``_update``)
  with ``FOREACH``: lists of compute-precision tensors updated in place by ``torch._foreach_*``
  kernels, hyperparameters as Python floats (derived scalars such as ``1 - beta ** step`` in
  double precision, as torch's optimizers compute them);
* the compiled program (``runtime/compiled/functional_optim.py``) with ``PURE``: new tensors,
  nothing written, hyperparameters as 0-d tensors traced by ``torch.compile`` (a new value
  never recompiles);
* the unit "regions"'s fused update (``runtime/compiled/fused_updates.py``) with ``PURE`` on one
  flattened parameter, compiled, its results copied back; its ``h`` carries the derived scalars
  computed on the host in double precision (``one_minus_beta1``/``one_minus_beta2``,
  ``correction1``/``correction2`` = ``1 - beta ** step``, ``decay`` = ``1 - lr * weight_decay``).

A body is written over an ops table ``o`` whose functions take and return lists (one entry per
parameter). ``o.name_(xs, ...)`` may write ``xs`` (``FOREACH`` does, ``PURE`` does not) and
returns the result: a body never reads ``xs`` again after passing it to such an op;
``o.name(xs, ...)`` never writes its arguments. A scalar argument is a Python number, a 0-d
tensor, or a list of them (one per parameter). Static choices (momentum on, Nesterov, maximize,
decoupled weight decay, bias correction, centered, TensorFlow's variant) are Python values.

Precision is the callers' (``optim/_base.py``'s mirrors, the program's float32 copies): bodies
compute in the dtype of the tensors they are given.
"""
import math

import torch

from ..torch_compat import (
    foreach_add,
    foreach_add_,
    foreach_addcdiv_,
    foreach_addcmul,
    foreach_addcmul_,
    foreach_div,
    foreach_div_,
    foreach_lerp_,
    foreach_mul,
    foreach_mul_,
    foreach_neg,
    foreach_norm,
    foreach_sqrt,
    foreach_sqrt_,
    foreach_sub_,
)

MAX_WEIGHT_NORM = 65500.0  # LAMB's default max_weight_norm: the largest float16 value


# ---------------------------------------------------------------------------- ops tables
class FOREACH:
    """``torch._foreach_*`` over lists, in place where the name ends with ``_`` (eager). The
    out-of-place ones are torch's own functions (no Python frame between the update and the
    kernel: the eager step's overhead is per call)."""

    @staticmethod
    def add_(xs, ys, alpha=1.0):
        foreach_add_(xs, ys, alpha=alpha)
        return xs

    add = staticmethod(foreach_add)

    @staticmethod
    def add_scalar_(xs, c):
        foreach_add_(xs, c)
        return xs

    add_scalar = staticmethod(foreach_add)

    @staticmethod
    def mul_(xs, c):
        foreach_mul_(xs, c)
        return xs

    mul = staticmethod(foreach_mul)

    @staticmethod
    def div_(xs, c):
        foreach_div_(xs, c)
        return xs

    div = staticmethod(foreach_div)

    neg = staticmethod(foreach_neg)

    sqrt = staticmethod(foreach_sqrt)

    @staticmethod
    def sqrt_(xs):
        foreach_sqrt_(xs)
        return xs

    @staticmethod
    def lerp_(xs, ys, weight):
        foreach_lerp_(xs, ys, weight)
        return xs

    @staticmethod
    def addcmul_(xs, ys, zs, value):
        foreach_addcmul_(xs, ys, zs, value)
        return xs

    addcmul = staticmethod(foreach_addcmul)

    @staticmethod
    def addcdiv_(xs, ys, zs, value):
        foreach_addcdiv_(xs, ys, zs, value)
        return xs

    @staticmethod
    def sub_(xs, ys):
        foreach_sub_(xs, ys)
        return xs

    @staticmethod
    def where(flags, xs, ys):
        return [x if f else y for f, x, y in zip(flags, xs, ys)]

    @staticmethod
    def norms(xs):
        """The 2-norms of ``xs`` as one 1-d tensor on the first one's device."""
        device = xs[0].device
        return torch.stack([n.to(device) for n in foreach_norm(xs, 2)])

    @staticmethod
    def mul_rows_(xs, vector):
        """``xs[i] *= vector[i]``."""
        foreach_mul_(xs, [r.to(x.device) for r, x in zip(vector.unbind(0), xs)])
        return xs

    @staticmethod
    def counts(steps):
        """Step counters as numbers for the bias corrections (double precision on the host)."""
        return [s.item() for s in steps]

    @staticmethod
    def scalar_sqrt(x):
        return math.sqrt(x)


def _each(c, n):
    return c if isinstance(c, (list, tuple)) else [c] * n


def _times(y, c):
    """``c * y``, skipping a multiplication by a literal 1."""
    return y if isinstance(c, (int, float)) and c == 1 else c * y


class PURE:
    """The same ops per tensor, out of place, scalars possibly 0-d tensors (compiled)."""

    @staticmethod
    def add_(xs, ys, alpha=1.0):
        return [x + _times(y, a) for x, y, a in zip(xs, ys, _each(alpha, len(xs)))]

    add = add_

    @staticmethod
    def add_scalar_(xs, c):
        return [x + a for x, a in zip(xs, _each(c, len(xs)))]

    add_scalar = add_scalar_

    @staticmethod
    def mul_(xs, c):
        return [x * a for x, a in zip(xs, _each(c, len(xs)))]

    mul = mul_

    @staticmethod
    def div_(xs, c):
        return [x / a for x, a in zip(xs, _each(c, len(xs)))]

    div = div_

    @staticmethod
    def neg(xs):
        return [-x for x in xs]

    @staticmethod
    def sqrt(xs):
        return [torch.sqrt(x) for x in xs]

    sqrt_ = sqrt

    @staticmethod
    def lerp_(xs, ys, weight):
        return [torch.lerp(x, y, w) for x, y, w in zip(xs, ys, _each(weight, len(xs)))]

    @staticmethod
    def addcmul_(xs, ys, zs, value):
        return [x + y * z * v for x, y, z, v in zip(xs, ys, zs, _each(value, len(xs)))]

    addcmul = addcmul_

    @staticmethod
    def addcdiv_(xs, ys, zs, value):
        return [x + _times(y, v) / z for x, y, z, v in zip(xs, ys, zs, _each(value, len(xs)))]

    @staticmethod
    def sub_(xs, ys):
        return [x - y for x, y in zip(xs, ys)]

    @staticmethod
    def where(flags, xs, ys):
        return [torch.where(f, x, y) for f, x, y in zip(flags, xs, ys)]

    @staticmethod
    def norms(xs):
        return torch.stack([torch.linalg.vector_norm(x, 2) for x in xs])

    @staticmethod
    def mul_rows_(xs, vector):
        return [x * r for x, r in zip(xs, vector.unbind(0))]

    @staticmethod
    def counts(steps):
        return steps

    @staticmethod
    def scalar_sqrt(x):
        return torch.sqrt(x)


# ---------------------------------------------------------------------------- hyperparameters
def hyperparameters(family: str, group: dict, convert=lambda v: v, velocity_scale=1.0) -> dict:
    """``{name: value}``: what ``family``'s update (``"sgd"``, ``"adam"`` (also AdamW), ``"lamb"``,
    ``"rmsprop"``) reads from a param group, each value passed through ``convert``."""
    h = {"lr": convert(group["lr"]), "weight_decay": convert(group["weight_decay"])}
    if family == "sgd":
        h.update(momentum=convert(group["momentum"]), dampening=convert(group["dampening"]),
                 velocity_scale=velocity_scale)
    elif family == "rmsprop":
        h.update(momentum=convert(group["momentum"]), alpha=convert(group["alpha"]), eps=convert(group["eps"]))
    else:
        h.update(beta1=convert(group["betas"][0]), beta2=convert(group["betas"][1]), eps=convert(group["eps"]))
    if family == "lamb":
        value = group.get("max_weight_norm")
        h["max_weight_norm"] = MAX_WEIGHT_NORM if value is None else convert(value)
    return h


def _maybe_nonzero(x) -> bool:
    """False only for a Python zero (a traced value may be anything)."""
    return not (isinstance(x, (int, float)) and x == 0)


# ---------------------------------------------------------------------------- shared steps
def clip_coefficient(o, grads, max_norm):
    """``torch.nn.utils.clip_grad_norm_``'s factor: ``min(1, max_norm / (||grads|| + 1e-6))``."""
    total = torch.linalg.vector_norm(o.norms(grads), 2)
    return torch.clamp(max_norm / (total + 1e-6), max=1.0)


def _gradient(o, grads, params, maximize, l2):
    """The gradient the update follows: negated for ``maximize``, plus the L2 term ``l2 * p``;
    the caller's gradient tensors are never written."""
    if maximize:
        grads = o.neg(grads)
    if _maybe_nonzero(l2):
        grads = o.add_(grads, params, alpha=l2) if maximize else o.add(grads, params, alpha=l2)
    return grads


def _moments(o, grads, steps, exp_avgs, exp_avg_sqs, h):
    """Adam's and LAMB's counters and moments after this gradient."""
    one_minus_beta1 = h["one_minus_beta1"] if "one_minus_beta1" in h else 1.0 - h["beta1"]
    one_minus_beta2 = h["one_minus_beta2"] if "one_minus_beta2" in h else 1.0 - h["beta2"]
    steps = o.add_scalar_(steps, 1.0)
    exp_avgs = o.lerp_(exp_avgs, grads, one_minus_beta1)
    exp_avg_sqs = o.addcmul_(o.mul_(exp_avg_sqs, h["beta2"]), grads, grads, one_minus_beta2)
    return steps, exp_avgs, exp_avg_sqs


def _corrections(o, steps, h):
    """Per parameter ``(1 - beta1 ** step, 1 - beta2 ** step)``, as lists."""
    if "correction1" in h:
        return [h["correction1"]] * len(steps), [h["correction2"]] * len(steps)
    counts = o.counts(steps)
    return [1.0 - h["beta1"] ** n for n in counts], [1.0 - h["beta2"] ** n for n in counts]


def _adaptive_denominator(o, exp_avg_sqs, steps, h, bias_correction):
    """``sqrt(v_hat) + eps`` and the first moment's corrections (None without bias correction)."""
    denom = o.sqrt(exp_avg_sqs)
    if not bias_correction:
        return o.add_scalar_(denom, h["eps"]), None
    correction1, correction2 = _corrections(o, steps, h)
    denom = o.div_(denom, [o.scalar_sqrt(c) for c in correction2])
    return o.add_scalar_(denom, h["eps"]), correction1


# ---------------------------------------------------------------------------- the updates
def sgd(o, params, grads, bufs, h, *, momentum_on, nesterov=False, maximize=False, has_buffer=True):
    """torch's SGD (L2 weight decay, momentum, dampening, Nesterov, maximize) with PopTorch's
    velocity scaling: ``bufs`` (the momentum buffers) are stored times ``h["velocity_scale"]``.
    ``has_buffer``: True, False (the first step: the buffer starts as the gradient itself,
    undamped) or per parameter a flag. Returns ``(params, bufs)``."""
    lr = h["lr"]
    grads = _gradient(o, grads, params, maximize, h["weight_decay"])
    if not momentum_on:
        return o.add_(params, grads, alpha=-lr), bufs
    momentum, scale = h["momentum"], h["velocity_scale"]
    if has_buffer is False:
        bufs = o.mul(grads, scale)
    else:
        later = o.add_(o.mul_(bufs, momentum), grads, alpha=(1.0 - h["dampening"]) * scale)
        bufs = later if has_buffer is True else o.where(has_buffer, later, o.mul(grads, scale))
    if nesterov:
        params = o.add_(params, o.add(grads, bufs, alpha=momentum / scale), alpha=-lr)
    else:
        params = o.add_(params, bufs, alpha=-lr / scale)
    return params, bufs


def adam(o, params, grads, exp_avgs, exp_avg_sqs, steps, h, *, maximize=False, decoupled=False,
         bias_correction=True):
    """Adam (weight decay added to the gradient) or, ``decoupled``, AdamW (the weights decayed
    first): torch's algorithm without amsgrad; ``bias_correction=False`` is PopART's AdamNoBias.
    Returns ``(params, exp_avgs, exp_avg_sqs, steps)``."""
    lr, weight_decay = h["lr"], h["weight_decay"]
    if decoupled and _maybe_nonzero(weight_decay):
        params = o.mul_(params, h["decay"] if "decay" in h else 1.0 - lr * weight_decay)
    grads = _gradient(o, grads, params, maximize, 0.0 if decoupled else weight_decay)
    steps, exp_avgs, exp_avg_sqs = _moments(o, grads, steps, exp_avgs, exp_avg_sqs, h)
    denom, correction1 = _adaptive_denominator(o, exp_avg_sqs, steps, h, bias_correction)
    step_size = -lr if correction1 is None else [-(lr / c) for c in correction1]
    params = o.addcdiv_(params, exp_avgs, denom, step_size)
    return params, exp_avgs, exp_avg_sqs, steps


def lamb(o, params, grads, exp_avgs, exp_avg_sqs, steps, h, *, bias_correction=True):
    """LAMB (PopART's Lamb / LambNoBias): Adam's direction plus ``weight_decay * w``, scaled by
    the trust ratio ``min(||w||, max_weight_norm) / ||u||`` (1 when either norm is 0).
    Returns ``(params, exp_avgs, exp_avg_sqs, steps)``."""
    steps, exp_avgs, exp_avg_sqs = _moments(o, grads, steps, exp_avgs, exp_avg_sqs, h)
    denom, correction1 = _adaptive_denominator(o, exp_avg_sqs, steps, h, bias_correction)
    if correction1 is None:
        update = o.div(exp_avgs, denom)
    else:
        update = o.div_(o.div(exp_avgs, correction1), denom)
    if _maybe_nonzero(h["weight_decay"]):
        update = o.add_(update, params, alpha=h["weight_decay"])
    r1 = torch.clamp(o.norms(params), max=h["max_weight_norm"])
    r2 = o.norms(update)
    ratio = torch.where((r1 > 0) & (r2 > 0), r1 / r2, torch.ones_like(r1))
    update = o.mul_rows_(update, ratio)
    params = o.add_(params, update, alpha=-h["lr"])
    return params, exp_avgs, exp_avg_sqs, steps


def rmsprop(o, params, grads, square_avgs, grad_avgs, bufs, steps, h, *, momentum_on, centered=False,
            tf_variant=False, maximize=False):
    """RMSprop: torch's (``eps`` outside the square root), or TensorFlow's (``eps`` inside, the
    learning rate folded into the momentum buffer). ``grad_avgs`` (centered) and ``bufs``
    (momentum) may be None when unused. Returns ``(params, square_avgs, grad_avgs, bufs, steps)``."""
    lr, alpha, eps = h["lr"], h["alpha"], h["eps"]
    grads = _gradient(o, grads, params, maximize, h["weight_decay"])
    steps = o.add_scalar_(steps, 1.0)
    square_avgs = o.addcmul_(o.mul_(square_avgs, alpha), grads, grads, 1.0 - alpha)
    if centered:
        grad_avgs = o.lerp_(grad_avgs, grads, 1.0 - alpha)
        avg = o.addcmul(square_avgs, grad_avgs, grad_avgs, -1.0)
        avg = o.sqrt_(o.add_scalar_(avg, eps)) if tf_variant else o.add_scalar_(o.sqrt_(avg), eps)
    elif tf_variant:
        avg = o.sqrt_(o.add_scalar(square_avgs, eps))
    else:
        avg = o.add_scalar_(o.sqrt(square_avgs), eps)
    if not momentum_on:
        params = o.addcdiv_(params, grads, avg, -lr)
    elif tf_variant:
        bufs = o.addcdiv_(o.mul_(bufs, h["momentum"]), grads, avg, lr)
        params = o.sub_(params, bufs)
    else:
        bufs = o.addcdiv_(o.mul_(bufs, h["momentum"]), grads, avg, 1.0)
        params = o.add_(params, bufs, alpha=-lr)
    return params, square_avgs, grad_avgs, bufs, steps
