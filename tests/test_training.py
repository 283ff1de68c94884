"""Training semantics of ``poptorch.trainingModel`` against plain-PyTorch oracles."""
import copy

import pytest
import torch
import torch.nn.functional as F

import poptorch

from helpers.models import Normed, Regressor, make_data, regressor_loss
from helpers.oracle import train_loop


def options(di=1, ga=1, r=1, mode=None):
    opts = poptorch.Options().deviceIterations(di).replicationFactor(r)
    opts.Training.gradientAccumulation(ga)
    if mode is not None:
        opts.outputMode(mode)
    return opts


@pytest.mark.parametrize("di,ga,r", [(1, 1, 1), (4, 3, 2), (2, 1, 4), (1, 5, 1)])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_matches_hand_written_loop(di, ga, r, momentum, backend):
    model = Regressor()
    reference = copy.deepcopy(model)
    x, t = make_data(di * ga * r * 3)
    opt = poptorch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=momentum)
    pop = poptorch.trainingModel(model, options(di, ga, r, poptorch.OutputMode.All), opt)
    for _ in range(3):
        _, losses = pop(x, t)
        ref_losses = train_loop(reference, ref_opt, (x, t), regressor_loss, di, ga, r)
        torch.testing.assert_close(losses.reshape(-1), ref_losses, rtol=1e-6, atol=1e-6)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_parameters_frozen_and_unfrozen_between_calls_train_as_the_loop(backend):
    """Fine-tuning schedules freeze and unfreeze parameters between calls, the optimizer holding
    them all: a frozen one is left as it is (no update, no state), an unfrozen one trains from its
    next step (its gradient zeroed at every step, as ``zero_grad`` does)."""
    di, ga, r = 2, 2, 2
    model = Regressor()
    model.fc1.weight.requires_grad_(False)
    reference = copy.deepcopy(model)
    model.fc1.weight.grad = torch.ones_like(model.fc1.weight)  # left from before: the loop's zero_grad drops it
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    pop = poptorch.trainingModel(model, options(di, ga, r, poptorch.OutputMode.All), opt)
    for call in range(4):
        if call == 2:  # unfreeze fc1.weight, freeze fc2.bias
            for m in (model, reference):
                m.fc1.weight.requires_grad_(True)
                m.fc2.bias.requires_grad_(False)
        x, t = make_data(di * ga * r * 3, seed=call)
        _, losses = pop(x, t)
        ref_losses = train_loop(reference, ref_opt, (x, t), regressor_loss, di, ga, r)
        torch.testing.assert_close(losses.reshape(-1), ref_losses, rtol=1e-6, atol=1e-6)
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)
        assert (model.fc1.weight in opt.state) == (call >= 2)


def test_sum_reduction_matches_summed_gradients(backend):
    model = Regressor()
    reference = copy.deepcopy(model)
    opts = options(2, 3, 2)
    opts.Training.accumulationAndReplicationReductionType(poptorch.ReductionType.Sum)
    x, t = make_data(2 * 3 * 2 * 4)
    pop = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.01))
    pop(x, t)
    train_loop(reference, torch.optim.SGD(reference.parameters(), lr=0.01), (x, t), regressor_loss, 2, 3, 2,
               reduction="sum")
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)


def test_mean_accumulation_equals_one_big_batch(backend):
    """accum=2 with Mean is one step on the double batch."""
    model = Regressor()
    reference = copy.deepcopy(model)
    x, t = make_data(8)
    pop = poptorch.trainingModel(model, options(ga=2), poptorch.optim.SGD(model.parameters(), lr=0.1))
    pop(x, t)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    regressor_loss(reference, x, t).backward()
    ref_opt.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)


def test_running_mean_strategy_matches_post(backend):
    results = []
    for strategy in (poptorch.MeanReductionStrategy.Post, poptorch.MeanReductionStrategy.Running):
        torch.manual_seed(0)
        model = Regressor()
        opts = options(2, 4, 1)
        opts.Training.setMeanAccumulationAndReplicationReductionStrategy(strategy)
        x, t = make_data(2 * 4 * 2)
        pop = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1))
        pop(x, t)
        results.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_default_optimizer_is_sgd_lr_0_01(backend):
    model = Regressor()
    reference = copy.deepcopy(model)
    x, t = make_data(4)
    poptorch.trainingModel(model)(x, t)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.01)
    regressor_loss(reference, x, t).backward()
    ref_opt.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)


