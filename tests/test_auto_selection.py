"""The ``auto`` backend's rule (``runtime/compiled/selection.py``, ``compile_cost.py``): eager until
the eager host calls have cost what compiling this program is estimated to cost. Nothing here
compiles: the estimate comes from the first (eager) call's probe, eager time is injected."""
import dataclasses
import logging
import types

import pytest
import torch

import poptorch
from openpop.runtime.compile_cache import CompileCache
from openpop.runtime.compiled import compile_cost
from openpop.runtime.compiled.selection import Selection, backend_from_env

from helpers.logs import logged
from helpers.models import FourBlocks, Regressor


@pytest.fixture
def fresh(monkeypatch, tmp_path_factory):
    """No compile_after from the environment, no program compiled in this process or in the
    Inductor cache directory yet."""
    monkeypatch.delenv("OPENPOP_COMPILE_AFTER", raising=False)
    monkeypatch.setattr(compile_cost, "_compiled_here", set())
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor")))


def first_call(model, features=6, outputs=2, ga=1, cache=None):
    """An ``auto`` training executor after its first host call (eager: the estimate is made)."""
    opts = poptorch.Options().deviceIterations(2).openpopBackend("auto").showCompilationProgressBar(False)
    opts.Training.gradientAccumulation(ga)
    if cache is not None:
        opts.enableExecutableCaching(str(cache))
    pop = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.01))
    rows = 2 * ga * 3
    pop(torch.randn(rows, features), torch.randn(rows, outputs))
    assert pop._dispatch.compiled.last == "eager"
    return pop


def test_estimate_orders_programs_by_size(fresh):
    """More ops per micro-batch: a larger estimate; accumulation adds the micro-batch loop (one
    copy of forward + backward, not GA); the estimate is the budget of eager seconds."""
    small = first_call(Regressor())._dispatch.compiled.selection
    deep = first_call(FourBlocks(), 8, 8)._dispatch.compiled.selection
    accumulated = first_call(FourBlocks(), 8, 8, ga=4)._dispatch.compiled.selection
    assert small.cost.ops < deep.cost.ops == accumulated.cost.ops
    assert (small.cost.unrolled, accumulated.cost.unrolled) == (1, 1)
    assert (deep.cost.micro_batch_loop, accumulated.cost.micro_batch_loop) == (False, True)
    assert small.cost.seconds < deep.cost.seconds < accumulated.cost.seconds
    assert accumulated.cost.seconds == pytest.approx(deep.cost.seconds + compile_cost.MICRO_BATCH_LOOP_SECONDS)
    assert small.budget == small.cost.seconds and not small.cost.warm


def test_a_stepwise_program_unrolls_its_micro_batches():
    """A stepwise program (a torch function mode in its forward) cannot loop: GA x R copies."""
    geometry = types.SimpleNamespace(micro_batches_per_step=6)
    assert compile_cost.unrolled_micro_batches(geometry, loops=False) == 6
    assert compile_cost.unrolled_micro_batches(geometry, loops=True) == 1


def test_auto_compiles_later_for_a_costlier_model(fresh):
    small = first_call(Regressor())._dispatch.compiled.selection
    deep = first_call(FourBlocks(), 8, 8)._dispatch.compiled.selection
    for selection in (small, deep):
        selection.eager_seconds = small.cost.seconds  # as if that much eager time had passed
    with logged(logging.INFO) as messages:
        assert small.wants_compiled() and small.wants_compiled() and not deep.wants_compiled()
    lines = [m for m in messages() if "auto backend" in m]
    assert len(lines) == 1 and f"{small.cost.ops} aten ops per micro-batch" in lines[0]


def test_calls_until_compiled_follow_the_estimate():
    def calls_until_compiled(cost):
        selection = Selection("auto")
        selection.set_cost(cost)
        calls = 0
        while not selection.wants_compiled():
            selection.record_eager(0.5)
            calls += 1
        return calls

    cheap = compile_cost.CompileCost(ops=30, unrolled=1, tensors=4, warm=False, fingerprint="f")
    costly = dataclasses.replace(cheap, ops=3000)
    assert 0 < calls_until_compiled(cheap) < calls_until_compiled(dataclasses.replace(costly, warm=True)) \
        < calls_until_compiled(costly)
    assert calls_until_compiled(None) == 60  # no estimate: DEFAULT_COMPILE_AFTER, 30 s


def test_explicit_compile_after_wins_over_the_estimate(monkeypatch):
    monkeypatch.delenv("OPENPOP_COMPILE_AFTER", raising=False)
    assert Selection.from_options(poptorch.Options()).needs_estimate is False  # OPENPOP_BACKEND=eager here
    options = poptorch.Options().openpopBackend("auto")
    assert Selection.from_options(options).needs_estimate
    assert Selection.from_options(options.openpopBackend("auto", compile_after=5.0)).budget == 5.0
    monkeypatch.setenv("OPENPOP_COMPILE_AFTER", "7")
    assert Selection.from_options(poptorch.Options().openpopBackend("auto")).budget == 7.0
    assert Selection.from_options(poptorch.Options().openpopBackend("auto", compile_after=5.0)).budget == 5.0


def test_a_program_compiled_before_is_estimated_warm(fresh, tmp_path, monkeypatch):
    """Compiled in this process, or into the executable cache by another: a fraction of the cost."""
    cold = first_call(Regressor(), cache=tmp_path)._dispatch.compiled.selection.cost
    compile_cost.compiled(cold, CompileCache.at(str(tmp_path)))
    again = first_call(Regressor())._dispatch.compiled.selection.cost
    assert again.warm and again.seconds == pytest.approx(cold.seconds * compile_cost.WARM_FRACTION)
    compile_cost._compiled_here.clear()  # as another process: only the cache directory knows
    assert first_call(Regressor(), cache=tmp_path)._dispatch.compiled.selection.cost.warm
    assert not first_call(Regressor())._dispatch.compiled.selection.cost.warm
    assert not first_call(Regressor(), ga=2, cache=tmp_path)._dispatch.compiled.selection.cost.warm  # another program
    with monkeypatch.context() as patch:  # another openpop traces another program: a cache miss
        patch.setattr(compile_cost, "program_source", lambda: "other openpop")
        assert not first_call(Regressor(), cache=tmp_path)._dispatch.compiled.selection.cost.warm
    compile_cost.compiled(cold)  # without an executable cache: Inductor's own directory
    compile_cost._compiled_here.clear()
    assert first_call(Regressor())._dispatch.compiled.selection.cost.warm


def test_backend_from_env_default(monkeypatch):
    monkeypatch.delenv("OPENPOP_BACKEND")
    assert backend_from_env() == "auto" and backend_from_env(default="eager") == "eager"
    monkeypatch.setenv("OPENPOP_BACKEND", "compiled")
    assert backend_from_env(default="eager") == "compiled"
    with pytest.raises(poptorch.Error, match="Unknown openpop backend 'fast'"):
        backend_from_env(default="fast")


class FailsInTheProbe(Regressor):
    """Raises in the compiled backend's probe only: the estimate is skipped, the eager call runs."""

    def forward(self, x, target):
        from openpop.runtime import context
        if getattr(context.current(), "compiled", False):
            raise ValueError("in the probe")
        return super().forward(x, target)


def test_a_probe_that_raises_leaves_the_eager_call_alone(fresh):
    selection = first_call(FailsInTheProbe())._dispatch.compiled.selection
    assert selection.estimated and selection.cost is None
    assert selection.budget == 30.0
