"""RMSprop with PopTorch's extras: loss scaling, accumulator dtypes, TensorFlow's variant."""
from collections.abc import Iterable
from typing import Optional

import torch

from . import _base, updates
from ._base import Optimizer, given, mirror, resolve_accum_type, state_tensor, step_counters, to_float


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
        h = updates.hyperparameters("rmsprop", group, to_float)
        momentum_on, centered, tf = h["momentum"] > 0, group["centered"], self.use_tf_variant
        P = mirror(params, dtype)
        states = [self.state[p] for p in params]
        steps = step_counters(states)
        S = mirror([state_tensor(st, "square_avg", p, _base.storage_dtype(self.first_order_momentum_accum_type, p),
                                 fill=1.0 if tf else 0.0) for st, p in zip(states, params)], dtype)
        mirrors = [S]
        G = B = None
        if centered:
            G = mirror([state_tensor(st, "grad_avg", p, _base.storage_dtype(self.second_order_momentum_accum_type, p))
                        for st, p in zip(states, params)], dtype)
            mirrors.append(G)
        if momentum_on:
            B = mirror([state_tensor(st, "momentum_buffer", p, _base.compute_dtype(p.dtype))
                        for st, p in zip(states, params)], dtype)
            mirrors.append(B)
        updates.rmsprop(updates.FOREACH, P.compute, grads, S.compute,
                        None if G is None else G.compute, None if B is None else B.compute, steps, h,
                        momentum_on=momentum_on, centered=centered, tf_variant=tf,
                        maximize=group.get("maximize", False))
        for m in mirrors:
            m.flush()
        P.flush()
