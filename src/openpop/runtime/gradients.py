"""How one optimizer step's gradients are formed from its micro-batches.

``GA * R`` micro-batches contribute to a step. Their gradients are summed (``Sum``) or averaged
(``Mean``, the default). The average is taken after accumulation (``Post``) or kept as a
running mean (``Running``, chosen automatically for float16 accumulators). The loss is
multiplied by the optimizer's ``loss_scaling`` before backward and gradients are divided by it
before the update, so loss scaling is numerically neutral but real.
"""
import torch

from ..enums import MeanReductionStrategy, ReductionType
from .losses import backward


class GradientReduction:
    """One host call's gradient bookkeeping for ``params`` (the optimizer's parameters)."""

    def __init__(self, options, geometry, params, loss_scale: float):
        training = options.Training
        self.params = params
        self.loss_scale = float(loss_scale)
        self.micro_batches = geometry.micro_batches_per_step
        self.mean = training.accumulation_and_replication_reduction_type == ReductionType.Mean
        self.running = self.mean and (training.meanAccumulationAndReplicationReductionStrategy
                                      == MeanReductionStrategy.Running)
        self._count = 0

    def start_step(self) -> None:
        self._count = 0

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
            backward(loss, self.loss_scale)
        self._count = k + 1

    def finish_step(self) -> bool:
        """Turn the accumulated gradients into the step's gradients. Returns whether the
        optimizer should apply them."""
        divisor = self.loss_scale
        if self.mean and not self.running:
            divisor *= self._count
        grads = self._grads()
        if grads and divisor != 1.0:
            torch._foreach_mul_(grads, 1.0 / divisor)
        return True

    def _grads(self):
        return [p.grad for p in self.params if p.grad is not None]
