"""MeanPolicy and GradientReduction on their own: every reduction combination against the
plain sum/mean of the micro-batches' gradients."""
import pytest
import torch

import poptorch
from openpop.runtime.gradients import GradientReduction, MeanPolicy, NoReduction
from openpop.runtime.loss_scaling import DynamicLossScaling, StaticLossScaling
from openpop.runtime.settings import RunSettings


def settings(reduction=poptorch.ReductionType.Mean, strategy=poptorch.MeanReductionStrategy.Post):
    opts = poptorch.Options()
    opts.Training.accumulationAndReplicationReductionType(reduction)
    opts.Training.setMeanAccumulationAndReplicationReductionStrategy(strategy)
    return RunSettings.from_options(opts, training=True)


FP32 = [torch.nn.Parameter(torch.zeros(3))]
FP16 = [torch.nn.Parameter(torch.zeros(3, dtype=torch.float16))]


@pytest.mark.parametrize("reduction, strategy, params, automatic, apart, expected", [
    (poptorch.ReductionType.Sum, poptorch.MeanReductionStrategy.Running, FP32, False, False, MeanPolicy.SUM),
    (poptorch.ReductionType.Mean, poptorch.MeanReductionStrategy.Post, FP32, False, False, MeanPolicy.FOLDED),
    (poptorch.ReductionType.Mean, poptorch.MeanReductionStrategy.Post, FP32, False, True, MeanPolicy.FOLDED),
    (poptorch.ReductionType.Mean, poptorch.MeanReductionStrategy.Post, FP32, True, False, MeanPolicy.POST),
    (poptorch.ReductionType.Mean, poptorch.MeanReductionStrategy.Post, FP16, False, False, MeanPolicy.POST),
    (poptorch.ReductionType.Mean, poptorch.MeanReductionStrategy.Running, FP32, False, False, MeanPolicy.RUNNING),
    (poptorch.ReductionType.Mean, poptorch.MeanReductionStrategy.Running, FP32, False, True, MeanPolicy.POST),
])
def test_mean_policy_choice(reduction, strategy, params, automatic, apart, expected):
    assert MeanPolicy.choose(settings(reduction, strategy), params, automatic, apart) is expected


class _Optimizer:
    def __init__(self, loss_scaling):
        self.loss_scaling = loss_scaling


def _losses(weight, xs):
    return [(weight * x).sum() for x in xs]


@pytest.mark.parametrize("policy", list(MeanPolicy))
@pytest.mark.parametrize("loss_scaling", [1.0, 8.0])
def test_each_policy_gives_the_sum_or_mean_of_the_micro_batch_gradients(policy, loss_scaling):
    xs = [torch.randn(3) for _ in range(4)]
    weight = torch.nn.Parameter(torch.randn(3))
    reduction = GradientReduction(policy, len(xs), [weight], StaticLossScaling(_Optimizer(loss_scaling)),
                                  trainable=(weight,))
    reduction.start_step()
    for loss in _losses(weight, xs):
        reduction.backward(loss)
    assert reduction.finish_step()
    total = torch.stack(xs).sum(0)
    expected = total if policy is MeanPolicy.SUM else total / len(xs)
    torch.testing.assert_close(weight.grad, expected)
    reduction.finish_call()
    assert weight.grad is None


@pytest.mark.parametrize("policy", [MeanPolicy.FOLDED, MeanPolicy.POST])
def test_mean_of_a_step_cut_short_divides_by_the_micro_batches_that_ran(policy):
    xs = [torch.randn(3) for _ in range(4)]
    weight = torch.nn.Parameter(torch.randn(3))
    reduction = GradientReduction(policy, len(xs), [weight], StaticLossScaling(_Optimizer(1.0)))
    reduction.start_step()
    for loss in _losses(weight, xs[:3]):
        reduction.backward(loss)
    reduction.finish_step()
    torch.testing.assert_close(weight.grad, torch.stack(xs[:3]).mean(0))


def test_in_order_backward_matches_serial_running_mean_bit_for_bit():
    xs = [torch.randn(5) * 10 ** i for i in range(5)]

    def serial():
        weight = torch.nn.Parameter(torch.ones(5))
        reduction = GradientReduction(MeanPolicy.RUNNING, len(xs), [weight], StaticLossScaling(_Optimizer(2.0)))
        reduction.start_step()
        for loss in _losses(weight, xs):
            reduction.backward(loss)
        reduction.finish_step()
        return weight.grad

    weight = torch.nn.Parameter(torch.ones(5))
    reduction = GradientReduction(MeanPolicy.RUNNING, len(xs), [weight], StaticLossScaling(_Optimizer(2.0)))
    reduction.start_step()
    losses = _losses(weight, xs)
    for index in [3, 1, 4, 0, 2]:  # finishing out of order: added in micro-batch order
        reduction.backward_in_order(losses[index], index, [weight])
    reduction.finish_step()
    assert torch.equal(weight.grad, serial())


