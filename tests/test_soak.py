"""Soak: a dropped compiled model's program is released.

Everything measured is a count, never a time: the machine's load changes nothing here."""
import gc
import sys

import pytest
import torch

import poptorch

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 4)

    def forward(self, x, target):
        out = self.fc2(torch.relu(self.fc1(x)))
        return out, torch.nn.functional.mse_loss(out, target)


def _live(type_name):
    gc.collect()
    gc.collect()  # a program's finalizer runs in the first pass and frees a cycle for the second
    return sum(type(o).__name__ == type_name for o in gc.get_objects())


@pytest.mark.slow
def test_a_dropped_compiled_model_releases_its_program(one_thread):
    """Torch keeps what it compiles for a code object on the code object, and each compiled graph
    as a global of the traced function: with a program's own code (``program._own_code``) both
    kept every dropped model's program alive (~1.3 MB for this MLP) until ``_forget_compiled``."""
    def build_run_drop():
        model = MLP()
        opts = poptorch.Options().deviceIterations(2).openpopBackend("compiled")
        opts.showCompilationProgressBar(False)
        training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.01))
        for seed in range(3):
            training(*(torch.randn(16, n, generator=torch.Generator().manual_seed(seed)) for n in (32, 4)))
        assert training._backend.last == "compiled"

    build_run_drop()
    graphs, guards = _live("GraphModule"), _live("CheckFunctionManager")
    build_run_drop()
    build_run_drop()
    assert _live("GraphModule") <= graphs
    assert _live("CheckFunctionManager") <= guards
