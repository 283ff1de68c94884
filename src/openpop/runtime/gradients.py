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

The loss scale comes from a scaler (``loss_scaling.py``) read at the start of every step. With
automatic loss scaling ``finish_step`` checks the unscaled gradients and returns False for a
step with inf/NaN gradients - the executor then skips ``optimizer.step()`` - and the new scale
is written back to the optimizer's ``loss_scaling``.

Replicas held apart (their own weights on other devices, or in other processes) are summed onto
replica 0's gradients by ``replica_sum`` at the start of ``finish_step``, before unscaling: every
process then checks the same reduced values. Such replicas accumulate their own gradients, so
their mean is never a running one.
"""
import enum
import sys
import threading
from typing import Optional

import torch

from ..torch_compat import amp_foreach_non_finite_check_and_unscale_, foreach_mul_
from .half_saturation import HalfOverflow
from .losses import backward


class MeanPolicy(enum.Enum):
    """How a step's ``N = GA x R`` micro-batch gradients become its gradient (loss scale ``s``).

    ========  ==================================  ====================================
    policy    seed of micro-batch ``k``'s backward  after the last micro-batch, divide by
    ========  ==================================  ====================================
    SUM       ``s``                               ``s``
    FOLDED    ``s / N``                           ``s`` (``s * n / N`` if only ``n`` ran)
    RUNNING   ``s / (k + 1)``, ``.grad *= k/(k+1)``  ``s``
    POST      ``s``                               ``s * n`` (``n`` micro-batches ran)
    ========  ==================================  ====================================
    """

    SUM = "sum"
    FOLDED = "folded"
    RUNNING = "running"
    POST = "post"

    @classmethod
    def choose(cls, settings, params, automatic_loss_scaling: bool, replicas_apart: bool) -> "MeanPolicy":
        """``Sum``; ``Running``, taken post hoc when replicas hold their own weights (each
        accumulates its own gradients: there is no running mean over all of them); a ``Post`` mean
        folded into the seed for fp32 gradients without automatic loss scaling (module docstring)."""
        if not settings.mean:
            return cls.SUM
        if settings.running_mean:
            return cls.POST if replicas_apart else cls.RUNNING
        if not automatic_loss_scaling and all(p.dtype == torch.float32 for p in params):
            return cls.FOLDED
        return cls.POST

    @classmethod
    def unfolded(cls, mean: bool, running: bool) -> "MeanPolicy":
        """The policy of a step whose backward seed is the loss scale itself (a compiled program's)."""
        return cls.RUNNING if running else cls.POST if mean else cls.SUM

    def divisor(self, loss_scale, ran: int, micro_batches: Optional[int] = None):
        """What the step's accumulated gradients are divided by (the table's last column), ``ran``
        of its ``micro_batches`` (default: all ran) micro-batches having run. ``loss_scale`` may be
        a 0-d tensor (a compiled program's, ``compiled/program.py``)."""
        if self is MeanPolicy.FOLDED and micro_batches is not None and ran != micro_batches:
            return loss_scale * (ran / micro_batches)
        if self is MeanPolicy.POST:
            return loss_scale * ran
        return loss_scale


class NoReduction:
    """The replicas' gradient sum when every replica shares replica 0's weights in one process."""

    def start_step(self, overlap: bool) -> None:
        pass

    def __call__(self) -> None:
        pass

    def all_true(self, flag: bool) -> bool:
        return flag


class ReplicaSum:
    """The replicas' gradient sum: local replicas with their own weights onto replica 0
    (``replicas.ReplicaModels``), then with the other processes' (``distributed_reduce``)."""

    def __init__(self, replicas, processes, trainable, micro_batches: int):
        self.replicas = replicas
        self.processes = processes
        self.trainable = trainable
        self.micro_batches = micro_batches

    def start_step(self, overlap: bool) -> None:
        self.processes.start_step(self.trainable, self.micro_batches, overlap=overlap)

    def __call__(self) -> None:
        self.replicas.reduce_gradients()
        self.processes.all_reduce(self.trainable)

    def all_true(self, flag: bool) -> bool:
        """Whether ``flag`` holds in every process."""
        return self.processes.all_true(flag)


class GradientReduction:
    """One host call's gradient bookkeeping for ``params`` (the optimizer's parameters):
    ``start_step``, a ``backward`` per micro-batch, then ``finish_step``.

    ``scaler``: the call's loss scaling (``loss_scaling.StaticLossScaling`` or the automatic
    ``BoundLossScaling``); ``trainable``: the parameters whose ``.grad`` a step sets;
    ``replica_sum``: sums the replicas' gradients held apart (on other devices or in other
    processes) onto these, first thing in ``finish_step``."""

    def __init__(self, policy: MeanPolicy, micro_batches: int, params, scaler, *, trainable=(),
                 replica_sum=None, watch_overflow=False):
        self.policy = policy
        self.params = params
        self.scaler = scaler
        self.replica_sum = replica_sum if replica_sum is not None else NoReduction()
        self.micro_batches = micro_batches
        self.loss_scale = scaler.scale
        self._count = 0
        self._in_order = _InOrder()
        # A float16 model run without saturation (half_saturation.py): a step whose losses or
        # gradients are not finite raises HalfOverflow before its update.
        self.watch_overflow = watch_overflow
        self._losses_finite = []
        # Gradients the processes do not sum (an optimizer parameter no module registers) can be
        # finite in one process and not in another: then the processes agree on the verdict.
        summed = {id(p) for p in trainable}
        self._verdict_is_local = any(p.requires_grad and id(p) not in summed for p in params)
        # A step starts from no gradients, as after zero_grad(set_to_none=True): a frozen
        # parameter's leftover .grad (set before the model was wrapped) would be applied.
        self._cleared = tuple({id(p): p for p in (*trainable, *params)}.values())

    @property
    def seed_scale(self) -> float:
        """What a micro-batch's loss is multiplied by before backward (not ``RUNNING``)."""
        return self.loss_scale / self.micro_batches if self.policy is MeanPolicy.FOLDED else self.loss_scale

    def start_step(self, overlap_reduction: bool = False) -> None:
        """``overlap_reduction``: the step's micro-batches run one after another in this thread,
        so the sum across processes may start during the last backward."""
        for p in self._cleared:
            p.grad = None
        self._count = 0
        self.loss_scale = self.scaler.scale
        self._losses_finite.clear()
        self._in_order.reset()
        self.replica_sum.start_step(overlap_reduction)

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate one micro-batch's loss into the accumulated gradients."""
        if self.watch_overflow:
            self._losses_finite.append(torch.isfinite(loss.detach()).all())
        k = self._count
        if self.policy is MeanPolicy.RUNNING:
            if k > 0:
                grads = self._grads()
                if grads:
                    foreach_mul_(grads, k / (k + 1))
            backward(loss, self.loss_scale / (k + 1))
        else:
            backward(loss, self.seed_scale)
        self._count = k + 1

    def backward_in_order(self, loss: torch.Tensor, index: int, leaves) -> None:
        """``backward`` of micro-batch ``index`` of the step, run concurrently with the others:
        its gradients for ``leaves`` are added to their ``.grad`` after every earlier micro-batch
        has added its own (see the module docstring), by this thread or - if an earlier one is
        not done yet - by the thread that adds the one just before it; nobody waits."""
        if self.watch_overflow:
            self._losses_finite.append(torch.isfinite(loss.detach()).all())
        running = self.policy is MeanPolicy.RUNNING
        grads = _gradients_of(loss, self.loss_scale / (index + 1) if running else self.seed_scale, leaves)

        def add():
            if running and index > 0:
                current = self._grads()
                if current:
                    foreach_mul_(current, index / (index + 1))
            with torch.no_grad():
                for i in range(len(leaves)):
                    leaf, grad = leaves[i], grads[i]
                    if grad is None:
                        continue
                    if leaf.grad is None:
                        leaf.grad = grad if _ours_alone(grad) else grad.clone()
                    else:
                        leaf.grad.add_(grad)
            self._count += 1

        self._in_order.submit(index, add)

    def release_turn(self, index: int) -> None:
        """Micro-batch ``index`` will add nothing (it failed): the later ones go on without it."""
        self._in_order.submit(index, None)

    def finish_step(self) -> bool:
        """Sum the replicas' gradients, turn them into the step's gradients. Returns whether the
        optimizer should apply them."""
        self.replica_sum()
        divisor = self.policy.divisor(self.loss_scale, self._count, self.micro_batches)
        grads = self._grads()
        if self.scaler.automatic:
            finite = _unscale_and_check(grads, 1.0 / divisor)
            if self._verdict_is_local:
                finite = self.replica_sum.all_true(finite)
            self.loss_scale = self.scaler.update(finite)
            return finite
        if self.watch_overflow:  # (summed gradients are the processes' sum by now; losses are each process's own)
            finite = _unscale_and_check(grads, 1.0 / divisor) if grads else True
            if not self.replica_sum.all_true(finite and all(bool(f) for f in self._losses_finite)):
                raise HalfOverflow()
            return True
        if grads and divisor != 1.0:
            foreach_mul_(grads, 1.0 / divisor)
        return True

    def finish_call(self) -> None:
        for p in self._cleared:
            p.grad = None

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
        amp_foreach_non_finite_check_and_unscale_(group, found_inf, inv_scale)
        found.append(found_inf)
    return not any(bool(f.item()) for f in found)
