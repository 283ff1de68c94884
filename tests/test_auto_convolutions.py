"""``auto`` keeps a convolution-bound CPU model eager (``selection.compiling_pays``): compiled, it
would call the same convolution kernels, and Inductor's kernels around them cost more than
aten's. Counted from the probe's FLOPs and ops, never timed; a user's ``compile_after`` or
``unit`` is not second-guessed, and small convolutional models, whose steps are host work, still
compile."""
import logging

import pytest
import torch

import poptorch
from openpop.runtime.compiled.selection import compiling_pays

from helpers.logs import logged


@pytest.mark.parametrize("flops,convolution_flops,ops,device,pays", [
    (3e9, 3e9, 30, "cpu", False),        # ResNet-like: convolutions, 1e8 FLOPs an op
    (3e9, 1e9, 30, "cpu", True),         # matrix products dominate (BERT): Inductor fuses around them
    (3e6, 3e6, 30, "cpu", True),         # a small CNN: its step is host work
    (3e9, 3e9, 30, "cuda", True),        # not measured on a GPU: compile as before
    (0, 0, 30, "cpu", True),             # nothing counted (elementwise only)
    (2 * 1e7 * 30, 1e7 * 30, 30, "cpu", False),  # at both bounds exactly
])
def test_the_rule(flops, convolution_flops, ops, device, pays):
    assert compiling_pays(flops, convolution_flops, ops, device) is pays


class Convolutions(torch.nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Conv2d(3, channels, 3, padding=1), torch.nn.ReLU(),
                                        torch.nn.Conv2d(channels, channels, 3, padding=1), torch.nn.ReLU())
        self.head = torch.nn.Linear(channels, 10)

    def forward(self, x, y):
        out = self.head(self.body(x).mean((2, 3)))
        return out, torch.nn.functional.cross_entropy(out, y)


def _train(channels, size, monkeypatch, **backend):
    monkeypatch.setenv("OPENPOP_BACKEND", "auto")
    torch.manual_seed(0)
    model = Convolutions(channels)
    options = poptorch.Options().openpopBackend("auto", **backend).showCompilationProgressBar(False)
    training = poptorch.trainingModel(model, options, torch.optim.SGD(model.parameters(), lr=0.01))
    x, y = torch.randn(4, 3, size, size), torch.randint(0, 10, (4,))
    with logged(logging.INFO) as messages:
        losses = [training(x, y)[1] for _ in range(2)]
    return training, losses, messages()


def test_a_convolution_bound_model_stays_eager_with_one_line_saying_why(monkeypatch):
    training, _, messages = _train(32, 48, monkeypatch)
    selection = training._dispatch.compiled.selection
    assert selection.not_paying is not None and "convolutions do" in selection.not_paying
    assert not selection.wants_compiled()
    assert training._dispatch.compiled.last != "compiled"
    said = [m for m in messages if "stays eager" in m]
    assert len(said) == 1 and "openpopBackend('compiled')" in said[0], messages
    assert any("auto: compiling would not pay" in m for m in messages), messages


@pytest.mark.parametrize("backend", [{"compile_after": 1e9}, {"unit": "program"}])
def test_a_users_choice_is_not_second_guessed(monkeypatch, backend):
    training, _, _ = _train(32, 48, monkeypatch, **backend)
    selection = training._dispatch.compiled.selection
    assert selection.not_paying is None and selection.declined is None


def test_a_small_convolutional_model_may_still_compile(monkeypatch):
    training, _, _ = _train(8, 8, monkeypatch)
    selection = training._dispatch.compiled.selection
    assert selection.estimated and selection.not_paying is None and selection.declined is None
