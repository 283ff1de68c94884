"""How one optimizer step's gradients are formed from its micro-batches.

``GA * R`` micro-batches contribute to a step. Their gradients are summed (``Sum``) or averaged
(``Mean``, the default). The average is taken after accumulation (``Post``) or kept as a
running mean (``Running``, chosen automatically for float16 accumulators). The loss is
multiplied by the optimizer's ``loss_scaling`` before backward and gradients are divided by it
before the update, so loss scaling is numerically neutral but real.

Micro-batches that run concurrently (several devices, ``pipeline.py``) must not add their
gradients to ``.grad`` in the order they happen to finish: float addition is not associative, so
the weights would differ from run to run. Each computes its gradients on its own
(``torch.autograd.grad``), and they are added in micro-batch order - exactly the additions the
serial loop makes, so concurrent and serial runs agree bit for bit (running mean included). Only
the additions are serialised: a micro-batch that finishes before the one ahead of it leaves its
gradients to be added by that one's thread and moves on, so forward and backward passes keep
overlapping. The price is memory: a micro-batch's gradients live until its whole backward has
finished (and, if it finished early, until its turn) instead of being added as they appear.

For fp32 gradients the ``Post`` mean's ``1/(GA*R)`` is folded into the backward seed instead of
a pass over every gradient after accumulation: the same values up to float rounding, one fewer
sweep over the parameters per step (about 1% of a BERT-base step). Half-precision gradients keep
the division after accumulation, which is what protects small values from underflow.

With automatic loss scaling (``dynamic``, see ``loss_scaling.py``) the scale is read from the
optimizer at the start of every step, ``finish_step`` checks the unscaled gradients and returns
False for a step with inf/NaN gradients - the executor then skips ``optimizer.step()`` - and the
new scale is written back to the optimizer's ``loss_scaling``.
"""
import sys
import threading

import torch

from ..enums import MeanReductionStrategy, ReductionType
from .losses import backward


class GradientReduction:
    """One host call's gradient bookkeeping for ``params`` (the optimizer's parameters)."""

    def __init__(self, options, geometry, params, loss_scale: float, *, dynamic=None):
        training = options.Training
        self.params = params
        self.loss_scale = float(loss_scale)
        self.dynamic = dynamic  # a loss_scaling.BoundLossScaling, or None
        self.micro_batches = geometry.micro_batches_per_step
        self.mean = training.accumulation_and_replication_reduction_type == ReductionType.Mean
        self.running = self.mean and (training.meanAccumulationAndReplicationReductionStrategy
                                      == MeanReductionStrategy.Running)
        self.fold_mean = (self.mean and not self.running and dynamic is None
                          and all(p.dtype == torch.float32 for p in params))
        self._seed_scale = self._scale_for_backward()
        self._count = 0
        self.unordered = False  # set by backward_unordered: the step's mean is taken post hoc
        self._in_order = _InOrder()

    def start_step(self) -> None:
        self._count = 0
        if self.dynamic is not None:
            self.loss_scale = self.dynamic.scale
        self._seed_scale = self._scale_for_backward()
        self.unordered = False
        self._in_order.reset()

    def _scale_for_backward(self) -> float:
        return self.loss_scale / self.micro_batches if self.fold_mean else self.loss_scale

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate one micro-batch's loss into the accumulated gradients."""
        k = self._count
        if self.running:
            if k > 0:
                grads = self._grads()
                if grads:
                    torch._foreach_mul_(grads, k / (k + 1))
            backward(loss, self.loss_scale / (k + 1))
        else:
            backward(loss, self._seed_scale)
        self._count = k + 1

    def backward_unordered(self, loss: torch.Tensor) -> None:
        """``backward`` for micro-batches of replicas that hold their own weights (each adds into
        its replica's ``.grad``): no running mean over all of them, the step's mean is post hoc."""
        backward(loss, self._seed_scale)
        self.unordered = True
        self._count += 1

    def backward_in_order(self, loss: torch.Tensor, index: int, leaves, own_replica_weights: bool = False) -> None:
        """``backward`` of micro-batch ``index`` of the step, run concurrently with the others:
        its gradients for ``leaves`` are added to their ``.grad`` after every earlier micro-batch
        has added its own (see the module docstring), by this thread or - if an earlier one is
        not done yet - by the thread that adds the one just before it; nobody waits. With
        ``own_replica_weights`` (``leaves`` are a replica's own copies) the mean is post hoc, as
        in ``backward_unordered``."""
        running = self.running and not own_replica_weights
        grads = _gradients_of(loss, self.loss_scale / (index + 1) if running else self._seed_scale, leaves)

        def add():
            if running and index > 0:
                current = self._grads()
                if current:
                    torch._foreach_mul_(current, index / (index + 1))
            with torch.no_grad():
                for i in range(len(leaves)):
                    leaf, grad = leaves[i], grads[i]
                    if grad is None:
                        continue
                    if leaf.grad is None:
                        leaf.grad = grad if _ours_alone(grad) else grad.clone()
                    else:
                        leaf.grad.add_(grad)
            self.unordered = self.unordered or own_replica_weights
            self._count += 1

        self._in_order.submit(index, add)

    def release_turn(self, index: int) -> None:
        """Micro-batch ``index`` will add nothing (it failed): the later ones go on without it."""
        self._in_order.submit(index, None)

    def finish_step(self) -> bool:
        """Turn the accumulated gradients into the step's gradients. Returns whether the
        optimizer should apply them."""
        divisor = self.loss_scale
        if self.fold_mean:
            if self._count != self.micro_batches:
                divisor *= self._count / self.micro_batches
        elif self.mean and not (self.running and not self.unordered):
            divisor *= self._count
        grads = self._grads()
        if self.dynamic is not None:
            finite = _unscale_and_check(grads, 1.0 / divisor)
            self.loss_scale = self.dynamic.update(finite)
            return finite
        if grads and divisor != 1.0:
            torch._foreach_mul_(grads, 1.0 / divisor)
        return True

    def leaves_of(self, models):
        """Per replica model (replica 0 first), the tensors its micro-batches' backward fills the
        ``.grad`` of: its parameters that require grad, plus the optimizer's parameters that no
        module registers (shared by every replica)."""
        registered = {id(p) for p in models[0].parameters()}
        extra = [p for p in self.params if p.requires_grad and id(p) not in registered]
        return [[p for p in model.parameters() if p.requires_grad] + extra for model in models]

    def _grads(self):
        return [p.grad for p in self.params if p.grad is not None]


