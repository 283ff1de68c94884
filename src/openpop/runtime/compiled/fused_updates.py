"""The optimizer update of the unit "regions": LAMB's per-parameter math, compiled.

The unit "regions" (``regions.py``) runs the optimizer's own ``step()``. openpop's eager LAMB
(``optim/lamb.py``) is a dozen ``torch._foreach_*`` ops, each a pass over every parameter: on
BERT-base (110 M parameters, 206 tensors) 0.53 s of a ~4.2 s fp32 step on a 2-core CPU. The same
math per parameter (``adaptive_updates.lamb``, the compiled program's), compiled with dynamic
shapes on the flattened tensors - one graph per shape class of the parameters (rank, size),
whose kernels read each tensor about twice - takes 0.14 s.

``FusedLamb`` takes the place of the optimizer's ``_update`` for a host call; ``step()``'s
gradient gathering and clipping, LR schedulers' wrappers and the state dictionary stay the
optimizer's. Parameters it does not cover (other dtypes, non-contiguous tensors, moments stored
in float16, float64 step counters) go to the optimizer's own ``_update``. Not equal to eager:
two parameters sharing memory (eager computes both updates from the same weights, the kernel
one after the other).

Other optimizers (SGD, Adam, AdamW, RMSprop) keep their eager ``step()`` under "regions": their
updates are fewer passes (SGD) or not measured yet (Adam, AdamW: the same shape of problem as
LAMB).
"""
import contextlib

import torch

from ...optim import _base
from ...optim.lamb import LAMB, MAX_WEIGHT_NORM
from .adaptive_updates import lamb

_HYPER = ("lr", "beta1", "beta2", "eps", "weight_decay", "max_weight_norm", "one_minus_beta1", "one_minus_beta2",
          "correction1", "correction2")
# Dynamo compiles one graph per shape class of the flattened tensors (rank of the parameter,
# size 0 / 1 / up to 4096 / larger, bias correction on or off): more than its default limit of 8
# for a process with several optimizers; past the limit it would run the math uncompiled.
RECOMPILE_LIMIT = 64


def _lamb_in_place(param, grad, step, exp_avg, exp_avg_sq, hyper, bias_correction: bool):
    h = {name: hyper[i] for i, name in enumerate(_HYPER)}
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


def _hyper(group, step_count, bias_correction, device):
    """The kernel's hyperparameters; ``1 - beta`` and ``1 - beta ** step`` in double precision, as
    ``optim/lamb.py`` computes them."""
    to_float = _base.to_float
    beta1, beta2 = (to_float(b) for b in group["betas"])
    max_weight_norm = group.get("max_weight_norm")
    corrections = (1.0 - beta1 ** step_count, 1.0 - beta2 ** step_count) if bias_correction else (1.0, 1.0)
    return torch.tensor([to_float(group["lr"]), beta1, beta2, to_float(group["eps"]), to_float(group["weight_decay"]),
                         MAX_WEIGHT_NORM if max_weight_norm is None else to_float(max_weight_norm),
                         1.0 - beta1, 1.0 - beta2, *corrections], dtype=torch.float32, device=device)


def _fusable(*tensors) -> bool:
    return all(t.dtype == torch.float32 and t.is_contiguous() for t in tensors)


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
        own = vars(self.optimizer).get("_update")
        vars(self.optimizer)["_update"] = self
        try:
            yield
        finally:
            if own is None:
                vars(self.optimizer).pop("_update", None)
            else:
                vars(self.optimizer)["_update"] = own

    def __call__(self, group, params, grads):
        optimizer = self.optimizer
        bias_correction = bool(optimizer.bias_correction)
        states = [optimizer.state[p] for p in params]
        steps = _base.step_counters(states)
        kernel = _compiled()
        shared = None if bias_correction else _hyper(group, 0, False, params[0].device)
        rest = []  # (param, grad) the optimizer's own update takes
        with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
            for param, grad, state, step in zip(params, grads, states, steps):
                if not (_fusable(param, grad) and step.dtype == torch.float32):
                    rest.append((param, grad))
                    continue
                exp_avg = _base.state_tensor(state, "exp_avg", param, torch.float32)
                exp_avg_sq = _base.state_tensor(state, "exp_avg_sq", param, torch.float32)
                if not _fusable(exp_avg, exp_avg_sq):
                    rest.append((param, grad))
                    continue
                hyper = shared if shared is not None else _hyper(group, step.item() + 1, True, param.device)
                kernel(param.view(-1), grad.view(-1), step, exp_avg.view(-1), exp_avg_sq.view(-1), hyper,
                       bias_correction)
        if rest:
            self._own(group, [p for p, _ in rest], [g for _, g in rest])


def warm_up(optimizer) -> None:
    """Compile the kernel now (``compile()``): on a zeroed copy of one parameter of each shape
    class the optimizer holds, as ``step()`` calls it (no gradients recorded)."""
    classes = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            n = p.numel()
            classes.setdefault((p.dim(), min(n, 2), n > 4096), (group, p))
    bias_correction = bool(optimizer.bias_correction)
    with torch.no_grad(), torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
        for group, p in classes.values():
            if not _fusable(p):
                continue
            scratch = [torch.zeros_like(p) for _ in range(4)]
            step = torch.tensor(0.0, dtype=_base.scalar_dtype())
            if step.dtype == torch.float32:
                _compiled()(scratch[0].view(-1), scratch[1].view(-1), step, scratch[2].view(-1),
                            scratch[3].view(-1), _hyper(group, 1, bias_correction, p.device), bias_correction)