def test_returned_loss_uses_weights_before_the_update(backend):
    model = Regressor()
    x, t = make_data(4)
    expected = regressor_loss(model, x, t).detach()
    _, loss = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=1.0))(x, t)
    assert loss.shape == torch.Size([])
    torch.testing.assert_close(loss, expected)
    assert not torch.allclose(regressor_loss(model, x, t), expected)


@pytest.mark.slow
def test_torch_adam_and_adamw_parity(backend):
    for cls in (torch.optim.Adam, torch.optim.AdamW):
        model = Regressor()
        reference = copy.deepcopy(model)
        x, t = make_data(2 * 2 * 4)
        pop = poptorch.trainingModel(model, options(2, 2), cls(model.parameters(), lr=0.01))
        pop(x, t)
        train_loop(reference, cls(reference.parameters(), lr=0.01), (x, t), regressor_loss, 2, 2, 1)
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- loss discovery
class WithIdentityLoss(torch.nn.Module):
    def __init__(self, reduction="mean"):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.reduction = reduction

    def forward(self, x):
        out = self.fc(x)
        return out, poptorch.identity_loss(out ** 2, reduction=self.reduction)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_identity_loss_reductions_train_like_oracle(reduction, backend):
    model = WithIdentityLoss(reduction)
    reference = copy.deepcopy(model)
    x = torch.randn(4, 4)
    pop = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01))
    _, loss = pop(x)
    out = reference.fc(x) ** 2
    ref_loss = {"mean": out.mean(), "sum": out.sum(), "none": out}[reduction]
    torch.testing.assert_close(loss, ref_loss.detach())
    ref_loss.backward(torch.ones_like(ref_loss))
    torch.optim.SGD(reference.parameters(), lr=0.01).step()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)


def test_loss_feeding_another_loss_folds_away(backend):
    class TwoLosses(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 2)
            self.ce = torch.nn.CrossEntropyLoss()

        def forward(self, x, y):
            out = self.fc(x)
            a = self.ce(out, y)
            b = F.mse_loss(out, torch.zeros_like(out))
            return poptorch.identity_loss(a + 0.5 * b, reduction="none")

    model = TwoLosses()
    reference = copy.deepcopy(model)
    x, y = torch.randn(6, 4), torch.randint(0, 2, (6,))
    loss = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))(x, y)
    ref = reference(x, y)
    torch.testing.assert_close(loss, ref.detach())
    ref.backward()
    torch.optim.SGD(reference.parameters(), lr=0.1).step()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)


def test_loss_not_returned_as_is_is_still_tracked():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 1)

        def forward(self, x, t):
            loss = F.l1_loss(self.fc(x), t)
            return loss * 2  # PopTorch back-propagates from the loss, not from what is returned

    model = Scaled()
    reference = copy.deepcopy(model)
    x, t = torch.randn(4, 3), torch.randn(4, 1)
    out = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))(x, t)
    ref_loss = F.l1_loss(reference.fc(x), t)
    torch.testing.assert_close(out, 2 * ref_loss.detach())
    ref_loss.backward()
    torch.optim.SGD(reference.parameters(), lr=0.1).step()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)


def test_no_loss_error_leaves_weights_intact():
    model = torch.nn.Linear(3, 3)
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(poptorch.Error, match="Couldn't find a loss in graph!"):
        poptorch.trainingModel(model)(torch.randn(2, 3))
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


def test_multiple_independent_losses_error():
    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 3)

        def forward(self, x):
            out = self.fc(x)
            return F.mse_loss(out, x), F.l1_loss(out, x)

    with pytest.raises(poptorch.Error, match="Multiple independent losses found in graph"):
        poptorch.trainingModel(Two())(torch.randn(2, 3))


def test_backward_on_outputs_raises():
    model = Regressor()
    _out, loss = poptorch.trainingModel(model)(*make_data(4))
    with pytest.raises(poptorch.Error, match="backward\\(\\) cannot be called explicitly"):
        loss.backward()
    inf_out = poptorch.inferenceModel(torch.nn.Linear(2, 2))(torch.randn(2, 2))
    with pytest.raises(poptorch.Error, match="backward\\(\\) cannot be called explicitly"):
        inf_out.backward()