def _ours_alone(grad: torch.Tensor) -> bool:
    """Whether a gradient from ``torch.autograd.grad`` can become a ``.grad`` as it is, as
    AccumulateGrad would take it: a plain contiguous tensor nothing else refers to (autograd may
    return one tensor for several leaves, or a view; a hook may have kept it). Expected references:
    the tuple ``autograd.grad`` returned, the caller's local, this argument and getrefcount's."""
    return (grad.layout == torch.strided and grad._base is None and grad.is_contiguous()
            and sys.getrefcount(grad) <= 4)


def _gradients_of(loss: torch.Tensor, scale: float, leaves):
    """The gradients ``losses.backward(loss, scale)`` would accumulate into ``leaves``."""
    if scale != 1.0:
        loss = loss * scale
    seed = None if loss.dim() == 0 else torch.ones_like(loss)
    return torch.autograd.grad(loss, leaves, grad_outputs=seed, allow_unused=True)


class _InOrder:
    """Runs one piece of work per micro-batch of a step, in micro-batch order, without making a
    thread wait: work submitted ahead of its turn is queued, and the thread that runs the work
    before it runs it next. Each index is submitted once (again: ignored); None skips it."""

    _MISSING = object()

    def __init__(self):
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._next = 0
            self._queued = {}
            self._running = False

    def submit(self, index: int, work) -> None:
        with self._lock:
            if index < self._next or index in self._queued:
                return
            self._queued[index] = work
            if self._running:
                return  # the running thread takes it when its turn comes
            self._running = True
        while True:
            with self._lock:
                work = self._queued.pop(self._next, self._MISSING)
                if work is self._MISSING:
                    self._running = False
                    return
                self._next += 1
            if work is not None:
                work()


def _unscale_and_check(grads, factor: float) -> bool:
    """Multiply ``grads`` by ``factor`` in place; True if every element is finite."""
    by_device = {}
    for g in grads:
        by_device.setdefault(g.device, []).append(g)
    found = []
    for device, group in by_device.items():
        found_inf = torch.zeros(1, dtype=torch.float32, device=device)
        inv_scale = torch.full((1,), factor, dtype=torch.float32, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(group, found_inf, inv_scale)
        found.append(found_inf)
    return not any(bool(f.item()) for f in found)
