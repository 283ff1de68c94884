"""GradientReduction, directly: how one optimizer step's gradient is formed from its GA*R
micro-batches, for every combination of reduction (Mean/Sum), mean strategy (Running, Post,
PostAndLoss), loss scaling (static, automatic), parameter dtype, replicas sharing weights or
holding their own (apart), and micro-batches run serially or concurrently (added in order) -
against hand-computed expectations.

Micro-batch ``k`` of a step has the loss ``(w * c_k).sum()``, so the gradient it contributes is
exactly ``c_k``: the step's gradient must be ``sum(c_k)`` (Sum) or ``sum(c_k) / (GA*R)`` (Mean),
whatever the loss scale, and the gradient arriving at ``w`` in each backward is ``c_k`` times the
seed the policy prescribes."""
import itertools
from typing import NamedTuple

import pytest
import torch

import poptorch
from openpop.runtime.gradients import GradientReduction, MeanPolicy
from openpop.runtime.precision import RunPrecision
from openpop.runtime.settings import RunSettings

GA, R = 3, 2
MICRO = GA * R  # micro-batches per step; index k = accumulation * R + replica
Mean, Sum = poptorch.ReductionType.Mean, poptorch.ReductionType.Sum
Running, Post, PostAndLoss = (poptorch.MeanReductionStrategy.Running, poptorch.MeanReductionStrategy.Post,
                              poptorch.MeanReductionStrategy.PostAndLoss)

# loss scaling: (optimizer's loss_scaling, automatic, a micro-batch overflows, scale after the step)
SCALINGS = {
    "none": (1.0, False, False, 1.0),
    "static": (8.0, False, False, 8.0),
    "automatic": (8.0, True, False, 16.0),          # growth_interval=1: one finite step doubles it
    "automatic_overflow": (8.0, True, True, 4.0),   # backoff 0.5, the step is skipped
}


class Case(NamedTuple):
    reduction: poptorch.ReductionType
    strategy: poptorch.MeanReductionStrategy
    scaling: str
    dtype: torch.dtype
    apart: bool        # replicas hold their own weights (and gradients), summed onto replica 0's
    concurrent: bool   # backward_in_order, micro-batches submitted last first

    @property
    def id(self):
        return "-".join([self.reduction.name, self.strategy.name, self.scaling, str(self.dtype)[6:],
                         "apart" if self.apart else "shared", "concurrent" if self.concurrent else "serial"])


CASES = [Case(*values) for values in itertools.product(
    (Mean, Sum), (Running, Post, PostAndLoss), SCALINGS, (torch.float32, torch.float16), (False, True), (False, True))]


def contribution(k, dtype, overflow=False):
    """The gradient micro-batch ``k`` contributes (exact in float16 too)."""
    c = torch.tensor([1.0, -2.0, 0.5, 4.0]) * (k + 1)
    if overflow and k == 2:
        c[1] = float("inf")
    return c.to(dtype)


def make_reduction(case, params, optimizer):
    """The step's GradientReduction as the executor builds it, from public options."""
    options = poptorch.Options().replicationFactor(R)
    options.Training.gradientAccumulation(GA)
    options.Training.accumulationAndReplicationReductionType(case.reduction)
    options.Training.setMeanAccumulationAndReplicationReductionStrategy(case.strategy)
    if SCALINGS[case.scaling][1]:
        options.Training.setAutomaticLossScaling(True, growth_interval=1)
    settings = RunSettings.from_options(options, training=True)
    scaler = RunPrecision(options).loss_scaler(optimizer)
    policy = MeanPolicy.choose(settings, params, scaler.automatic, replicas_apart=case.apart)
    return GradientReduction(policy, settings.geometry.micro_batches_per_step, params, scaler)


def run_step(case, seeds=None, loss_scaling=None):
    """One step of ``case``: (replica 0's gradient after finish_step, whether to apply it,
    the optimizer). ``seeds[k]`` records the gradient reaching the weights in micro-batch k."""
    scale, _, overflow, _ = SCALINGS[case.scaling]
    w = torch.zeros(4, dtype=case.dtype, requires_grad=True)
    optimizer = poptorch.optim.SGD([w], lr=1.0, loss_scaling=scale if loss_scaling is None else loss_scaling)
    reduction = make_reduction(case, [w], optimizer)
    replicas = [w] + [w.detach().clone().requires_grad_() for _ in range(R - 1)] if case.apart else [w] * R
    for r, weights in enumerate(replicas[:R if case.apart else 1]):
        weights.register_hook(lambda grad, r=r: _record(seeds, r, grad))
    reduction.start_step()
    order = reversed(range(MICRO)) if case.concurrent else range(MICRO)
    for k in order:
        weights = replicas[k % R]
        loss = (weights * contribution(k, case.dtype, overflow)).sum()
        if case.concurrent:
            reduction.backward_in_order(loss, k, [weights])
        else:
            reduction.backward(loss)
    if case.apart:  # what the replicas' gradient sum does: onto replica 0, in replica order
        with torch.no_grad():
            for other in replicas[1:]:
                w.grad.add_(other.grad)
    apply = reduction.finish_step()
    return w.grad, apply, optimizer