class _RecordingSum(NoReduction):
    def __init__(self, weight):
        self.weight = weight
        self.seen = []
        self.overlap = None

    def start_step(self, overlap):
        self.overlap = overlap

    def __call__(self):
        self.seen.append(self.weight.grad.clone())
        self.weight.grad.mul_(2)  # another replica's identical gradients


def test_replica_sum_runs_inside_finish_step_on_scaled_gradients():
    x = torch.randn(3)
    weight = torch.nn.Parameter(torch.randn(3))
    summed = _RecordingSum(weight)
    reduction = GradientReduction(MeanPolicy.SUM, 1, [weight], StaticLossScaling(_Optimizer(4.0)),
                                  replica_sum=summed)
    reduction.start_step(overlap_reduction=True)
    assert summed.overlap is True
    reduction.backward((weight * x).sum())
    assert summed.seen == []
    reduction.finish_step()
    torch.testing.assert_close(summed.seen[0], 4.0 * x)  # before unscaling: every process sees the same
    torch.testing.assert_close(weight.grad, 2 * x)


def test_automatic_loss_scaling_skips_non_finite_steps_and_backs_off():
    optimizer = _Optimizer(16.0)
    scaler = DynamicLossScaling(growth_interval=2).bind(optimizer)
    assert scaler.automatic and not StaticLossScaling(optimizer).automatic
    weight = torch.nn.Parameter(torch.ones(2))
    reduction = GradientReduction(MeanPolicy.POST, 1, [weight], scaler)
    reduction.start_step()
    reduction.backward((weight * torch.tensor([1.0, float("inf")])).sum())
    assert not reduction.finish_step()
    assert optimizer.loss_scaling == 8.0
    for _ in range(2):
        reduction.start_step()
        weight.grad = None
        reduction.backward((weight * torch.tensor([1.0, 3.0])).sum())
        assert reduction.finish_step()
    torch.testing.assert_close(weight.grad, torch.tensor([1.0, 3.0]))
    assert optimizer.loss_scaling == 16.0  # grown after growth_interval finite steps


class _OtherProcesses:
    """A replica sum across processes: records what this process says, answers for all."""

    def __init__(self, others_agree: bool):
        self.others_agree = others_agree
        self.said = []

    def start_step(self, overlap):
        pass

    def __call__(self):
        pass

    def all_true(self, flag):
        self.said.append(flag)
        return flag and self.others_agree


@pytest.mark.parametrize("summed", [True, False])
def test_automatic_loss_scaling_agrees_with_the_other_processes_on_unsummed_gradients(summed):
    # An optimizer parameter that no process sums (``trainable`` excludes it) may overflow in
    # another process alone: every process must skip that step and back off alike.
    optimizer = _Optimizer(16.0)
    weight = torch.nn.Parameter(torch.ones(2))
    others = _OtherProcesses(others_agree=False)
    reduction = GradientReduction(MeanPolicy.POST, 1, [weight], DynamicLossScaling().bind(optimizer),
                                  trainable=(weight,) if summed else (), replica_sum=others)
    reduction.start_step()
    reduction.backward((weight * torch.tensor([1.0, 3.0])).sum())
    finite = reduction.finish_step()
    if summed:  # (every process sees the same summed gradients: nothing to agree on)
        assert finite and others.said == [] and optimizer.loss_scaling == 16.0
    else:
        assert not finite and others.said == [True] and optimizer.loss_scaling == 8.0


def test_float16_watch_tells_the_other_processes_of_an_unsummed_overflow():
    from openpop.runtime.half_saturation import HalfOverflow
    weight = torch.nn.Parameter(torch.full((2,), 1e-3, dtype=torch.float16))  # a finite loss, an inf gradient
    others = _OtherProcesses(others_agree=True)
    reduction = GradientReduction(MeanPolicy.POST, 1, [weight], StaticLossScaling(_Optimizer(1.0)),
                                  replica_sum=others, watch_overflow=True)
    reduction.start_step()
    reduction.backward((weight * torch.tensor([1.0, 60000.0], dtype=torch.float16)).sum() * 2)
    with pytest.raises(HalfOverflow):
        reduction.finish_step()
    assert others.said == [False]  # its finite loss alone would have let the others step


def test_a_frozen_parameter_needs_no_agreement_and_loses_its_leftover_gradient():
    """A frozen parameter (in the optimizer, not summed: it gets no gradient) costs no collective,
    and a ``.grad`` it held before the call is dropped, as ``zero_grad(set_to_none=True)`` would."""
    optimizer = _Optimizer(16.0)
    weight = torch.nn.Parameter(torch.ones(2))
    frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    frozen.grad = torch.ones(2)
    others = _OtherProcesses(others_agree=False)
    reduction = GradientReduction(MeanPolicy.POST, 1, [weight, frozen], DynamicLossScaling().bind(optimizer),
                                  trainable=(weight,), replica_sum=others)
    reduction.start_step()
    assert frozen.grad is None
    reduction.backward((weight * torch.tensor([1.0, 3.0])).sum())
    assert reduction.finish_step() and others.said == []
