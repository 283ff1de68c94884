"""LAMB (You et al., "Large Batch Optimization for Deep Learning", arXiv:1904.00962), as
PopART implements it for PopTorch."""
from collections.abc import Iterable
from typing import Optional

import torch

from . import _base, messages, updates
from ._base import Optimizer, given, mirror, resolve_accum_type, state_tensor, step_counters, to_float
from .updates import MAX_WEIGHT_NORM


class LAMB(Optimizer, torch.optim.Optimizer):
    """Layer-wise adaptive moments.

    Per parameter ``w`` with (unscaled) gradient ``g``, at step ``t``::

        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g**2
        m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)      # bias_correction=True
        u = m_hat / (sqrt(v_hat) + eps) + weight_decay * w
        r1 = min(||w||, max_weight_norm);  r2 = ||u||
        w -= lr * (r1 / r2 if r1 > 0 and r2 > 0 else 1) * u

    ``bias_correction=False`` (PopART's LambNoBias) uses ``m`` and ``v`` as they are.
    ``max_weight_norm`` is a per-group attribute (None -> 65500); a group with
    ``max_weight_norm=0`` gets a trust ratio of 1, i.e. an Adam-style update.
    State: ``step``, ``exp_avg`` (``first_order_momentum_accum_type``), ``exp_avg_sq``
    (``second_order_momentum_accum_type``).
    """

    _group_vars = ["lr", "weight_decay", "betas", "eps", "max_weight_norm"]
    _optimizer_attrs = ["loss_scaling", "bias_correction", "accum_type", "first_order_momentum_accum_type",
                        "second_order_momentum_accum_type", "max_weight_norm"]

    def __init__(self,
                 params: Iterable,
                 lr: Optional[float] = None,
                 betas: Optional[tuple[float, float]] = None,
                 eps: Optional[float] = None,
                 weight_decay: Optional[float] = None,
                 bias_correction: Optional[bool] = None,
                 loss_scaling: Optional[float] = None,
                 max_weight_norm: Optional[float] = None,
                 accum_type: Optional[torch.dtype] = None,
                 first_order_momentum_accum_type: Optional[torch.dtype] = None,
                 second_order_momentum_accum_type: Optional[torch.dtype] = None) -> None:
        explicit = given(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, loss_scaling=loss_scaling,
                         max_weight_norm=max_weight_norm)
        accum_type = resolve_accum_type(accum_type)
        first = resolve_accum_type(first_order_momentum_accum_type)
        second = resolve_accum_type(second_order_momentum_accum_type)
        lr = 1e-3 if lr is None else lr
        betas = (0.9, 0.999) if betas is None else tuple(betas)
        eps = 1e-8 if eps is None else eps
        weight_decay = 1e-2 if weight_decay is None else weight_decay
        max_weight_norm = MAX_WEIGHT_NORM if max_weight_norm is None else max_weight_norm
        if not 0.0 <= to_float(lr):
            raise ValueError(messages.INVALID_LEARNING_RATE.format(lr=lr))
        if not 0.0 <= eps:
            raise ValueError(messages.INVALID_EPSILON.format(eps=eps))
        for i, beta in enumerate(betas):
            if not 0.0 <= to_float(beta) < 1.0:
                raise ValueError(messages.INVALID_BETA.format(i=i, beta=beta))
        if not 0.0 <= weight_decay:
            raise ValueError(messages.INVALID_WEIGHT_DECAY.format(weight_decay=weight_decay))
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, max_weight_norm=max_weight_norm)
        torch.optim.Optimizer.__init__(self, params, defaults)
        self.bias_correction = True if bias_correction is None else bool(bias_correction)
        self.loss_scaling = 1.0 if loss_scaling is None else loss_scaling
        # The constructor's value; each group's "max_weight_norm" is what step() uses.
        self.max_weight_norm = max_weight_norm
        self.accum_type = accum_type
        self.first_order_momentum_accum_type = first
        self.second_order_momentum_accum_type = second
        self._finish_init(explicit)

    def __setstate__(self, state):
        super().__setstate__(state)
        for st in self.state.values():
            if "step" in st and not torch.is_tensor(st["step"]):
                st["step"] = torch.tensor(float(st["step"]), dtype=_base.scalar_dtype())

    def _update(self, group, params, grads):
        dtype = grads[0].dtype
        h = updates.hyperparameters("lamb", group, to_float)
        P = mirror(params, dtype)
        states = [self.state[p] for p in params]
        steps = step_counters(states)
        M = mirror([state_tensor(st, "exp_avg", p, _base.storage_dtype(self.first_order_momentum_accum_type, p))
                    for st, p in zip(states, params)], dtype)
        V = mirror([state_tensor(st, "exp_avg_sq", p, _base.storage_dtype(self.second_order_momentum_accum_type, p))
                    for st, p in zip(states, params)], dtype)
        updates.lamb(updates.FOREACH, P.compute, grads, M.compute, V.compute, steps, h,
                     bias_correction=self.bias_correction)
        M.flush()
        V.flush()
        P.flush()
