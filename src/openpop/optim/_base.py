"""What every openpop optimizer shares: variable/constant bookkeeping, the optimizer-wide
attributes, a ``step()`` driver, mixed-precision state storage and gradient-norm clipping.

How a step runs (``Optimizer.step``):

1. collect the parameters that have a gradient, per param group, in buckets of one device
   and one compute dtype (float32, or float64 for float64 parameters);
2. if ``max_grad_norm`` is finite, scale every gradient by
   ``min(1, max_grad_norm / (total_norm + 1e-6))`` (``torch.nn.utils.clip_grad_norm_``'s
   rule) — on copies: ``p.grad`` is never modified;
3. call the subclass's ``_update(group, params, grads)`` once per bucket: it runs its update
   from ``optim/updates.py`` (the one definition every backend uses) with ``torch._foreach_*``
   ops on compute-precision lists. A tensor stored in another dtype
   (float16 optimizer state, float16 parameters) is mirrored into a compute copy and
   written back afterwards (``_Mirror``).

Gradients reaching ``step()`` are already unscaled: the executor multiplies the loss by
``loss_scaling`` before backward and divides the gradients by it before calling ``step()``.
"""
import math
from collections.abc import Iterable
from typing import Optional

import torch

from ..torch_compat import foreach_mul
from . import messages, updates

ACCUM_TYPES = (torch.float16, torch.float32)


class VariableAttributes:
    """Which optimizer attributes are variable (may change after compilation through
    ``setOptimizer``) and which are constant (fixed when the model is compiled).

    Available as ``optimizer.variable_attrs`` on every openpop optimizer: arguments passed
    explicitly to the constructor are variable, the others constant; ``lr`` is always
    variable unless marked constant.
    """

    def __init__(self, variable_attributes: Iterable[str], allowed_attributes: Iterable[str]) -> None:
        self._allowed_attributes = list(dict.fromkeys(allowed_attributes))
        self._variable_attributes = list(dict.fromkeys(variable_attributes))

    def isConstant(self, attr: str) -> bool:
        """True if ``attr`` is constant."""
        return attr not in self._variable_attributes

    def markAsConstant(self, attr: str) -> None:
        """Make ``attr`` constant."""
        self._check(attr)
        self._variable_attributes = [a for a in self._variable_attributes if a != attr]

    def markAsVariable(self, attr: str) -> None:
        """Make ``attr`` variable."""
        self._check(attr)
        if attr not in self._variable_attributes:
            self._variable_attributes.append(attr)

    def _check(self, attr):
        if attr not in self._allowed_attributes:
            raise AssertionError(messages.UNKNOWN_VARIABLE_ATTRIBUTE.format(attr=attr,
                                                                            allowed_attributes=self._allowed_attributes))

    def __repr__(self):
        return f"VariableAttributes(variable={self._variable_attributes})"


def given(**kwargs):
    """The keyword arguments the caller passed explicitly (not None)."""
    return {k: v for k, v in kwargs.items() if v is not None}


def resolve_accum_type(dtype: Optional[torch.dtype]) -> torch.dtype:
    """None -> torch.float32; anything but float16/float32 -> AssertionError."""
    if dtype is None:
        return torch.float32
    if dtype not in ACCUM_TYPES:
        raise AssertionError(messages.ACCUM_TYPE_ERROR)
    return dtype


