"""A model the compiled backend declines keeps running at its eager speed (issue 31): after the
declined compile, a host call runs exactly the Python it ran before - counted, not timed."""
import collections

import pytest
import torch

import poptorch
from openpop.runtime.compiled import selection as selection_module

from helpers.call_counts import calls_made


class DataDependent(torch.nn.Module):
    """A branch on a tensor's value: torch.compile(fullgraph=True) rejects it."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 1)

    def forward(self, x, y):
        h = torch.relu(self.a(x))
        if h.sum().item() > -1e9:
            h = h * 1.0
        return torch.nn.functional.mse_loss(self.b(h).squeeze(-1), y)


@pytest.mark.slow
def test_a_declined_compile_leaves_the_eager_host_call_as_it_was(monkeypatch, caplog):
    monkeypatch.delenv("OPENPOP_COMPILE_AFTER", raising=False)
    model = DataDependent()
    options = poptorch.Options().openpopBackend("auto", compile_after=1e9).showCompilationProgressBar(False)
    pop = poptorch.trainingModel(model, options, torch.optim.SGD(model.parameters(), lr=0.01))
    x, y = torch.randn(8, 16), torch.randn(8)
    pop(x, y)
    pop(x, y)
    before = calls_made(lambda: pop(x, y))
    pop._dispatch.compiled.selection.compile_after = 0.0  # the rental is paid: the next call compiles
    pop(x, y)
    assert pop._dispatch.compiled.selection.declined and pop._dispatch.compiled.last == "eager"
    pop(x, y)
    after = calls_made(lambda: pop(x, y))
    name = selection_module.__file__
    assert after - before == collections.Counter()  # (fewer: the rental is no longer checked)
    assert before - after == collections.Counter({(name, "forced"): 1, (name, "budget"): 1})
