"""The compiled backend's fast path for a host call like the last one (runtime/compiled/repeat_call.py):
it binds no arguments, and any call that differs - inputs to convert, train/eval switched, an
optimizer's static choice changed, a shape that does not match - takes the general path, with
eager's results and PopTorch's warnings and errors."""
import copy

import pytest
import torch

import poptorch
from openpop import errors
from openpop.runtime import executor as executor_module

from helpers.models import Regressor, make_data, regressor_loss
from helpers.oracle import train_loop


def options(backend="compiled"):
    opts = poptorch.Options().openpopBackend(backend)
    opts.showCompilationProgressBar(False)
    return opts


@pytest.fixture
def binding_calls(monkeypatch):
    """The host calls (indices in ``calls``, which the test appends to) that bound their arguments."""
    calls, bound = [], []
    real = executor_module.BoundInputs

    def counted(*args):
        bound.append(len(calls))
        return real(*args)

    monkeypatch.setattr(executor_module, "BoundInputs", counted)
    return calls, bound


def test_repeated_calls_bind_nothing_and_match_the_oracle(binding_calls):
    calls, bound = binding_calls
    torch.manual_seed(0)
    model = Regressor()
    reference = copy.deepcopy(model)
    pop = poptorch.trainingModel(model, options(), torch.optim.SGD(model.parameters(), lr=0.1))
    oracle = torch.optim.SGD(reference.parameters(), lr=0.1)
    for seed in range(4):
        x, t = make_data(4, seed=seed)
        calls.append(pop(x, t))
        expected = train_loop(reference, oracle, (x, t), regressor_loss, 1, 1, 1)
        torch.testing.assert_close(calls[-1][1], expected[0], rtol=1e-5, atol=1e-6)
    assert bound == [0]  # only the first call, which compiled the program
    assert pop._dispatch.compiled.last == "compiled"
    counters = pop.getPerfCounters()  # the one step's timestamps, as on the general path
    assert sorted(counters) == ["input", "input_complete", "output", "output_complete"]
    assert [len(v[0]) for v in counters.values()] == [1] * 4
    assert counters["input"][0][0] <= counters["output_complete"][0][0]
    assert pop.getLatency()[0] >= 0
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _calls_unlike_the_last(backend, calls):
    torch.manual_seed(0)
    model = Regressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    pop = poptorch.trainingModel(model, options(backend), optimizer)
    calls.append(pop(*make_data(4, seed=0)))
    calls.append(pop(*make_data(4, seed=1)))
    optimizer.param_groups[0]["lr"] = 0.05  # a hyperparameter: read by every call
    calls.append(pop(*make_data(4, seed=2)))
    model.eval()  # the call runs in the compiled (training) mode
    calls.append(pop(*make_data(4, seed=3)))
    model.train()
    x, t = make_data(4, seed=4)
    calls.append(pop(x.t().contiguous().t(), t))  # not contiguous: converted
    x, t = make_data(4, seed=5)
    calls.append(pop(x.requires_grad_(), t))  # requires grad: detached
    optimizer.param_groups[0]["momentum"] = 0.9  # a static choice: a new program
    calls.append(pop(*make_data(4, seed=6)))
    calls.append(pop(*make_data(4, seed=7)))
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(poptorch.Error, match="Shape mismatch for x"):
        pop(*make_data(8, seed=8))
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key])
    return [p.detach().clone() for p in model.parameters()], pop._dispatch.compiled.last


def test_calls_unlike_the_last_take_the_general_path(binding_calls, warnings_logged):
    calls, bound = binding_calls
    weights, last = _calls_unlike_the_last("compiled", calls)
    assert last == "compiled"
    # Bound: the first call (compiled), then each call that differs; 1, 2 and 7 repeat the call before.
    assert bound == [0, 3, 4, 5, 6, 8]
    logged = warnings_logged()
    assert errors.INPUT_NOT_CONTIGUOUS in logged and errors.INPUT_REQUIRES_GRAD in logged
    eager_calls = []
    eager_weights, _ = _calls_unlike_the_last("eager", eager_calls)
    for compiled, eager in zip(calls, eager_calls):
        for a, b in zip(compiled, eager):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(weights, eager_weights):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_repeated_calls_keep_an_inference_model_of_the_same_weights_in_sync():
    """Each repeated call counts as new weights (``weights.weights_version``): an inference model
    sharing the model uploads them before its next call."""
    torch.manual_seed(0)
    model = Regressor()
    pop = poptorch.trainingModel(model, options(), torch.optim.SGD(model.parameters(), lr=0.1))
    inference = poptorch.inferenceModel(model, options("eager"))
    x, t = make_data(4, seed=0)
    for _ in range(3):
        pop(x, t)
        with torch.no_grad():
            expected = model(x, t)
        torch.testing.assert_close(inference(x, t)[0], expected[0], rtol=0, atol=0)
    assert pop._dispatch.compiled.repeat is not None and pop._dispatch.compiled.last == "compiled"