# --------------------------------------------------------------------------- output modes
@pytest.mark.slow
@pytest.mark.parametrize("mode,period,loss_shape,out_rows", [
    (poptorch.OutputMode.All, None, [12 * 2], 12 * 2 * 3),
    (poptorch.OutputMode.Final, None, [2], 2 * 3),
    (poptorch.OutputMode.Sum, None, [2], 2 * 3),
    (poptorch.OutputMode.EveryN, 2, [6 * 2], 6 * 2 * 3),
    (poptorch.OutputMode.Default, None, [2], 2 * 3),
])
def test_training_output_shapes(mode, period, loss_shape, out_rows, backend):
    di, ga, r, micro = 4, 3, 2, 3
    opts = options(di, ga, r)
    if mode != poptorch.OutputMode.Default:
        opts.outputMode(mode, period)
    x, t = make_data(di * ga * r * micro)
    out, loss = poptorch.trainingModel(Regressor(), opts)(x, t)
    assert list(loss.shape) == loss_shape
    assert list(out.shape) == [out_rows, 2]


def test_output_rows_follow_popart_order(backend):
    """Row order is [DI, GA, R, micro]: the identity model returns its input rows in order."""
    class Echo(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, x):
            return x + 0 * self.w, poptorch.identity_loss((self.w * x).sum(), "sum")

    di, ga, r, micro = 3, 2, 2, 2
    x = torch.arange(di * ga * r * micro, dtype=torch.float32).unsqueeze(1)
    opts = options(di, ga, r)
    out, _ = poptorch.trainingModel(Echo(), copy.deepcopy(opts).outputMode(poptorch.OutputMode.All))(x)
    torch.testing.assert_close(out, x)
    final, _ = poptorch.trainingModel(Echo(), copy.deepcopy(opts).outputMode(poptorch.OutputMode.Final))(x)
    view = x.reshape(di, ga, r, micro, 1)
    torch.testing.assert_close(final, view[-1, -1].reshape(-1, 1))
    summed, _ = poptorch.trainingModel(Echo(), copy.deepcopy(opts).outputMode(poptorch.OutputMode.Sum))(x)
    torch.testing.assert_close(summed, view.sum(dim=(0, 1)).reshape(-1, 1))
    every, _ = poptorch.trainingModel(Echo(), copy.deepcopy(opts).outputMode(poptorch.OutputMode.EveryN, 3))(x)
    torch.testing.assert_close(every, view[2].reshape(-1, 1))


def test_inference_every_n_returns_iterations_n_minus_1(backend):
    opts = poptorch.Options().deviceIterations(10).outputMode(poptorch.OutputMode.EveryN, 5)
    model = poptorch.inferenceModel(torch.nn.Identity(), opts)
    x = torch.arange(10, dtype=torch.float32).unsqueeze(1)
    torch.testing.assert_close(model(x), torch.tensor([[4.0], [9.0]]))


def test_inference_default_is_all_and_dtypes_are_demoted(backend):
    class Types(torch.nn.Module):
        def forward(self, x):
            return x.long(), x.double(), {"half": x.half(), "nested": [x * 2]}

    opts = poptorch.Options().deviceIterations(2).replicationFactor(2)
    x = torch.arange(8, dtype=torch.float32).reshape(8, 1)
    as_long, as_double, rest = poptorch.inferenceModel(Types(), opts)(x)
    assert as_long.dtype == torch.int32 and as_double.dtype == torch.float32
    assert rest["half"].dtype == torch.float16
    torch.testing.assert_close(rest["nested"][0], x * 2)
    torch.testing.assert_close(as_long, x.int())


# --------------------------------------------------------------------------- buffers
def test_batchnorm_buffers_update_per_micro_batch():
    model = Normed()
    reference = copy.deepcopy(model)
    x = torch.randn(2 * 3 * 4, 4)
    pop = poptorch.trainingModel(model, options(2, 3), torch.optim.SGD(model.parameters(), lr=0.1))
    pop(x)
    train_loop(reference, torch.optim.SGD(reference.parameters(), lr=0.1), (x,),
               lambda m, x: m(x)[1], 2, 3, 1)
    for (name, a), (_, b) in zip(model.named_buffers(), reference.named_buffers()):
        torch.testing.assert_close(a, b, msg=name)


