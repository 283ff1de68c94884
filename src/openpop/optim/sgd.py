"""SGD with PopTorch's extras: loss scaling, velocity scaling, accumulator dtypes and
gradient-norm clipping."""
import math
from collections.abc import Iterable
from typing import Optional

import torch

from ..log import logger
from ..torch_compat import foreach_add, foreach_add_, foreach_mul_
from . import _base, messages
from ._base import Optimizer, given, mirror, prepare_grads, resolve_accum_type, state_tensor, to_float

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
        lr = to_float(group["lr"])
        momentum = to_float(group["momentum"])
        dampening = to_float(group["dampening"])
        P = mirror(params, dtype)
        grads = prepare_grads(grads, P.compute, maximize=group.get("maximize", False),
                              l2=to_float(group["weight_decay"]))
        if momentum == 0:
            foreach_add_(P.compute, grads, alpha=-lr)
            P.flush()
            return

        scale = self._velocity_scale(group)
        velocity_dtype = self._velocity_dtype()
        stored, fresh, old = [], [], []
        for i, p in enumerate(params):
            st = self.state[p]
            if st.get("momentum_buffer") is None:
                fresh.append(i)
                stored.append(None)
            else:
                stored.append(state_tensor(st, "momentum_buffer", p, _base.storage_dtype(velocity_dtype, p)))
                old.append(i)
        # torch's first step: the buffer starts as the gradient itself (no dampening).
        compute = [None] * len(params)
        for i in fresh:
            buf = grads[i] * scale if scale != 1.0 else torch.clone(grads[i]).detach()
            p = params[i]
            store = buf.to(_base.storage_dtype(velocity_dtype, p))
            self.state[p]["momentum_buffer"] = store
            stored[i] = store
            compute[i] = buf
        if old:
            B = mirror([stored[i] for i in old], dtype)
            for j, i in enumerate(old):
                st = self.state[params[i]]
                previous = st.get(_SCALE_KEY, 1.0)
                if previous != scale:  # velocity_scaling changed: keep the velocity itself
                    B.compute[j].mul_(scale / previous)
            foreach_mul_(B.compute, momentum)
            foreach_add_(B.compute, [grads[i] for i in old], alpha=(1.0 - dampening) * scale)
            for j, i in enumerate(old):
                compute[i] = B.compute[j]
            B.flush()
        for p in params:
            st = self.state[p]
            if scale != 1.0:
                st[_SCALE_KEY] = scale
            else:
                st.pop(_SCALE_KEY, None)
        if group["nesterov"]:
            step = foreach_add(grads, compute, alpha=momentum / scale)
            foreach_add_(P.compute, step, alpha=-lr)
        else:
            foreach_add_(P.compute, compute, alpha=-lr / scale)
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
