"""How one optimizer step's gradients are formed from its micro-batches.

``GA * R`` micro-batches contribute to a step. Their gradients are summed (``Sum``) or averaged
(``Mean``, the default). The average is taken after accumulation (``Post``) or kept as a
running mean (``Running``, chosen automatically for float16 accumulators). The loss is
multiplied by the optimizer's ``loss_scaling`` before backward and gradients are divided by it
before the update, so loss scaling is numerically neutral but real.

For fp32 gradients the ``Post`` mean's ``1/(GA*R)`` is folded into the backward seed instead of
a pass over every gradient after accumulation: the same values up to float rounding, one fewer
sweep over the parameters per step (about 1% of a BERT-base step). Half-precision gradients keep
the division after accumulation, which is what protects small values from underflow.

With automatic loss scaling (``dynamic``, see ``loss_scaling.py``) the scale is read from the
optimizer at the start of every step, ``finish_step`` checks the unscaled gradients and returns
False for a step with inf/NaN gradients - the executor then skips ``optimizer.step()`` - and the
new scale is written back to the optimizer's ``loss_scaling``.
"""
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
        self._lock = threading.Lock()

    def start_step(self) -> None:
        self._count = 0
        if self.dynamic is not None:
            self.loss_scale = self.dynamic.scale
        self._seed_scale = self._scale_for_backward()
        self.unordered = False

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
        """``backward`` for micro-batches that run concurrently (several devices): no running
        mean, so the order in which they finish does not matter."""
        backward(loss, self._seed_scale)
        with self._lock:
            self.unordered = True
            self._count += 1

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

    def _grads(self):
        return [p.grad for p in self.params if p.grad is not None]


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
