"""Inputs as users write them: expanded, broadcast and transposed tensors, inference tensors,
in-place changes, zero-sized batches and ``**kwargs`` arguments."""
import copy

import pytest
import torch
import torch.nn.functional as F

import poptorch

from helpers.models import Classifier
from helpers.oracle import train_loop


def options(di=1, ga=1, r=1):
    opts = poptorch.Options().deviceIterations(di).replicationFactor(r)
    opts.Training.gradientAccumulation(ga)
    return opts


def odd_layouts(rows):
    """(name, tensor) pairs: the same kind of batch in layouts that are not contiguous."""
    return [
        ("expanded", torch.randn(1, 4).expand(rows, 4)),
        ("broadcast", torch.broadcast_to(torch.randn(4), (rows, 4))),
        ("transposed", torch.randn(4, rows).t()),
        ("strided", torch.randn(rows * 2, 4)[::2]),
    ]


@pytest.mark.parametrize("layout", ["expanded", "broadcast", "transposed", "strided"])
def test_training_on_non_contiguous_inputs_matches_the_loop(layout):
    di, ga, r = 2, 2, 2
    rows = di * ga * r * 2
    x = dict(odd_layouts(rows))[layout]
    labels = torch.randint(0, 3, (rows,)).expand(rows)  # an expanded 1-d tensor too
    model = Classifier()
    reference = copy.deepcopy(model)
    opts = options(di, ga, r).outputMode(poptorch.OutputMode.All)
    pop = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    before = (x.clone(), x.stride(), x._version, labels._version)
    _, losses = pop(x, labels)
    expected = train_loop(reference, torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9),
                          (x.contiguous(), labels.contiguous()), lambda m, a, b: m(a, b)[1], di, ga, r)
    torch.testing.assert_close(losses, expected)
    torch.testing.assert_close(model.fc.weight, reference.fc.weight)
    # The model did not write its inputs, so neither did openpop.
    assert torch.equal(x, before[0]) and x.stride() == before[1]
    assert (x._version, labels._version) == before[2:]
    pop(x, labels)  # later calls too


def test_inference_on_expanded_inputs():
    model = torch.nn.Linear(4, 3)
    pop = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(2))
    for _, x in odd_layouts(4):
        torch.testing.assert_close(pop(x), model(x.contiguous()).detach())


def test_non_contiguous_inference_tensor_inputs():
    """Tensors made under torch.inference_mode() cannot be written outside it: a model that does
    not change them must run (openpop used to write every converted input back)."""
    model = torch.nn.Linear(4, 3)
    with torch.inference_mode():
        x = torch.randn(4, 4).t()
    pop = poptorch.inferenceModel(model)
    torch.testing.assert_close(pop(x), model(x.clone()).detach())


class AddsOne(torch.nn.Module):
    def forward(self, x):
        x.add_(1)
        return x * 2


def test_in_place_change_reaches_a_writable_caller_tensor():
    base = torch.zeros(2, 4)
    x = base.t()  # non-contiguous but every element its own: written back
    pop = poptorch.inferenceModel(AddsOne(), poptorch.Options().deviceIterations(2))
    out = pop(x)
    torch.testing.assert_close(base, torch.ones(2, 4))
    torch.testing.assert_close(out, torch.full((4, 2), 2.0))


def test_in_place_change_to_an_expanded_input_is_not_written_back(warnings_logged):
    x = torch.zeros(1, 2).expand(4, 2)
    pop = poptorch.inferenceModel(AddsOne(), poptorch.Options().deviceIterations(2))
    out = pop(x)
    pop(x)
    torch.testing.assert_close(out, torch.full((4, 2), 2.0))  # the model saw its own change
    assert torch.equal(x, torch.zeros(4, 2))
    messages = [m for m in warnings_logged() if "cannot be written back" in m]
    assert len(messages) == 1 and "share memory" in messages[0]


def test_in_place_change_to_an_inference_tensor_is_not_written_back(warnings_logged):
    with torch.inference_mode():
        x = torch.zeros(2, 4).t()
    pop = poptorch.inferenceModel(AddsOne())
    out = pop(x)
    torch.testing.assert_close(out, torch.full((4, 2), 2.0))
    assert torch.equal(x, torch.zeros(4, 2))
    assert any("inference tensor" in m for m in warnings_logged())


# --------------------------------------------------------------------------- zero-sized inputs
@pytest.mark.parametrize("optimizer_class", [torch.optim.Adam, torch.optim.AdamW])
def test_empty_training_batch_is_refused_before_anything_changes(optimizer_class):
    model = Classifier()
    optimizer = optimizer_class(model.parameters(), lr=0.1, weight_decay=0.1)
    pop = poptorch.trainingModel(model, optimizer=optimizer)
    expected = "Zero-sized tensors are unsupported (Got shape [0, 4])"
    with pytest.raises(poptorch.Error, match=expected.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        pop(torch.randn(0, 4), torch.randint(0, 3, (0,)))
    assert not pop.isCompiled()
    pop(torch.randn(4, 4), torch.randint(0, 3, (4,)))
    weights = copy.deepcopy(model.state_dict())
    state = copy.deepcopy(optimizer.state_dict())
    with pytest.raises(poptorch.Error, match="Zero-sized tensors are unsupported"):
        pop(torch.randn(0, 4), torch.randint(0, 3, (0,)))
    for name, value in model.state_dict().items():
        assert torch.equal(value, weights[name]), name
    for param_state, saved in zip(optimizer.state_dict()["state"].values(), state["state"].values()):
        assert torch.equal(param_state["step"], saved["step"])
        assert torch.equal(param_state["exp_avg"], saved["exp_avg"])


def test_empty_inference_batch_and_empty_feature_dimension_are_refused():
    model = torch.nn.Linear(4, 3)
    pop = poptorch.inferenceModel(model)
    with pytest.raises(poptorch.Error, match=r"Zero-sized tensors are unsupported \(Got shape \[0, 4\]\)"):
        pop(torch.randn(0, 4))
    assert not pop.isCompiled()
    pop(torch.randn(2, 4))
    with pytest.raises(poptorch.Error, match=r"Zero-sized tensors are unsupported \(Got shape \[2, 0\]\)"):
        pop(torch.randn(2, 0))
    torch.testing.assert_close(pop(torch.ones(2, 4)), model(torch.ones(2, 4)).detach())  # still usable


# --------------------------------------------------------------------------- **kwargs
class TakesKeywords(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x, labels, **options):
        out = self.fc(x) * options.get("scale", 1.0)
        return out, F.cross_entropy(out, labels)


def test_keyword_arguments_are_named_as_poptorch_names_them(warnings_logged):
    pop = poptorch.trainingModel(TakesKeywords())
    x, labels = torch.randn(4, 4), torch.randint(0, 3, (4,))
    pop(x, labels, u=5, scale=2.0)
    assert not any("Dicts as inputs" in m for m in warnings_logged())  # **kwargs is not a dict input
    with pytest.raises(poptorch.Error, match=r"Value mismatch for u: expected 5 but got 3\."):
        pop(x, labels, u=3, scale=2.0)
    with pytest.raises(poptorch.Error, match=r"Type mismatch for u: expected int but got torch.Tensor\."):
        pop(x, labels, u=torch.ones(1), scale=2.0)
    with pytest.raises(poptorch.Error, match=r"Keys mismatch for forward: Unexpected arguments: v\. "
                                             r"Missing arguments: u\."):
        pop(x, labels, v=5, scale=2.0)
    pop(x, labels, scale=2.0, u=5)  # keyword order does not matter
