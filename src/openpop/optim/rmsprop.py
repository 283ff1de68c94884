"""RMSprop with PopTorch's extras: loss scaling, accumulator dtypes, TensorFlow's variant."""
from collections.abc import Iterable
from typing import Optional

import torch

from ..torch_compat import (
    foreach_add,
    foreach_add_,
    foreach_addcdiv_,
    foreach_addcmul,
    foreach_addcmul_,
    foreach_lerp_,
    foreach_mul_,
    foreach_sqrt,
    foreach_sqrt_,
    foreach_sub_,
)
from . import _base
from ._base import Optimizer, given, mirror, prepare_grads, resolve_accum_type, state_tensor, step_counters, to_float


class RMSprop(Optimizer, torch.optim.RMSprop):
    """RMSprop, numerically torch's by default (L2 ``weight_decay``, momentum, centered,
    maximize), plus ``loss_scaling`` and accumulator dtypes.

    ``use_tf_variant=True`` follows TensorFlow's RMSProp (``tf.raw_ops.ApplyRMSProp`` /
    ``ApplyCenteredRMSProp``, TF1 ``RMSPropOptimizer`` initialisation):

    * the mean square ``ms`` starts at ones instead of zeros;
    * ``eps`` goes inside the square root: ``g / sqrt(ms + eps)``
      (centered: ``g / sqrt(ms - mg**2 + eps)``) instead of ``g / (sqrt(ms) + eps)``;
    * with momentum the learning rate is folded into the buffer:
      ``mom = momentum * mom + lr * g / sqrt(...)``, then ``w -= mom``.

    State keeps torch's names: ``step``, ``square_avg``, ``momentum_buffer`` and ``grad_avg``.
    Their dtypes follow PopART's adaptive optimizer, which PopTorch drove: the first
    accumulator (``square_avg``) uses ``first_order_momentum_accum_type``, the second
    (``grad_avg``, centered only) ``second_order_momentum_accum_type``, and the momentum
    buffer is always float32.
    """

    _group_vars = ["lr", "momentum", "weight_decay", "alpha", "eps", "centered"]
    _optimizer_attrs = ["loss_scaling", "accum_type", "first_order_momentum_accum_type",
                        "second_order_momentum_accum_type", "use_tf_variant"]

    def __init__(self,
                 params: Iterable,
                 lr: Optional[float] = None,
                 alpha: Optional[float] = None,
                 eps: Optional[float] = None,
                 weight_decay: Optional[float] = None,
                 momentum: Optional[float] = None,
                 centered: Optional[bool] = None,
                 foreach: Optional[bool] = None,
                 maximize: Optional[bool] = None,
                 differentiable: Optional[bool] = None,
                 loss_scaling: Optional[float] = None,
                 accum_type: Optional[torch.dtype] = None,
                 first_order_momentum_accum_type: Optional[torch.dtype] = None,
                 second_order_momentum_accum_type: Optional[torch.dtype] = None,
                 use_tf_variant: Optional[bool] = None,
                 *,
                 capturable: Optional[bool] = None) -> None:
        accum_type = resolve_accum_type(accum_type)
        first = resolve_accum_type(first_order_momentum_accum_type)
        second = resolve_accum_type(second_order_momentum_accum_type)
        torch.optim.RMSprop.__init__(self, params, **given(
            lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum, centered=centered,
            foreach=foreach, maximize=maximize, differentiable=differentiable, capturable=capturable))
        self.loss_scaling = 1.0 if loss_scaling is None else loss_scaling
        self.accum_type = accum_type
        self.first_order_momentum_accum_type = first
        self.second_order_momentum_accum_type = second
        self.use_tf_variant = False if use_tf_variant is None else bool(use_tf_variant)
        self._finish_init(given(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                                centered=centered, loss_scaling=loss_scaling))

    def _update(self, group, params, grads):
        dtype = grads[0].dtype
        lr = to_float(group["lr"])
        alpha = to_float(group["alpha"])
        eps = to_float(group["eps"])
        momentum = to_float(group["momentum"])
        centered = group["centered"]
        tf = self.use_tf_variant

        P = mirror(params, dtype)
        grads = prepare_grads(grads, P.compute, maximize=group.get("maximize", False),
                              l2=to_float(group["weight_decay"]))
        states = [self.state[p] for p in params]
        steps = step_counters(states)
        S = mirror([state_tensor(st, "square_avg", p, _base.storage_dtype(self.first_order_momentum_accum_type, p),
                                 fill=1.0 if tf else 0.0) for st, p in zip(states, params)], dtype)
        foreach_add_(steps, 1.0)
        foreach_mul_(S.compute, alpha)
        foreach_addcmul_(S.compute, grads, grads, 1.0 - alpha)
        mirrors = [S]

        if centered:
            G = mirror([state_tensor(st, "grad_avg", p, _base.storage_dtype(self.second_order_momentum_accum_type, p))
                        for st, p in zip(states, params)], dtype)
            mirrors.append(G)
            foreach_lerp_(G.compute, grads, 1.0 - alpha)
            avg = foreach_addcmul(S.compute, G.compute, G.compute, value=-1.0)
            if tf:
                foreach_add_(avg, eps)
                foreach_sqrt_(avg)
            else:
                foreach_sqrt_(avg)
                foreach_add_(avg, eps)
        elif tf:
            avg = foreach_add(S.compute, eps)
            foreach_sqrt_(avg)
        else:
            avg = foreach_sqrt(S.compute)
            foreach_add_(avg, eps)

        if momentum > 0:
            B = mirror([state_tensor(st, "momentum_buffer", p, _base.compute_dtype(p.dtype))
                        for st, p in zip(states, params)], dtype)
            mirrors.append(B)
            foreach_mul_(B.compute, momentum)
            if tf:
                foreach_addcdiv_(B.compute, grads, avg, value=lr)
                foreach_sub_(P.compute, B.compute)
            else:
                foreach_addcdiv_(B.compute, grads, avg)
                foreach_add_(P.compute, B.compute, alpha=-lr)
        else:
            foreach_addcdiv_(P.compute, grads, avg, value=-lr)
        for m in mirrors:
            m.flush()
        P.flush()
