"""The optimizer update of the unit "regions": LAMB's, Adam's and AdamW's per-parameter math,
compiled.

The unit "regions" (``regions.py``) runs the optimizer's own ``step()``. openpop's eager LAMB
(``optim/updates.py`` with its foreach ops) is a dozen ``torch._foreach_*`` ops, each a pass over
every parameter: on BERT-base (110 M parameters, 206 tensors) 0.53 s of a ~4.2 s fp32 step on a
2-core CPU; Adam and AdamW are about ten. The same update per parameter (``optim/updates.py``'s
with pure ops, as the compiled program runs it), compiled with dynamic shapes on the flattened
tensors - one graph per shape class of the parameters (rank, size) and static choice, whose
kernels read each tensor about twice - takes 0.14 s for LAMB.

``FusedUpdate`` takes the place of the optimizer's ``_update`` for a host call; ``step()``'s
gradient gathering and clipping, LR schedulers' wrappers and the state dictionary stay the
optimizer's. Parameters it does not cover (other dtypes, non-contiguous tensors, moments stored
in float16, float64 step counters) go to the optimizer's own ``_update``. Not equal to eager:
two parameters sharing memory (eager computes both updates from the same weights, the kernel
one after the other). SGD and RMSprop keep their eager ``step()`` (SGD's update is one or two
passes).
"""
import contextlib

import torch

from ... import torch_compat
from ...optim import _base, updates
from ...optim.adam import _AdamBase
from ...optim.lamb import LAMB

_HYPER = ("lr", "beta1", "beta2", "eps", "weight_decay", "max_weight_norm", "one_minus_beta1", "one_minus_beta2",
          "correction1", "correction2", "decay")
# Dynamo compiles one graph per shape class of the flattened tensors (rank of the parameter,
# size 0 / 1 / up to 4096 / larger) and static choice (optimizer, bias correction, ...): more
# than its default limit of 8 in a process with several optimizers; past the limit it would run
# the math uncompiled.
RECOMPILE_LIMIT = 64


def _in_place(param, grad, step, exp_avg, exp_avg_sq, hyper, choices: tuple):
    """``choices``: ``("lamb", bias_correction)`` or ``("adam", maximize, decoupled, bias_correction)``."""
    h = {name: hyper[i] for i, name in enumerate(_HYPER)}
    tensors = ([param], [grad], [exp_avg], [exp_avg_sq], [step])
    if choices[0] == "lamb":
        new = updates.lamb(updates.PURE, *tensors, h, bias_correction=choices[1])
    else:
        new = updates.adam(updates.PURE, *tensors, h, maximize=choices[1], decoupled=choices[2],
                           bias_correction=choices[3])
    for target, (value,) in zip((param, exp_avg, exp_avg_sq, step), new):
        target.copy_(value)


_kernel = None  # the compiled _in_place, shared by every optimizer of the process


def _compiled():
    global _kernel
    if _kernel is None:
        _kernel = torch.compile(_in_place, dynamic=True)
    return _kernel


def _hyper(group, step_count, bias_correction, device):
    """The kernel's hyperparameters; ``1 - beta``, ``1 - beta ** step`` and ``1 - lr *
    weight_decay`` in double precision, as the eager optimizers compute them."""
    h = updates.hyperparameters("lamb", group, _base.to_float)  # Adam's and max_weight_norm
    lr, weight_decay, beta1, beta2 = h["lr"], h["weight_decay"], h["beta1"], h["beta2"]
    corrections = (1.0 - beta1 ** step_count, 1.0 - beta2 ** step_count) if bias_correction else (1.0, 1.0)
    return torch.tensor([lr, beta1, beta2, h["eps"], weight_decay, h["max_weight_norm"],
                         1.0 - beta1, 1.0 - beta2, *corrections, 1.0 - lr * weight_decay],
                        dtype=torch.float32, device=device)


def _fusable(*tensors) -> bool:
    return all(t.dtype == torch.float32 and t.is_contiguous() for t in tensors)


class FusedUpdate:
    """``optimizer._update`` for the host calls of the unit "regions" (module docstring)."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self._own = optimizer._update  # the class's, bound

    @staticmethod
    def supports(optimizer) -> bool:
        """openpop's LAMB, Adam or AdamW, its update not overridden, its moments stored in float32."""
        family = LAMB if isinstance(optimizer, LAMB) else _AdamBase if isinstance(optimizer, _AdamBase) else None
        if family is None or type(optimizer)._update is not family._update or "_update" in vars(optimizer):
            return False
        return all(getattr(optimizer, name, None) in (None, torch.float32)
                   for name in ("first_order_momentum_accum_type", "second_order_momentum_accum_type"))

    def _choices(self, group) -> tuple:
        """The static choices of the kernel for ``group``; the last one is bias correction."""
        optimizer = self.optimizer
        if isinstance(optimizer, LAMB):
            return ("lamb", bool(optimizer.bias_correction))
        decoupled = optimizer._decoupled or bool(group.get("decoupled_weight_decay", False))
        return ("adam", bool(group.get("maximize", False)), decoupled, bool(optimizer._bias_correction()))

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
        choices = self._choices(group)
        bias_correction = choices[-1]
        states = [optimizer.state[p] for p in params]
        steps = _base.step_counters(states)
        kernel = _compiled()
        hypers = {}  # per step count (bias correction; parameters of a group usually share one)
        rest = []  # (param, grad) the optimizer's own update takes
        with torch_compat.dynamo_config.patch(recompile_limit=RECOMPILE_LIMIT):
            for param, grad, state, step in zip(params, grads, states, steps):
                if not (_fusable(param, grad) and step.dtype == torch.float32):
                    rest.append((param, grad))
                    continue
                exp_avg = _base.state_tensor(state, "exp_avg", param, torch.float32)
                exp_avg_sq = _base.state_tensor(state, "exp_avg_sq", param, torch.float32)
                if not _fusable(exp_avg, exp_avg_sq):
                    rest.append((param, grad))
                    continue
                count = step.item() + 1 if bias_correction else 0
                if (count, param.device) not in hypers:
                    hypers[count, param.device] = _hyper(group, count, bias_correction, param.device)
                hyper = hypers[count, param.device]
                kernel(param.view(-1), grad.view(-1), step, exp_avg.view(-1), exp_avg_sq.view(-1), hyper, choices)
        if rest:
            self._own(group, [p for p, _ in rest], [g for _, g in rest])

    def warm_up(self) -> None:
        """Compile the kernel now (``compile()``): on a zeroed copy of one parameter of each
        shape class and group choice, as ``step()`` calls it (no gradients recorded)."""
        if _base.scalar_dtype() != torch.float32:  # (float64 step counters: the optimizer's own update)
            return
        classes = {}
        for group in self.optimizer.param_groups:
            choices = self._choices(group)
            for p in group["params"]:
                n = p.numel()
                classes.setdefault((p.dim(), min(n, 2), n > 4096, choices), (group, p, choices))
        with torch.no_grad(), torch_compat.dynamo_config.patch(recompile_limit=RECOMPILE_LIMIT):
            for group, p, choices in classes.values():
                if not _fusable(p):
                    continue
                scratch = [torch.zeros_like(p).view(-1) for _ in range(4)]
                _compiled()(scratch[0], scratch[1], torch.tensor(0.0), scratch[2], scratch[3],
                            _hyper(group, 1, choices[-1], p.device), choices)