class CountsCalls(Normed):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)  # a buffer changed in place by the model's own code, not a norm statistic
        return super().forward(x)


def test_replicas_mutating_buffers_need_broadcast_disabled():
    model = CountsCalls()
    before = copy.deepcopy(model.state_dict())
    failing = poptorch.trainingModel(model, options(r=2))
    with pytest.raises(poptorch.Error, match="PopTorch does not support broadcasting buffers"):
        failing(torch.randn(8, 4))
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
    failing.destroy()

    opts = options(r=2)
    opts.broadcastBuffers(False)
    reference = copy.deepcopy(model)
    x = torch.randn(8, 4)
    poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.0))(x)
    reference(x[:4])  # host sees replica 0's statistics
    torch.testing.assert_close(model.bn.running_mean, reference.bn.running_mean)


# --------------------------------------------------------------------------- errors leave state intact
def test_invalid_batch_dimension_error_text_and_no_state_change():
    model = Regressor()
    before = copy.deepcopy(model.state_dict())
    pop = poptorch.trainingModel(model, options(di=2, ga=3, r=2))
    x, t = make_data(10)
    expected = ("Invalid batch dimension: In the input x, the batch dimension (10) must be a multiple of "
                "Options.deviceIterations(2) * (Options.replicationFactor(2) / "
                "Options.inputReplicaGrouping.input_group_size(1)) * Options.Training.gradientAccumulation(3) "
                "= 12 because")
    with pytest.raises(AssertionError) as info:
        pop(x, t)
    assert str(info.value).startswith(expected)
    assert not pop.isCompiled()
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


def test_input_mismatch_after_compile():
    model = Regressor()
    pop = poptorch.trainingModel(model)
    x, t = make_data(4)
    pop(x, t)
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(poptorch.Error, match=r"Shape mismatch for x: expected torch.Size\(\[4, 6\]\) but got "
                                             r"torch.Size\(\[2, 6\]\).\nThis error occurred"):
        pop(x[:2], t[:2])
    with pytest.raises(poptorch.Error, match="Data type mismatch for target: expected torch.float32 but got "
                                             "torch.float64."):
        pop(x, t.double())
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


def test_wrapping_twice_and_destroy():
    model = Regressor()
    pop = poptorch.trainingModel(model)
    with pytest.raises(RuntimeError, match="Model has already been wrapped in 'poptorch.trainingModel'"):
        poptorch.trainingModel(model)
    pop.destroy()
    again = poptorch.trainingModel(model)
    again(*make_data(2))
    assert again.isCompiled()


def test_offline_model_cannot_be_called_but_compiles():
    model = torch.nn.Linear(2, 2)
    opts = poptorch.Options().useOfflineIpuTarget()
    pop = poptorch.inferenceModel(model, opts)
    with pytest.raises(AssertionError, match=r"use model.compile\(inputs\) instead of model\(inputs\)"):
        pop(torch.randn(1, 2))
    pop.compile(torch.randn(1, 2))
    assert pop.isCompiled()


def test_methods_before_compile_raise():
    pop = poptorch.trainingModel(Regressor())
    for call in (pop.copyWeightsToHost, pop.copyWeightsToDevice, pop.detachFromDevice, pop.attachToDevice,
                 lambda: pop.rng_state):
        with pytest.raises(poptorch.Error, match="Model has not been compiled or has been destroyed."):
            call()
    with pytest.raises(poptorch.Error, match="Please compile the model before obtaining compilation time."):
        pop.compilationTime()


def test_inference_with_gradient_accumulation_is_rejected():
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(2)
    with pytest.raises(poptorch.Error, match="You must set poptorch.Options\\(\\).Training.gradientAccumulation "
                                             "to 1 .* Use poptorch.Options\\(\\).deviceIterations"):
        poptorch.inferenceModel(torch.nn.Linear(2, 2), opts)