def test_a_repeated_call_that_fails_changes_nothing():
    """A plain program's repeated call (``RepeatCall._run_plain``) commits only after the program
    has run: one that raises leaves weights and optimizer state as they were."""
    torch.manual_seed(0)
    model = Regressor()
    reference = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    pop = poptorch.trainingModel(model, options(), optimizer)
    oracle = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for seed in range(2):
        x, t = make_data(4, seed=seed)
        pop(x, t)
        train_loop(reference, oracle, (x, t), regressor_loss, 1, 1, 1)
    assert pop._dispatch.compiled.repeat.plain
    program = pop._dispatch.compiled._program
    run = program._compiled

    def fails_after_running(*args):
        run(*args)
        raise RuntimeError("injected")

    weights = [p.detach().clone() for p in model.parameters()]
    velocities = [optimizer.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    program._compiled = fails_after_running
    try:
        with pytest.raises(RuntimeError, match="injected"):
            pop(*make_data(4, seed=2))
    finally:
        program._compiled = run
    for p, w, v in zip(model.parameters(), weights, velocities):
        assert torch.equal(p, w) and torch.equal(optimizer.state[p]["momentum_buffer"], v)
    x, t = make_data(4, seed=3)
    _, loss = pop(x, t)
    expected = train_loop(reference, oracle, (x, t), regressor_loss, 1, 1, 1)
    torch.testing.assert_close(loss, expected[0], rtol=1e-5, atol=1e-6)
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_repeated_calls_see_every_change_to_the_optimizer(binding_calls):
    """Repeated calls reuse their hyperparameter inputs while the optimizer's values are the same
    objects (``optimizer_snapshot.py``): an LR scheduler's step, a group value written, a tensor
    ``lr`` changed in place, a new ``max_grad_norm`` and ``loss_scaling`` each reach the program."""
    calls, bound = binding_calls
    torch.manual_seed(0)
    model = Regressor()
    reference = copy.deepcopy(model)
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.1, loss_scaling=2.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    pop = poptorch.trainingModel(model, options(), optimizer)
    oracle = torch.optim.SGD(reference.parameters(), lr=0.1)
    max_grad_norm = None

    def step(seed):
        x, t = make_data(4, seed=seed)
        calls.append(pop(x, t))
        expected = train_loop(reference, oracle, (x, t), regressor_loss, 1, 1, 1, max_grad_norm=max_grad_norm)
        torch.testing.assert_close(calls[-1][1], expected[0], rtol=1e-5, atol=1e-6)
        for a, b in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)

    step(0)
    step(1)
    for changed in range(4):
        if changed == 0:
            scheduler.step()
            oracle.param_groups[0]["lr"] = optimizer.param_groups[0]["lr"]
        elif changed == 1:
            optimizer.param_groups[0]["weight_decay"] = 0.01
            oracle.param_groups[0]["weight_decay"] = 0.01
        elif changed == 2:
            optimizer.loss_scaling = 8.0  # the gradients are unscaled: the same update
        else:
            optimizer.param_groups[0]["lr"] = torch.tensor(0.2)
            oracle.param_groups[0]["lr"] = 0.2
        step(2 + 2 * changed)
        step(3 + 2 * changed)
    optimizer.param_groups[0]["lr"].fill_(0.05)  # in place: the same object
    oracle.param_groups[0]["lr"] = 0.05
    step(10)
    step(11)
    optimizer.max_grad_norm = max_grad_norm = 0.01  # a static choice: a new program
    step(12)
    step(13)
    assert bound == [0, 12]
    assert pop._dispatch.compiled.repeat.plain


def test_repeated_calls_read_parameters_whose_data_was_replaced(binding_calls):
    """The program takes the parameters themselves (no alias kept between calls): ``p.data = ...``
    between repeated calls - new memory, or a new memory layout (a guard fails: Dynamo re-traces)
    - is what the next call reads and updates."""
    calls, bound = binding_calls
    torch.manual_seed(0)
    model = Regressor()
    reference = copy.deepcopy(model)
    pop = poptorch.trainingModel(model, options(), torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    oracle = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    generator = torch.Generator().manual_seed(1)
    for seed in range(6):
        if seed == 2:
            new = torch.randn(model.fc1.weight.shape, generator=generator)
        elif seed == 4:  # the same values, transposed in memory
            new = model.fc1.weight.detach().t().contiguous().t()
        if seed in (2, 4):
            model.fc1.weight.data = new
            reference.fc1.weight.data = new.clone()
        x, t = make_data(4, seed=seed)
        calls.append(pop(x, t))
        expected = train_loop(reference, oracle, (x, t), regressor_loss, 1, 1, 1)
        torch.testing.assert_close(calls[-1][1], expected[0], rtol=1e-5, atol=1e-6)
        for a, b in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # (call 4: torch.compile traces the program again - the general path probes the call first)
    assert bound == [0, 4] and pop._dispatch.compiled.last == "compiled"
    assert model.fc1.weight.stride() == (1, 8)