def _record(seeds, replica, grad):
    if seeds is not None:
        seeds.append(grad.detach().clone())


def expected_gradient(case):
    total = sum(contribution(k, torch.float64) for k in range(MICRO))
    return total / MICRO if case.reduction == Mean else total


def expected_seed(case, k, scale):
    """The factor micro-batch ``k``'s loss gradient is scaled by in backward: the loss scale,
    divided by the micro-batch count when the mean is folded into the seed (float32, Post,
    static scaling), by ``k + 1`` for a running mean over weights the replicas share."""
    if case.reduction == Sum:
        return scale
    if case.strategy == Running:
        return scale if case.apart else scale / (k + 1)
    folded = case.dtype == torch.float32 and not SCALINGS[case.scaling][1]
    return scale / MICRO if folded else scale


def tolerance(dtype):
    return dict(atol=0, rtol=1e-6) if dtype == torch.float32 else dict(atol=0, rtol=2e-3)


@pytest.mark.parametrize("case", [c for c in CASES if not SCALINGS[c.scaling][2]], ids=lambda c: c.id)
def test_step_gradient_is_the_sum_or_mean_whatever_the_loss_scale(case):
    grad, apply, optimizer = run_step(case)
    assert apply
    assert grad.dtype == case.dtype
    torch.testing.assert_close(grad.double(), expected_gradient(case), **tolerance(case.dtype))
    assert optimizer.loss_scaling == SCALINGS[case.scaling][3]


@pytest.mark.parametrize("case", [c for c in CASES if c.scaling == "automatic_overflow"], ids=lambda c: c.id)
def test_automatic_loss_scaling_skips_an_overflowing_step_and_backs_off(case):
    grad, apply, optimizer = run_step(case)
    assert not apply
    assert not torch.isfinite(grad).all()
    assert optimizer.loss_scaling == SCALINGS[case.scaling][3]


@pytest.mark.parametrize("case", [c for c in CASES if not SCALINGS[c.scaling][2] and not c.concurrent],
                         ids=lambda c: c.id)
def test_backward_seed_per_micro_batch(case):
    seeds = []
    run_step(case, seeds)
    scale = SCALINGS[case.scaling][0]
    assert len(seeds) == MICRO
    for k, seen in enumerate(seeds):
        expected = contribution(k, torch.float64) * expected_seed(case, k, scale)
        torch.testing.assert_close(seen.double(), expected, **tolerance(case.dtype), msg=f"micro-batch {k}")


@pytest.mark.parametrize("case", [c for c in CASES if c.concurrent and not SCALINGS[c.scaling][2]],
                         ids=lambda c: c.id)
def test_concurrent_micro_batches_add_as_the_serial_loop_does_bit_for_bit(case):
    concurrent, _, _ = run_step(case)
    serial, _, _ = run_step(case._replace(concurrent=False))
    assert torch.equal(concurrent, serial)


@pytest.mark.parametrize("strategy", [Running, Post])
def test_automatic_scale_is_read_from_the_optimizer_at_every_step_start(strategy):
    case = Case(Mean, strategy, "automatic", torch.float32, False, False)
    w = torch.zeros(4, requires_grad=True)
    optimizer = poptorch.optim.SGD([w], lr=1.0, loss_scaling=8.0)
    reduction = make_reduction(case, [w], optimizer)
    seeds = []
    w.register_hook(lambda grad: seeds.append(grad.clone()))
    optimizer.loss_scaling = 2.0  # the user's change between steps is where scaling continues from
    reduction.start_step()
    for k in range(MICRO):
        reduction.backward((w * contribution(k, torch.float32)).sum())
    assert reduction.finish_step()
    torch.testing.assert_close(seeds[0], contribution(0, torch.float32) * 2.0)
    torch.testing.assert_close(w.grad.double(), expected_gradient(case), atol=0, rtol=1e-6)
    assert optimizer.loss_scaling == 4.0
