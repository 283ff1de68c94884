"""The compiled backend's choices read no clock (issue 29): the unit ``auto`` picks and the host
call at which ``auto`` compiles are the same on a busy machine as on an idle one, and ``auto``
never picks a unit that cannot run the model."""
import subprocess
import sys
import time

import pytest
import torch

import poptorch
from openpop.runtime.compiled import compile_cost
from openpop.runtime.compiled import regions as regions_module

from helpers.models import Regressor


@pytest.fixture
def fresh(monkeypatch, tmp_path_factory):
    monkeypatch.delenv("OPENPOP_COMPILE_AFTER", raising=False)
    monkeypatch.delenv("OPENPOP_COMPILED_UNIT", raising=False)
    monkeypatch.setattr(compile_cost, "_compiled_here", set())
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor")))


@pytest.fixture
def slow_clock(monkeypatch):
    """Every clock reading 10 s later than the last: each host call and probe looks 1000x slower,
    as on a machine where other work takes the cores."""
    now = [time.perf_counter()]

    def later():
        now[0] += 10.0
        return now[0]

    monkeypatch.setattr(time, "perf_counter", later)
    monkeypatch.setattr(time, "time", later)


@pytest.fixture
def busy_cores():
    """Two processes spinning on the machine's cores while the test runs."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def auto(model, calls=1, compile_after=None):
    opts = poptorch.Options().deviceIterations(2).showCompilationProgressBar(False)
    opts.openpopBackend("auto", compile_after=compile_after)
    pop = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.01))
    torch.manual_seed(0)
    x, t = torch.randn(6, 6), torch.randn(6, 2)
    for _ in range(calls):
        pop(x, t)
    assert pop._dispatch.compiled.last == "eager"
    return pop


@pytest.mark.parametrize("load", ["idle", "slow_clock", "busy_cores"])
def test_a_small_model_gets_the_program_however_busy_the_machine(fresh, request, load):
    if load != "idle":
        request.getfixturevalue(load)
    pop = auto(Regressor())
    backend = pop._dispatch.compiled
    flops_per_op = backend._flops / backend._ops
    assert flops_per_op < regions_module.REGIONS_FLOPS_PER_OP["cpu"]
    assert backend.selection.cost.regions == 0  # the estimate is the program's: unit "program"
    assert backend.selection.unit == "program"


def test_the_rental_counts_the_same_eager_seconds_under_load(fresh, slow_clock):
    """Each eager call adds its counted estimate, whatever the clock says; the estimate grows
    with the work of the call (ops and FLOPs of a micro-batch, times the micro-batches)."""
    pop = auto(Regressor(), calls=3, compile_after=1e9)
    backend = pop._dispatch.compiled
    per_call = compile_cost.eager_call_seconds(backend._ops, backend._flops, pop._geometry.batches_per_call, "cpu")
    assert backend.selection.eager_seconds == pytest.approx(3 * per_call)
    assert 0 < per_call < 1  # (the slow clock would have made it 3 x 20 s)


def test_auto_compiles_at_the_same_call_on_a_busy_machine(fresh, monkeypatch):
    """The call at which ``auto`` switches is a count: with a budget of k estimated calls, the
    (k+1)-th call compiles, slow clock or not (the compile itself is not run here)."""
    def calls_until_compiled(clock):
        with monkeypatch.context() as patch:
            if clock is not None:
                patch.setattr(time, "perf_counter", clock)
            pop = auto(Regressor(), calls=1, compile_after=1e9)
            selection = pop._dispatch.compiled.selection
            selection.compile_after = 4.5 * pop._dispatch.compiled._eager_call_seconds  # between calls 4 and 5
            calls = 1
            while not selection.wants_compiled():
                pop._dispatch.compiled.record_eager()  # an eager call: counted, no wall seconds at all
                calls += 1
            return calls

    ticks = iter(range(10**9))
    assert calls_until_compiled(None) == calls_until_compiled(lambda: 60.0 * next(ticks)) == 5


class NoRegions(torch.nn.Module):
    """Parameters of its own, no child modules: nothing for the unit "regions" to compile."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(6, 2) * 0.1)

    def forward(self, x, target):
        return torch.nn.functional.mse_loss(x @ self.weight, target)


def test_auto_never_chooses_regions_for_a_model_without_them(fresh, monkeypatch):
    """A forced compiled run would then raise "a model without regions to compile"."""
    monkeypatch.setitem(regions_module.REGIONS_FLOPS_PER_OP, "cpu", 0.0)  # the rule says regions
    assert auto(Regressor())._dispatch.compiled.selection.unit == "regions"
    assert auto(NoRegions())._dispatch.compiled.selection.unit == "program"
