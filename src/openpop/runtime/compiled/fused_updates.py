"""The optimizer update of the unit "regions": LAMB's per-parameter math compiled once, for
every parameter.

The unit "regions" (``regions.py``) runs the optimizer's own ``step()``. openpop's eager LAMB
(``optim/lamb.py``) is a dozen ``torch._foreach_*`` ops, each a pass over every parameter: on
BERT-base (110 M parameters, 206 tensors) 0.53 s of a ~4.2 s fp32 step on a 2-core CPU. The same
math per parameter (``adaptive_updates.lamb``, the compiled program's), compiled with dynamic
shapes on the flattened tensors, is one compiled graph for every parameter whose kernels read each
tensor about twice: 0.14 s. ``FusedLamb`` takes the place of the optimizer's ``_update`` for a
host call (``step()``'s gradient gathering and clipping, LR schedulers' wrappers and the state
dictionary stay the optimizer's); buckets it does not cover (other dtypes, non-contiguous
tensors, state stored in float16) go to the optimizer's own ``_update``.

Other optimizers (SGD, Adam, AdamW, RMSprop) keep their eager ``step()`` under "regions": their
updates are fewer passes (SGD) or not measured yet (Adam, AdamW: the same shape of problem as
LAMB).
"""
import contextlib

import torch

from ...optim import _base
from ...optim.lamb import LAMB, MAX_WEIGHT_NORM
from .adaptive_updates import lamb


def _lamb_in_place(param, grad, step, exp_avg, exp_avg_sq, hyper, bias_correction: bool):
    names = ("lr", "beta1", "beta2", "eps", "weight_decay", "max_weight_norm")
    h = {name: hyper[i] for i, name in enumerate(names)}
    new, state = lamb(param, grad, {"step": step, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}, h,
                      bias_correction)
    param.copy_(new)
    exp_avg.copy_(state["exp_avg"])
    exp_avg_sq.copy_(state["exp_avg_sq"])
    step.copy_(state["step"])


_kernel = None  # the compiled _lamb_in_place, shared by every optimizer of the process


def _compiled():
    global _kernel
    if _kernel is None:
        _kernel = torch.compile(_lamb_in_place, dynamic=True)
    return _kernel


class FusedLamb:
    """``optimizer._update`` for the host calls of the unit "regions" (module docstring)."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self._own = optimizer._update  # the class's, bound

    @staticmethod
    def supports(optimizer) -> bool:
        """openpop's LAMB, its update not overridden, its moments stored in float32."""
        if not isinstance(optimizer, LAMB) or type(optimizer)._update is not LAMB._update \
                or "_update" in vars(optimizer):
            return False
        return all(getattr(optimizer, name, None) in (None, torch.float32)
                   for name in ("first_order_momentum_accum_type", "second_order_momentum_accum_type"))

    @contextlib.contextmanager
    def installed(self):
        vars(self.optimizer)["_update"] = self
        try:
            yield
        finally:
            vars(self.optimizer).pop("_update", None)

    def __call__(self, group, params, grads):
        if not all(t.dtype == torch.float32 and t.is_contiguous() for t in (*params, *grads)):
            return self._own(group, params, grads)
        optimizer = self.optimizer
        max_weight_norm = group.get("max_weight_norm")
        hyper = torch.tensor([_base.to_float(group["lr"]), *(_base.to_float(b) for b in group["betas"]),
                              _base.to_float(group["eps"]), _base.to_float(group["weight_decay"]),
                              MAX_WEIGHT_NORM if max_weight_norm is None else _base.to_float(max_weight_norm)],
                             dtype=torch.float32, device=params[0].device)
        states = [optimizer.state[p] for p in params]
        steps = _base.step_counters(states)
        kernel = _compiled()
        for param, grad, state, step in zip(params, grads, states, steps):
            exp_avg = _base.state_tensor(state, "exp_avg", param, torch.float32)
            exp_avg_sq = _base.state_tensor(state, "exp_avg_sq", param, torch.float32)
            if not (exp_avg.is_contiguous() and exp_avg_sq.is_contiguous() and step.dtype == torch.float32):
                self._own(group, [param], [grad])
                continue
            kernel(param.view(-1), grad.view(-1), step, exp_avg.view(-1), exp_avg_sq.view(-1), hyper,
                   bool(optimizer.bias_correction))


def warm_up(optimizer, device) -> None:
    """Compile the kernel now (``compile()``), on scratch tensors."""
    scratch = [torch.ones(8, device=device) for _ in range(4)]
    _compiled()(scratch[0], scratch[1], torch.zeros((), device=device), scratch[2], scratch[3],
                torch.tensor([1e-3, 0.9, 0.999, 1e-6, 0.01, MAX_WEIGHT_NORM], device=device),
                bool(optimizer.bias_correction))