def test_compile_leaves_weights_buffers_and_rng_untouched():
    model = Normed()
    before = copy.deepcopy(model.state_dict())
    x = torch.randn(4, 4)
    rng = torch.random.get_rng_state()
    pop = poptorch.trainingModel(model)
    pop.compile(x)
    assert pop.isCompiled()
    assert torch.equal(torch.random.get_rng_state(), rng)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert pop.compilationTime().total_seconds() >= 0


def test_running_context_and_hardware_queries():
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(poptorch.isRunningOnIpu())
            return x

    assert not poptorch.isRunningOnIpu()
    poptorch.inferenceModel(Probe())(torch.randn(2, 2))
    assert seen and all(seen)
    assert poptorch.ipuHardwareIsAvailable() is False


def test_set_optimizer_changes_lr_and_rejects_constant_changes(backend):
    model = Regressor()
    reference = copy.deepcopy(model)
    opt = poptorch.optim.SGD(model.parameters(), lr=0.1)
    pop = poptorch.trainingModel(model, optimizer=opt)
    x, t = make_data(4)
    pop(x, t)
    new = poptorch.optim.SGD(model.parameters(), lr=0.5)
    pop.setOptimizer(new)
    pop(x, t)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for lr in (0.1, 0.5):
        ref_opt.param_groups[0]["lr"] = lr
        ref_opt.zero_grad()
        regressor_loss(reference, x, t).backward()
        ref_opt.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(poptorch.Error, match="weight_decay"):
        pop.setOptimizer(torch.optim.SGD(model.parameters(), lr=0.5, weight_decay=0.1))
    assert pop._optimizer is new
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


def test_lr_scheduler_reaches_the_optimizer_with_and_without_set_optimizer(backend):
    for call_set_optimizer in (False, True):
        torch.manual_seed(0)
        model = Regressor()
        reference = copy.deepcopy(model)
        opt = poptorch.optim.SGD(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        pop = poptorch.trainingModel(model, optimizer=opt)
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
        ref_scheduler = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=1, gamma=0.5)
        x, t = make_data(4)
        for _ in range(3):
            pop(x, t)
            scheduler.step()
            if call_set_optimizer:
                pop.setOptimizer(opt)
            ref_opt.zero_grad()
            regressor_loss(reference, x, t).backward()
            ref_opt.step()
            ref_scheduler.step()
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p, q)


def test_unsupported_optimizer_rejected_before_anything_runs():
    model = Regressor()
    with pytest.raises(AssertionError, match="Unsupported optimizer type"):
        poptorch.trainingModel(model, optimizer=torch.optim.LBFGS(model.parameters()))


def test_detached_loss_used_as_metric_does_not_count(backend):
    class WithMetric(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 3)

        def forward(self, x):
            out = self.fc(x)
            metric = F.l1_loss(out.detach(), x)
            return out, F.mse_loss(out, x), metric

    model = WithMetric()
    reference = copy.deepcopy(model)
    x = torch.randn(4, 3)
    _, _loss, metric = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))(x)
    torch.testing.assert_close(metric, F.l1_loss(reference.fc(x), x).detach())
    F.mse_loss(reference.fc(x), x).backward()
    torch.optim.SGD(reference.parameters(), lr=0.1).step()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)


def test_other_closure_free_torch_optimizers_run_as_is():
    model = Regressor()
    reference = copy.deepcopy(model)
    x, t = make_data(8)
    poptorch.trainingModel(model, options(ga=2), torch.optim.Adagrad(model.parameters(), lr=0.1))(x, t)
    ref_opt = torch.optim.Adagrad(reference.parameters(), lr=0.1)
    regressor_loss(reference, x, t).backward()
    ref_opt.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)


def test_list_outputs_are_concatenated_in_row_order():
    class WithIds(torch.nn.Module):
        def forward(self, x):
            return x * 2, [f"row{int(v)}" for v in x[:, 0]]

    x = torch.arange(4, dtype=torch.float32).unsqueeze(1)
    _out, ids = poptorch.inferenceModel(WithIds(), poptorch.Options().deviceIterations(2))(x)
    assert ids == ["row0", "row1", "row2", "row3"]


