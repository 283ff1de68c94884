"""SGD with PopTorch's extras: loss scaling, velocity scaling, accumulator dtypes and
gradient-norm clipping."""
import math
from collections.abc import Iterable
from typing import Optional

import torch

from ..log import logger
from . import _base, messages, updates
from ._base import Optimizer, given, mirror, resolve_accum_type, state_tensor, to_float

# Per-parameter state key holding the factor ``momentum_buffer`` is currently stored
# multiplied by (absent = 1.0). ``state_dict()`` never shows it: there the buffer is unscaled,
# in torch's format.
_SCALE_KEY = "velocity_scaling"


class SGD(Optimizer, torch.optim.SGD):
    """Stochastic gradient descent, numerically torch's (momentum, dampening, Nesterov,
    L2 weight decay, maximize), with PopTorch's optional arguments.

    * ``loss_scaling`` (default 1.0): the executor multiplies the loss by it and divides the
      gradients by it before ``step()``, so it never changes the result beyond rounding.
    * ``use_combined_accum`` (default False) chooses PopTorch's variant: combined (one
      tensor holds the velocity; ``accum_type`` is its dtype) or separate (the gradient
      accumulator has ``accum_type``, the velocity ``velocity_accum_type``).
    * ``velocity_scaling`` (per group, default 1.0): with the combined variant the momentum
      buffer is stored multiplied by it and divided by it when used; changing it rescales
      the stored buffer, so results are unaffected beyond rounding. With the separate
      variant it is ignored, with PopTorch's warning.
    * ``max_grad_norm`` (default inf): the global gradient norm of this optimizer's
      parameters is clipped to it before the update, like ``clip_grad_norm_``.
    """

    _group_vars = ["lr", "momentum", "dampening", "weight_decay", "nesterov", "velocity_scaling"]
    _optimizer_attrs = ["loss_scaling", "use_combined_accum", "accum_type", "velocity_accum_type",
                        "max_grad_norm"]

    def __init__(self,
                 params: Iterable,
                 lr: float,
                 momentum: Optional[float] = None,
                 dampening: Optional[float] = None,
                 weight_decay: Optional[float] = None,
                 nesterov: Optional[bool] = None,
                 maximize: Optional[bool] = None,
                 foreach: Optional[bool] = None,
                 differentiable: Optional[bool] = None,
                 loss_scaling: Optional[float] = None,
                 velocity_scaling: Optional[float] = None,
                 use_combined_accum: Optional[bool] = None,
                 accum_type: Optional[torch.dtype] = None,
                 velocity_accum_type: Optional[torch.dtype] = None,
                 max_grad_norm: Optional[float] = None,
                 *,
                 fused: Optional[bool] = None) -> None:
        accum_type = resolve_accum_type(accum_type)
        velocity_accum_type = resolve_accum_type(velocity_accum_type)
        torch_args = given(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                           nesterov=nesterov, maximize=maximize, foreach=foreach,
                           differentiable=differentiable, fused=fused)
        torch.optim.SGD.__init__(self, params, **torch_args)

        self.use_combined_accum = bool(use_combined_accum) if use_combined_accum is not None else False
        self.loss_scaling = 1.0 if loss_scaling is None else loss_scaling
        self.accum_type = accum_type
        self.velocity_accum_type = velocity_accum_type
        self.max_grad_norm = math.inf if max_grad_norm is None else max_grad_norm
        if velocity_scaling is not None and not self.use_combined_accum:
            logger.warning(messages.VELOCITY_SCALING_IGNORED)
        self.defaults["velocity_scaling"] = 1.0 if velocity_scaling is None else velocity_scaling
        self._fill_group_defaults()
        self._finish_init(given(lr=lr, momentum=momentum, dampening=dampening,
                                weight_decay=weight_decay, nesterov=nesterov,
                                loss_scaling=loss_scaling, velocity_scaling=velocity_scaling))

    def _velocity_dtype(self) -> torch.dtype:
        return self.accum_type if self.use_combined_accum else self.velocity_accum_type

    def _velocity_scale(self, group) -> float:
        if not self.use_combined_accum:
            return 1.0
        return to_float(group.get("velocity_scaling", 1.0))

    def _update(self, group, params, grads):
        dtype = grads[0].dtype
        scale = self._velocity_scale(group)
        h = updates.hyperparameters("sgd", group, to_float, velocity_scale=scale)
        choices = dict(momentum_on=h["momentum"] != 0, nesterov=bool(group["nesterov"]),
                       maximize=group.get("maximize", False))
        P = mirror(params, dtype)
        if not choices["momentum_on"]:
            updates.sgd(updates.FOREACH, P.compute, grads, None, h, **choices)
            P.flush()
            return
        # A parameter's first step (no buffer yet) and the later ones are two calls of the update
        # (both only when some parameters get their first gradient after others).
        velocity_dtype = self._velocity_dtype()
        has = [self.state[p].get("momentum_buffer") is not None for p in params]
        for has_buffer in (False, True):
            index = [i for i, flag in enumerate(has) if flag is has_buffer]
            if not index:
                continue
            sub = params if len(index) == len(params) else [params[i] for i in index]
            compute = P.compute if sub is params else [P.compute[i] for i in index]
            sub_grads = grads if sub is params else [grads[i] for i in index]
            if has_buffer:
                B = mirror([state_tensor(self.state[p], "momentum_buffer", p,
                                         _base.storage_dtype(velocity_dtype, p)) for p in sub], dtype)
                for p, buf in zip(sub, B.compute):
                    previous = self.state[p].get(_SCALE_KEY, 1.0)
                    if previous != scale:  # velocity_scaling changed: keep the velocity itself
                        buf.mul_(scale / previous)
                updates.sgd(updates.FOREACH, compute, sub_grads, B.compute, h, has_buffer=True, **choices)
                B.flush()
            else:
                _, bufs = updates.sgd(updates.FOREACH, compute, sub_grads, None, h, has_buffer=False, **choices)
                for p, buf in zip(sub, bufs):
                    self.state[p]["momentum_buffer"] = buf.to(_base.storage_dtype(velocity_dtype, p))
        for p in params:
            st = self.state[p]
            if scale != 1.0:
                st[_SCALE_KEY] = scale
            else:
                st.pop(_SCALE_KEY, None)
        P.flush()

    def state_dict(self):
        """torch's format: ``momentum_buffer`` holds the (unscaled) velocity."""
        sd = super().state_dict()
        for key, st in list(sd["state"].items()):
            if _SCALE_KEY in st:
                st = dict(st)
                scale = st.pop(_SCALE_KEY)
                buf = st.get("momentum_buffer")
                if buf is not None:
                    st["momentum_buffer"] = buf.to(_base.compute_dtype(buf.dtype)) / scale
                sd["state"][key] = st
        return sd
