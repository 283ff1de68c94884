"""A training host call is all or nothing (``openpop.runtime.transaction``): a call that raises
part-way - a user error, a floating-point-exception ``poptorch.Error``, Ctrl-C - leaves weights,
buffers, optimizer state, loss scale and RNG as they were, so catching and retrying gives exactly
the run that never failed."""
import copy
import signal

import pytest
import torch
import torch.nn.functional as F

import poptorch

DI, GA = 3, 2


class Net(torch.nn.Module):
    """BatchNorm (buffers), dropout (RNG), two layers. ``fail_on`` = number of the forward call
    (counted from ``calls = 0``) that fails after BatchNorm and dropout ran; ``overflow`` makes
    that call overflow instead (a floating-point exception when they are enabled)."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 8)
        self.bn = torch.nn.BatchNorm1d(8)
        self.drop = torch.nn.Dropout(0.3)
        self.fc2 = torch.nn.Linear(8, 2)
        self.calls = 0
        self.fail_on = None
        self.failure = ValueError
        self.overflow = False

    def forward(self, x, y):
        self.calls += 1
        h = self.drop(self.bn(self.fc1(x)))
        if self.calls == self.fail_on:
            if self.overflow:
                h = h * torch.exp(torch.full_like(h, 200.0))
            else:
                raise self.failure("injected failure")
        out = self.fc2(torch.relu(h))
        return out, F.mse_loss(out, y)


def data(di=DI, ga=GA, r=1, micro=4, seed=1):
    generator = torch.Generator().manual_seed(seed)
    n = di * ga * r * micro
    return torch.randn(n, 6, generator=generator), torch.randn(n, 2, generator=generator)


def build(di=DI, ga=GA, replicas=1, rollback=True, fp_exceptions=False, optimizer="adam"):
    torch.manual_seed(0)
    model = Net()
    opts = poptorch.Options().deviceIterations(di).replicationFactor(replicas).showCompilationProgressBar(False)
    opts.Training.gradientAccumulation(ga)
    opts.Training.setAutomaticLossScaling(True, growth_interval=1)  # the scale changes every step
    if not rollback:
        opts.Training.rollbackFailedCalls(False)
    if replicas > 1:
        opts.broadcastBuffers(False)
    if fp_exceptions:
        opts.Precision.enableFloatingPointExceptions(True)
    if optimizer == "adam":
        optim = poptorch.optim.Adam(model.parameters(), lr=0.01, loss_scaling=64.0)
    else:
        optim = optimizer(model.parameters())
    scheduler = torch.optim.lr_scheduler.StepLR(optim, step_size=1, gamma=0.5)
    return model, poptorch.trainingModel(model, opts, optim), optim, scheduler


def snapshot(model, optimizer, pop):
    return {
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
        "buffers": {n: b.detach().clone() for n, b in model.named_buffers()},
        "optimizer": copy.deepcopy(optimizer.state_dict()),
        "attributes": {k: v for k, v in vars(optimizer).items()
                       if isinstance(v, (bool, int, float)) and k not in InterruptedSGD.test_attributes},
        "scaler": dict(vars(pop._precision.dynamic)),
        "rng": torch.get_rng_state(),
        "grads": [p.grad for p in model.parameters()],
    }


def assert_same(a, b, path="state"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            assert_same(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def run_calls(pop, scheduler, batches):
    for x, y in batches:
        pop(x, y)
        scheduler.step()


def test_state_the_failure_could_change_is_really_changed_by_a_call():
    """The checks below are meaningful: one call changes every part of the snapshot."""
    model, pop, optimizer, _scheduler = build()
    pop(*data())
    before = snapshot(model, optimizer, pop)
    pop(*data(seed=2))
    after = snapshot(model, optimizer, pop)
    for key in ("params", "buffers", "optimizer", "attributes", "rng"):
        with pytest.raises(AssertionError):
            assert_same(before[key], after[key])


@pytest.mark.parametrize("failure", ["user_error", "fp_exception", "keyboard_interrupt"])
def test_a_failed_call_changes_nothing_and_a_retry_repeats_nothing(failure):
    batches = [data(seed=s) for s in (1, 2, 3)]
    twin, twin_pop, twin_optimizer, twin_scheduler = build(fp_exceptions=failure == "fp_exception")
    run_calls(twin_pop, twin_scheduler, batches)

    model, pop, optimizer, scheduler = build(fp_exceptions=failure == "fp_exception")
    run_calls(pop, scheduler, batches[:1])
    before = snapshot(model, optimizer, pop)
    model.calls, model.fail_on = 0, GA + 2  # the second step's second micro-batch: step 0 was applied
    expected = {"user_error": (ValueError, "injected"), "fp_exception": (poptorch.Error, "overflow"),
                "keyboard_interrupt": (KeyboardInterrupt, "injected")}[failure]
    model.failure = KeyboardInterrupt if failure == "keyboard_interrupt" else ValueError
    model.overflow = failure == "fp_exception"
    with pytest.raises(expected[0], match=expected[1]):
        pop(*batches[1])
    assert model.calls == GA + 2
    assert_same(before, snapshot(model, optimizer, pop))
    model.fail_on = None
    run_calls(pop, scheduler, batches[1:])  # the retry, then the next call
    assert_same(snapshot(twin, twin_optimizer, twin_pop), snapshot(model, optimizer, pop))
    assert scheduler.state_dict() == twin_scheduler.state_dict()


def test_failure_in_the_first_call_removes_the_optimizer_state_it_created():
    model, pop, optimizer, _ = build()
    pop.compile(*data())
    before = snapshot(model, optimizer, pop)
    model.calls, model.fail_on = 0, 2 * GA + 1  # step 2: Adam state was created by step 0
    with pytest.raises(ValueError):
        pop(*data())
    assert not optimizer.state
    assert_same(before, snapshot(model, optimizer, pop))


def test_one_device_iteration_restores_buffers_and_rng_without_copying_weights():
    model, pop, optimizer, scheduler = build(di=1, ga=3)
    batches = [data(di=1, ga=3, seed=s) for s in (1, 2, 3, 4)]
    run_calls(pop, scheduler, batches[:2])
    before = snapshot(model, optimizer, pop)
    model.calls, model.fail_on = 0, 3  # the step's last micro-batch: BatchNorm and dropout ran 3 times
    with pytest.raises(ValueError):
        pop(*batches[2])
    assert_same(before, snapshot(model, optimizer, pop))
    assert pop._session._rollback._copies == []  # the lazy copy is never needed with one step per call
    model.fail_on = None
    run_calls(pop, scheduler, batches[2:])
    twin, twin_pop, twin_optimizer, twin_scheduler = build(di=1, ga=3)
    run_calls(twin_pop, twin_scheduler, batches)
    assert_same(snapshot(twin, twin_optimizer, twin_pop), snapshot(model, optimizer, pop))


def test_weight_copies_are_taken_once_per_call_into_reused_tensors():
    model, pop, optimizer, _scheduler = build()
    pop(*data(seed=1))
    assert len(pop._session._rollback._copies) == len(list(model.parameters()))  # no Adam state yet
    pop(*data(seed=2))
    copies = pop._session._rollback._copies
    state_tensors = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    assert len(copies) == len(list(model.parameters())) + len(state_tensors)
    addresses = [t.data_ptr() for t in copies]
    pop(*data(seed=3))
    assert [t.data_ptr() for t in pop._session._rollback._copies] == addresses


def test_replicas_with_their_own_batchnorm_statistics_are_restored_too():
    batches = [data(r=2, seed=s) for s in (1, 2, 3)]
    twin, twin_pop, twin_optimizer, twin_scheduler = build(replicas=2)
    run_calls(twin_pop, twin_scheduler, batches)
    model, pop, optimizer, scheduler = build(replicas=2)
    run_calls(pop, scheduler, batches[:1])
    before = snapshot(model, optimizer, pop)
    replica_values = [[t.clone() for t in values] for values in pop._executable.replica_buffers.values]
    model.calls, model.fail_on = 0, 2 * GA * 2  # step 1, last micro-batch of replica 1
    with pytest.raises(ValueError):
        pop(*batches[1])
    assert_same(before, snapshot(model, optimizer, pop))
    assert pop._executable.replica_buffers.current == 0
    assert_same(replica_values[1:], [list(v) for v in pop._executable.replica_buffers.values[1:]])
    model.fail_on = None
    run_calls(pop, scheduler, batches[1:])
    assert_same(snapshot(twin, twin_optimizer, twin_pop), snapshot(model, optimizer, pop))


class InterruptedSGD(torch.optim.SGD):
    """SGD written out parameter by parameter; on update number ``interrupt_on`` a SIGINT arrives
    after the first parameter was updated (Ctrl-C in the middle of an optimizer update)."""

    test_attributes = ("interrupt_on",)

    def __init__(self, params, interrupt_on=None):
        super().__init__(params, lr=0.1)
        self.updates = []  # a list: a rollback restores the optimizer's plain attributes, not this
        self.interrupt_on = interrupt_on

    @torch.no_grad()
    def step(self, closure=None):
        self.updates.append(True)
        for i, p in enumerate(p for group in self.param_groups for p in group["params"]):
            if p.grad is not None:
                p.add_(p.grad, alpha=-0.1)
            if i == 0 and len(self.updates) == self.interrupt_on:
                signal.raise_signal(signal.SIGINT)


def interrupted_twin(di, interrupt_on):
    model, pop, optimizer, _scheduler = build(di=di, optimizer=lambda params: InterruptedSGD(params, interrupt_on))
    return model, pop, optimizer


def test_ctrl_c_in_the_middle_of_an_update_of_a_multi_step_call_rolls_it_back():
    model, pop, optimizer = interrupted_twin(DI, interrupt_on=DI + 2)  # the second call's second update
    pop(*data(seed=1))
    before = snapshot(model, optimizer, pop)
    with pytest.raises(KeyboardInterrupt):
        pop(*data(seed=2))
    assert len(optimizer.updates) == DI + 2
    assert_same(before, snapshot(model, optimizer, pop))
    pop(*data(seed=2))
    twin, twin_pop, twin_optimizer = interrupted_twin(DI, interrupt_on=None)
    twin_pop(*data(seed=1))
    twin_pop(*data(seed=2))
    assert_same(snapshot(twin, twin_optimizer, twin_pop), snapshot(model, optimizer, pop))


def test_ctrl_c_during_the_only_update_of_a_call_is_held_until_the_call_completed():
    model, pop, optimizer = interrupted_twin(1, interrupt_on=2)
    pop(*data(di=1, seed=1))
    with pytest.raises(KeyboardInterrupt, match="the call completed, its updates are applied"):
        pop(*data(di=1, seed=2))
    twin, twin_pop, twin_optimizer = interrupted_twin(1, interrupt_on=None)
    twin_pop(*data(di=1, seed=1))
    twin_pop(*data(di=1, seed=2))
    assert_same(snapshot(twin, twin_optimizer, twin_pop), snapshot(model, optimizer, pop))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):  # and Ctrl-C outside a call is as before
        signal.raise_signal(signal.SIGINT)


def test_without_rollback_a_failed_call_says_how_many_updates_it_applied():
    model, pop, optimizer, _ = build(rollback=False)
    pop(*data(seed=1))
    before = snapshot(model, optimizer, pop)
    model.calls, model.fail_on = 0, 2 * GA + 1  # step 2: steps 0 and 1 applied
    with pytest.raises(ValueError) as info:
        pop(*data(seed=2))
    assert any("2 optimizer update(s) of this host call's 3 step(s) were applied" in note
               for note in info.value.__notes__)
    with pytest.raises(AssertionError):
        assert_same(before["params"], snapshot(model, optimizer, pop)["params"])
    assert all(p.grad is None for p in model.parameters())
    assert pop._session._rollback._copies == []


def test_rollback_option():
    opts = poptorch.Options()
    assert opts.Training.rollback_failed_calls is True
    assert opts.Training.rollbackFailedCalls(False).rollback_failed_calls is False
    with pytest.raises(ValueError, match="rollbackFailedCalls needs a bool"):
        opts.Training.rollbackFailedCalls(1)


def test_without_rollback_ctrl_c_still_never_cuts_an_update_short():
    model, pop, _optimizer, _ = build(rollback=False, optimizer=lambda params: InterruptedSGD(params, interrupt_on=2))
    x, y = data()
    with pytest.raises(KeyboardInterrupt) as info:
        pop(x, y)
    assert any("2 optimizer update(s) of this host call's 3 step(s) were applied" in note
               for note in info.value.__notes__)
    twin, twin_pop, _, _ = build(di=2, optimizer=lambda params: InterruptedSGD(params))
    rows = 2 * GA * 4  # the first two steps' micro-batches
    twin_pop(x[:rows], y[:rows])
    assert_same(dict(twin.named_parameters()), dict(model.named_parameters()))
