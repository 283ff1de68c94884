"""Which optimizer a training model steps and how: its parameters must be the model's, its
``step`` is the class's method even when the instance carries an attribute of that name; and
``copyNamedBuffersToDevice`` needs buffers that exist."""
import copy
import warnings

import pytest
import torch

import poptorch

from helpers.models import Classifier, classifier_batch, loss_of
from helpers.oracle import train_loop


# --------------------------------------------------------------------------- foreign parameters
def test_optimizer_over_another_models_parameters_is_refused_at_wrap():
    model, other = Classifier(), Classifier()
    with pytest.raises(poptorch.Error) as info:
        poptorch.trainingModel(model, optimizer=torch.optim.SGD(other.parameters(), lr=0.1))
    message = str(info.value)
    assert "2 tensor(s) that are not parameters of the model" in message
    assert "param_groups[0]['params'][0] of shape [3, 4]" in message
    assert "param_groups[0]['params'][1] of shape [3]" in message
    assert type(model) is Classifier  # not wrapped: it can be wrapped properly now
    poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))(*classifier_batch())


def test_foreign_parameters_are_named_when_the_optimizer_knows_their_names():
    model = Classifier()
    extra = torch.nn.Parameter(torch.zeros(2, 2))
    optimizer = torch.optim.Adam([{"params": list(model.named_parameters())},
                                  {"params": [("temperature", extra)]}], lr=0.1)
    with pytest.raises(poptorch.Error, match=r"1 tensor\(s\) .*: 'temperature' \(param_groups\[1\]\['params'\]\[0\]\) "
                                             r"of shape \[2, 2\]"):
        poptorch.trainingModel(model, optimizer=optimizer)


def test_set_optimizer_with_foreign_parameters_keeps_the_old_optimizer():
    model, other = Classifier(), Classifier()
    reference = copy.deepcopy(model)
    untouched = copy.deepcopy(other.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    pop = poptorch.trainingModel(model, optimizer=optimizer)
    pop(*classifier_batch(1))
    with pytest.raises(poptorch.Error, match="not parameters of the model"):
        pop.setOptimizer(torch.optim.SGD(other.parameters(), lr=0.5, momentum=0.9))
    pop(*classifier_batch(2))  # still the first optimizer, with its state
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for seed in (1, 2):
        train_loop(reference, ref_optimizer, classifier_batch(seed), loss_of, 1, 1, 1)
    torch.testing.assert_close(model.fc.weight, reference.fc.weight)
    for name, value in other.state_dict().items():
        assert torch.equal(value, untouched[name])


def test_set_optimizer_before_compile_is_checked_too():
    model, other = Classifier(), Classifier()
    pop = poptorch.trainingModel(model)
    with pytest.raises(poptorch.Error, match="not parameters of the model"):
        pop.setOptimizer(torch.optim.SGD(other.parameters(), lr=0.1))
    before = copy.deepcopy(other.state_dict())
    pop(*classifier_batch())
    for name, value in other.state_dict().items():
        assert torch.equal(value, before[name])


# --------------------------------------------------------------------------- step attribute
@pytest.mark.parametrize("optimizer_class", [torch.optim.SGD, poptorch.optim.SGD, poptorch.optim.Adam])
def test_optimizer_with_a_step_counter_attribute_is_still_stepped(optimizer_class):
    model = Classifier()
    reference = copy.deepcopy(model)
    optimizer = optimizer_class(model.parameters(), lr=0.1)
    optimizer.step = 0  # a script's own step counter
    pop = poptorch.trainingModel(model, poptorch.Options().deviceIterations(2), optimizer)
    for seed in (1, 2):
        pop(*classifier_batch(seed, rows=8))
        optimizer.step += 1
    ref_optimizer = optimizer_class(reference.parameters(), lr=0.1)
    for seed in (1, 2):
        train_loop(reference, ref_optimizer, classifier_batch(seed, rows=8), loss_of, 2, 1, 1)
    torch.testing.assert_close(model.fc.weight, reference.fc.weight)
    assert optimizer.step == 2


def test_step_counter_with_stochastic_rounding():
    model = Classifier().half()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    optimizer.step = 0
    opts = poptorch.Options()
    opts.Precision.enableStochasticRounding(True)
    pop = poptorch.trainingModel(model, opts, optimizer)
    before = model.fc.weight.detach().clone()
    x, labels = classifier_batch()
    pop(x.half(), labels)
    assert not torch.equal(model.fc.weight, before)


def test_an_lr_schedulers_step_wrapper_is_kept(backend):
    """An LR scheduler wraps ``optimizer.step`` on the instance to know it was called: that
    callable is what the executor calls, so the scheduler does not warn about the order."""
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    pop = poptorch.trainingModel(model, optimizer=optimizer)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pop(*classifier_batch())
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05)


# --------------------------------------------------------------------------- named buffers
class WithOffset(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(2, 2)
        self.register_buffer("offset", torch.zeros(2))

    def forward(self, x):
        return self.fc(x) + self.offset


@pytest.mark.parametrize("kind", ["inference", "compiled inference", "training"])
def test_copy_named_buffers_without_updatable_buffers_is_poptorchs_error(kind):
    model = WithOffset()
    pop = poptorch.trainingModel(model) if kind == "training" else poptorch.inferenceModel(model)
    if kind == "compiled inference":
        pop(torch.zeros(1, 2))
    with pytest.raises(poptorch.Error) as info:
        pop.copyNamedBuffersToDevice()
    assert str(info.value) == ("'poptorch_py_error': No named buffers marked as updatable via "
                               "updatableNamedBuffers option")


def test_copy_named_buffers_naming_a_missing_buffer_is_refused():
    model = WithOffset()
    pop = poptorch.inferenceModel(model, poptorch.Options().updatableNamedBuffers(["offset", "scale"]))
    # (at compile: tests/test_poptorch_details.py)
    with pytest.raises(poptorch.Error, match=r"names buffers the model does not have: scale \(its buffers: offset\)"):
        pop(torch.zeros(1, 2))