# --------------------------------------------------------------------------- anchored tensors
def test_anchored_gradients_and_updates_match_a_hand_written_loop():
    model = Regressor()
    reference = copy.deepcopy(model)
    opts = options(di=3, ga=2, r=2)
    opts.anchorTensor("grad_bias", "Gradient___fc2.bias")
    opts.anchorTensor("update_weight", "UpdatedVar___model.fc2.weight")  # PopTorch's traced form
    opts.anchorTensor("all_weights", "fc1.weight", poptorch.OutputMode.All)
    opts.anchorTensor("grad_sum", "Gradient___fc1.bias", poptorch.OutputMode.Sum)
    opts.anchorTensor("every_2nd", "UpdatedVar___fc1.bias", poptorch.OutputMode.EveryN, 2)
    pop = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    x, t = make_data(3 * 2 * 2 * 2)
    pop(x, t)

    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    grads, weights, fc1_bias_grads, fc1_biases = [], [], [], []
    for d in range(3):  # the same steps by hand, recording what the anchors should hold
        train_loop(reference, optimizer, (x[d * 8:(d + 1) * 8], t[d * 8:(d + 1) * 8]), regressor_loss, 1, 2, 2)
        grads.append(reference.fc2.bias.grad.clone())
        fc1_bias_grads.append(reference.fc1.bias.grad.clone())
        weights.append(reference.fc1.weight.detach().clone())
        fc1_biases.append(reference.fc1.bias.detach().clone())
    close = dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(pop.getAnchoredTensor("grad_bias"), grads[-1], **close)  # Final by default
    torch.testing.assert_close(pop.getAnchoredTensor("update_weight"), reference.fc2.weight.detach(), **close)
    torch.testing.assert_close(pop.getAnchoredTensor("all_weights"), torch.stack(weights), **close)
    torch.testing.assert_close(pop.getAnchoredTensor("grad_sum"), sum(fc1_bias_grads), **close)
    torch.testing.assert_close(pop.getAnchoredTensor("every_2nd"), fc1_biases[1].unsqueeze(0), **close)
    with pytest.raises(AssertionError, match="No tensor with name nothing found."):
        pop.getAnchoredTensor("nothing")


def test_anchor_names_are_checked_at_compile():
    model = Regressor()
    opts = options()
    opts.anchorTensor("g", "Gradient___fc3.bias")
    pop = poptorch.trainingModel(model, opts)
    with pytest.raises(poptorch.Error, match="anchorTensor: no tensor named 'Gradient___fc3.bias'"):
        pop(*make_data(2))
    inference_opts = poptorch.Options()
    inference_opts.anchorTensor("g", "Gradient___fc2.bias")
    inference = poptorch.inferenceModel(Regressor(), inference_opts)
    with pytest.raises(poptorch.Error, match="gradients exist in training models only"):
        inference(*make_data(2))
    inference_opts = poptorch.Options().deviceIterations(2)
    inference_opts.anchorTensor("w", "fc2.bias")
    model = Regressor()
    inference = poptorch.inferenceModel(model, inference_opts)
    inference(*make_data(4))
    torch.testing.assert_close(inference.getAnchoredTensor("w"), torch.stack([model.fc2.bias.detach()] * 2))


def test_anchor_defaults_follow_the_models_output_mode_and_replica_0():
    model = Regressor()
    opts = options(di=4).outputMode(poptorch.OutputMode.EveryN, 2)
    opts.anchorTensor("w", "UpdatedVar___fc2.bias")  # no mode of its own: the model's, period included
    pop = poptorch.trainingModel(model, opts)
    pop(*make_data(4))
    assert pop.getAnchoredTensor("w").shape == (2, 2)

    normed = Normed()
    opts = options(r=2).broadcastBuffers(False)
    opts.anchorTensor("mean", "bn.running_mean")
    pop = poptorch.trainingModel(normed, opts, torch.optim.SGD(normed.parameters(), lr=0.0))
    pop(torch.randn(8, 4))
    torch.testing.assert_close(pop.getAnchoredTensor("mean"), normed.bn.running_mean)  # replica 0's, as the host

    opts = options()
    opts.anchorTensor("w", "fc2.bias", poptorch.OutputMode.EveryN, 0)
    with pytest.raises(poptorch.Error, match="EveryN needs output_return_period >= 1"):
        poptorch.trainingModel(Regressor(), opts)(*make_data(1))