def to_float(value) -> float:
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The precision updates are computed in: at least float32."""
    return torch.promote_types(dtype, torch.float32)


def storage_dtype(accum_type: torch.dtype, param: torch.Tensor) -> torch.dtype:
    """Where a state tensor lives: float16 when asked for, else the compute precision
    (so float16 parameters get float32 state, like PopART's default accumulators)."""
    return torch.float16 if accum_type == torch.float16 else compute_dtype(param.dtype)


def scalar_dtype() -> torch.dtype:
    """dtype of the ``step`` counters, as torch's optimizers store them."""
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def state_tensor(state: dict, key: str, param: torch.Tensor, dtype: torch.dtype,
                 fill: float = 0.0) -> torch.Tensor:
    """``state[key]`` in ``dtype`` on the parameter's device, created filled with ``fill``.
    A tensor loaded in another dtype (e.g. a torch state dict) is converted once."""
    t = state.get(key)
    if t is None:
        if fill == 0.0:
            t = torch.zeros_like(param, dtype=dtype, memory_format=torch.preserve_format)
        else:
            t = torch.full_like(param, fill, dtype=dtype, memory_format=torch.preserve_format)
        state[key] = t
    elif t.dtype != dtype or t.device != param.device:
        t = t.to(device=param.device, dtype=dtype)
        state[key] = t
    return t


def step_counters(states: list[dict]) -> list[torch.Tensor]:
    """The ``step`` tensors of these parameter states (created at 0), as torch keeps them."""
    steps = []
    for st in states:
        s = st.get("step")
        if s is None:
            s = st["step"] = torch.tensor(0.0, dtype=scalar_dtype())
        elif not torch.is_tensor(s):
            s = st["step"] = torch.tensor(float(s), dtype=scalar_dtype())
        steps.append(s)
    return steps


class _Mirror:
    """Compute-precision views of stored tensors. Tensors already in the compute dtype are
    used in place; the others are copied and written back by ``flush()``."""

    __slots__ = ("compute", "stored")

    def __init__(self, stored: list[torch.Tensor], dtype: torch.dtype):
        self.stored = stored
        self.compute = [t if t.dtype == dtype else t.to(dtype) for t in stored]

    def flush(self):
        for s, c in zip(self.stored, self.compute):
            if s is not c:
                s.copy_(c)


def mirror(stored: list[torch.Tensor], dtype: torch.dtype) -> _Mirror:
    return _Mirror(stored, dtype)


class Optimizer:
    """Base of openpop's optimizers (mixed into the torch optimizer class they extend).

    Subclasses list their optimizer-wide attributes in ``_optimizer_attrs`` (stored as
    attributes, saved by pickling) and their per-group attributes in ``_group_vars``; they
    implement ``_update(group, params, grads)``.
    """

    # Per-group attributes (stored in ``defaults`` / ``param_groups``).
    _group_vars: list[str] = []
    # Optimizer-wide attributes (stored on the optimizer object).
    _optimizer_attrs: list[str] = []
    # Optimizer-wide attributes that can be variable.
    _optimizer_vars: list[str] = ["loss_scaling"]

    loss_scaling: float = 1.0
    max_grad_norm: float = math.inf

    def _finish_init(self, explicit: dict[str, object]) -> None:
        """Record constant/variable attributes once the torch parent is initialised."""
        allowed = list(self.defaults) + list(self._optimizer_vars)
        variables = ["lr"] + [name for name in explicit if name in allowed]
        self.variable_attrs = VariableAttributes(variables, allowed)

    def _fill_group_defaults(self):
        for group in self.param_groups:
            for key, value in self.defaults.items():
                group.setdefault(key, value)

    # --- pickling / deepcopy / load_state_dict ------------------------------------------
    def __getstate__(self):
        state = super().__getstate__()
        for name in list(self._optimizer_attrs) + ["variable_attrs"]:
            if name in self.__dict__:
                state[name] = self.__dict__[name]
        return state

    def __setstate__(self, state):
        # torch's __setstate__ adds defaults["differentiable"]; an optimizer built without it
        # (LAMB) must not gain it in every group on load_state_dict or unpickling: a resumed run's
        # groups would differ from an uninterrupted run's, and PopTorch warns of the attribute.
        defaults = state.get("defaults", self.__dict__.get("defaults"))
        added = defaults is not None and "differentiable" not in defaults
        super().__setstate__(state)
        if added:
            self.defaults.pop("differentiable", None)
        self._fill_group_defaults()

    # --- step ---------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter that has a gradient; ``closure`` re-evaluates the
        loss (as in torch). Gradients are taken as already unscaled."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        work = []
        for group in self.param_groups:
            self._check_group(group)
            buckets: dict[tuple, list[torch.Tensor]] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError(messages.NO_SPARSE_GRADIENTS.format(self_type=type(self).__name__))
                buckets.setdefault((p.device, compute_dtype(p.dtype)), []).append(p)
            for (_, dtype), params in buckets.items():
                grads = [p.grad if p.grad.dtype == dtype else p.grad.to(dtype) for p in params]
                work.append((group, params, grads))
        if not work:
            return loss
        coefficient = self._clip_coefficient([g for _, _, grads in work for g in grads])
        for group, params, grads in work:
            if coefficient is not None:
                grads = foreach_mul(grads, coefficient.to(grads[0].device))
            self._update(group, params, grads)
        return loss

    def _check_group(self, group):
        """Raise for a group setting this optimizer cannot honour."""

    def _update(self, group, params, grads):  # pragma: no cover - abstract
        raise NotImplementedError

    def _clip_coefficient(self, grads: list[torch.Tensor]) -> Optional[torch.Tensor]:
        """``min(1, max_grad_norm / (||g|| + 1e-6))`` over all gradients of this optimizer,
        or None when clipping is off."""
        max_norm = getattr(self, "max_grad_norm", math.inf)
        if max_norm is None or math.isinf(max_norm):
            return None
        return updates.clip_coefficient(updates.FOREACH, grads, max_norm)
