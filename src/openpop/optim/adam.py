"""Adam and AdamW with PopTorch's extras (loss scaling, accumulator dtypes, gradient-norm
clipping; AdamW also ``bias_correction``)."""
import math
from collections.abc import Iterable
from typing import Optional

import torch

from . import _base, messages, updates
from ._base import (
    Optimizer,
    given,
    mirror,
    resolve_accum_type,
    state_tensor,
    step_counters,
    to_float,
)


class _AdamBase(Optimizer):
    """The update shared by Adam and AdamW (torch's algorithm, amsgrad excluded).

    State per parameter, named as torch names it: ``step``, ``exp_avg`` (stored in
    ``first_order_momentum_accum_type``) and ``exp_avg_sq`` (``second_order_momentum_accum_type``).
    """

    _group_vars = ["lr", "betas", "eps", "weight_decay", "amsgrad"]
    _decoupled = False  # AdamW: weight decay applied to the weights, not added to the gradient

    def _init_common(self, loss_scaling, accum_type, first_order_momentum_accum_type,
                     second_order_momentum_accum_type, max_grad_norm):
        self.loss_scaling = 1.0 if loss_scaling is None else loss_scaling
        self.accum_type = accum_type
        self.first_order_momentum_accum_type = first_order_momentum_accum_type
        self.second_order_momentum_accum_type = second_order_momentum_accum_type
        self.max_grad_norm = math.inf if max_grad_norm is None else max_grad_norm
        for group in self.param_groups:
            self._check_group(group)

    def _check_group(self, group):
        if group.get("amsgrad", False):
            raise ValueError(messages.AMSGRAD_ERROR)

    def _bias_correction(self) -> bool:
        return True

    def _update(self, group, params, grads):
        dtype = grads[0].dtype
        h = updates.hyperparameters("adam", group, to_float)
        P = mirror(params, dtype)
        states = [self.state[p] for p in params]
        steps = step_counters(states)
        M = mirror([state_tensor(st, "exp_avg", p, _base.storage_dtype(self.first_order_momentum_accum_type, p))
                    for st, p in zip(states, params)], dtype)
        V = mirror([state_tensor(st, "exp_avg_sq", p,
                                 _base.storage_dtype(self.second_order_momentum_accum_type, p))
                    for st, p in zip(states, params)], dtype)
        updates.adam(updates.FOREACH, P.compute, grads, M.compute, V.compute, steps, h,
                     maximize=group.get("maximize", False),
                     decoupled=self._decoupled or group.get("decoupled_weight_decay", False),
                     bias_correction=self._bias_correction())
        M.flush()
        V.flush()
        P.flush()


class Adam(_AdamBase, torch.optim.Adam):
    """Adam, numerically torch's (L2 ``weight_decay`` added to the gradient; torch 2.x's
    ``decoupled_weight_decay=True`` makes it AdamW's), plus ``loss_scaling``, accumulator
    dtypes and ``max_grad_norm``. ``amsgrad=True`` is rejected (ValueError)."""

    _optimizer_attrs = ["loss_scaling", "accum_type", "first_order_momentum_accum_type",
                        "second_order_momentum_accum_type", "max_grad_norm"]

    def __init__(self,
                 params: Iterable,
                 lr: Optional[float] = None,
                 betas: Optional[tuple[float, float]] = None,
                 eps: Optional[float] = None,
                 weight_decay: Optional[float] = None,
                 amsgrad: Optional[bool] = None,
                 foreach: Optional[bool] = None,
                 maximize: Optional[bool] = None,
                 capturable: Optional[bool] = None,
                 differentiable: Optional[bool] = None,
                 fused: Optional[bool] = None,
                 loss_scaling: Optional[float] = None,
                 accum_type: Optional[torch.dtype] = None,
                 first_order_momentum_accum_type: Optional[torch.dtype] = None,
                 second_order_momentum_accum_type: Optional[torch.dtype] = None,
                 max_grad_norm: Optional[float] = None,
                 *,
                 decoupled_weight_decay: Optional[bool] = None) -> None:
        if amsgrad:
            raise ValueError(messages.AMSGRAD_ERROR)
        accum_type = resolve_accum_type(accum_type)
        first = resolve_accum_type(first_order_momentum_accum_type)
        second = resolve_accum_type(second_order_momentum_accum_type)
        torch.optim.Adam.__init__(self, params, **given(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, foreach=foreach,
            maximize=maximize, capturable=capturable, differentiable=differentiable, fused=fused,
            decoupled_weight_decay=decoupled_weight_decay))
        self._init_common(loss_scaling, accum_type, first, second, max_grad_norm)
        self._finish_init(given(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                                loss_scaling=loss_scaling))


class AdamW(_AdamBase, torch.optim.AdamW):
    """AdamW, numerically torch's (decoupled weight decay, default 1e-2), plus
    ``loss_scaling``, accumulator dtypes, ``max_grad_norm`` and ``bias_correction``
    (False = PopART's AdamNoBias: no bias correction of the moments)."""

    _decoupled = True
    _group_vars = ["lr", "betas", "weight_decay", "eps", "amsgrad"]
    _optimizer_attrs = ["loss_scaling", "bias_correction", "accum_type", "first_order_momentum_accum_type",
                        "second_order_momentum_accum_type", "max_grad_norm"]

    def __init__(self,
                 params: Iterable,
                 lr: Optional[float] = None,
                 betas: Optional[tuple[float, float]] = None,
                 eps: Optional[float] = None,
                 weight_decay: Optional[float] = None,
                 amsgrad: Optional[bool] = None,
                 maximize: Optional[bool] = None,
                 foreach: Optional[bool] = None,
                 capturable: Optional[bool] = None,
                 differentiable: Optional[bool] = None,
                 fused: Optional[bool] = None,
                 loss_scaling: Optional[float] = None,
                 bias_correction: Optional[bool] = None,
                 accum_type: Optional[torch.dtype] = None,
                 first_order_momentum_accum_type: Optional[torch.dtype] = None,
                 second_order_momentum_accum_type: Optional[torch.dtype] = None,
                 max_grad_norm: Optional[float] = None) -> None:
        if amsgrad:
            raise ValueError(messages.AMSGRAD_ERROR)
        accum_type = resolve_accum_type(accum_type)
        first = resolve_accum_type(first_order_momentum_accum_type)
        second = resolve_accum_type(second_order_momentum_accum_type)
        torch.optim.AdamW.__init__(self, params, **given(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize,
            foreach=foreach, capturable=capturable, differentiable=differentiable, fused=fused))
        self.bias_correction = True if bias_correction is None else bool(bias_correction)
        self._init_common(loss_scaling, accum_type, first, second, max_grad_norm)
        self._finish_init(given(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                                loss_scaling=loss_scaling))

    def _bias_correction(self) -> bool:
        return self.bias_correction
