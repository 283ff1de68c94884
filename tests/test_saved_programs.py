"""Whole compiled programs saved in the executable cache (runtime/compiled/saved_programs.py): a
second process loads the program without Dynamo tracing it and trains as the first process and
as eager; a model differing in one op, or a Python value read by the trace that changes, does
not run the saved program."""
import json
import os
import subprocess
import sys

import pytest
import torch

import poptorch


class Net(torch.nn.Module):
    """Linear -> activation -> Linear, MSE loss; ``activation`` is the one op that differs."""

    def __init__(self, activation="relu"):
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second = torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)
        self.activation = activation

    def forward(self, x, y):
        h = self.first(x)
        h = torch.relu(h) if self.activation == "relu" else torch.tanh(h)
        out = self.second(h)
        return out, torch.nn.functional.mse_loss(out, y)


def data():
    generator = torch.Generator().manual_seed(1)
    return torch.randn(16, 8, generator=generator), torch.randn(16, 1, generator=generator)


def train(activation, backend, cache=None, calls=3, flip_after=None):
    """Train ``Net`` for ``calls`` host calls (GA 2, micro-batch 8); its weights, losses and
    which way the compiled program came (saved_programs.SavedProgram.source)."""
    model = Net(activation)
    options = poptorch.Options().openpopBackend(backend)
    options.Training.gradientAccumulation(2)
    options.showCompilationProgressBar(False)
    if cache is not None:
        options.enableExecutableCaching(cache)
    executor = poptorch.trainingModel(model, options, poptorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    if cache is not None:
        executor.compile(*data())  # compiles (or loads) without running; the first call runs that program
    losses = []
    for call in range(calls):
        if call == flip_after:
            model.activation = "tanh"
        losses.append(executor(*data())[1].tolist())
    program = getattr(executor._dispatch.compiled, "_program", None)
    saved = getattr(program, "saved", None)
    return {"losses": losses, "weights": [p.tolist() for p in model.parameters()],
            "source": getattr(saved, "source", None), "probed_on": executor._dispatch.compiled.probed_on,
            "executor": executor}


def in_subprocess(activation, cache):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENPOP_BACKEND="compiled")
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    done = subprocess.run([sys.executable, __file__, activation, cache], capture_output=True, text=True, env=env,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_same(a, b, exact=True):
    tolerance = {"rtol": 0, "atol": 0} if exact else {}
    torch.testing.assert_close(torch.tensor(a["losses"]), torch.tensor(b["losses"]), **tolerance)
    for wa, wb in zip(a["weights"], b["weights"]):
        torch.testing.assert_close(torch.tensor(wa), torch.tensor(wb), **tolerance)


@pytest.mark.slow
def test_second_process_loads_the_program_without_tracing(tmp_path):
    # Both compiling processes are fresh: in a process where other programs compiled before (the
    # suite's), torch's pickle of the program can fail ("Can't pickle _runtime_wrapper"), which
    # falls back to the ordinary compile - correct results, nothing saved (docs/guides/compiled-backend.md,
    # "The executable cache").
    cache = str(tmp_path / "cache")
    first = in_subprocess("relu", cache)
    eager = train("relu", "eager")
    assert first["source"] == "saved" and first["dynamo_frames"] > 0, first
    assert [name.endswith(".program") for name in os.listdir(tmp_path / "cache" / "openpop-programs")].count(True) == 1

    second = in_subprocess("relu", cache)
    assert second["source"] == "loaded" and second["dynamo_frames"] == 0, second
    assert (first["probed_on"], second["probed_on"]) == ("values", "shapes")  # found by the fake run's key
    assert second["outcome"].startswith("loaded from cache") and "programs: 1 loaded whole" in second["outcome"], second
    assert_same(second, first)
    assert_same(second, eager, exact=False)

    changed = in_subprocess("tanh", cache)  # one op differs, same shapes: another key
    assert changed["source"] == "saved" and changed["dynamo_frames"] > 0, changed
    assert len(os.listdir(tmp_path / "cache" / "openpop-programs")) >= 2
    assert_same(changed, train("tanh", "eager"), exact=False)


@pytest.mark.slow
def test_a_value_the_trace_read_changing_between_calls_retraces(tmp_path, monkeypatch):
    """``activation`` is a Python value the trace reads (a constant guard): flipped after the
    first call, the saved program is not run; the ordinary torch.compile path re-traces. And the
    key changes with the compiled backend's code: another openpop's programs (same version
    number, other code) are not this one's."""
    from openpop.runtime.compiled import compile_cost
    from openpop.runtime.compiled.saved_programs import program_key
    compiled = train("relu", "compiled", str(tmp_path / "cache"), calls=2, flip_after=1)
    assert compiled["source"] == "traced"
    assert_same(compiled, train("relu", "eager", calls=2, flip_after=1), exact=False)

    executor = compiled["executor"]
    program, digest = executor._dispatch.compiled._program, executor._dispatch.compiled._ops_digest
    key = program_key(executor._view, program, digest, {})
    assert program_key(executor._view, program, digest, {}) == key
    monkeypatch.setattr(compile_cost, "program_source", lambda: "other openpop")
    other_code = program_key(executor._view, program, digest, {})
    assert other_code != key
    import torch._inductor.config as inductor_config  # a process-wide Inductor setting: another program
    with inductor_config.patch(cpp_wrapper_build_separate=not inductor_config.cpp_wrapper_build_separate):
        assert program_key(executor._view, program, digest, {}) != other_code
    assert program_key(executor._view, program, digest, {}) == other_code
    handle = executor._view.model.first.register_forward_hook(lambda module, args, out: out)  # traced: keyed
    assert program_key(executor._view, program, digest, {}) != other_code
    handle.remove()
    assert program_key(executor._view, program, digest, {}) == other_code


class _Settings:
    scale = 2


def test_the_checks_read_the_values_the_trace_guarded_on_each_call():
    """The saved program's per-call checks (``_Watched``): the values of Dynamo's guard names,
    equal and of the same type; a class attribute read through Dynamo's ``dict(X.__dict__)[k]``
    spelling is read in place, and seen to change."""
    from openpop.runtime.compiled.saved_programs import _Globals, _Watched
    names = ["dict(type(self).__dict__)['scale']", "self.flag", "G['__import_os_dot_path'].sep"]
    watched = _Watched(["self"], [(names[0], 2), (names[1], True), (names[2], os.path.sep)], [])
    instance = _Settings()
    instance.flag = True
    globals_ = _Globals({})
    assert watched.constants_hold(globals_, (instance,))
    assert globals_["__import_os_dot_path"] is os.path  # resolved once, kept
    instance.flag = 1  # equal, another type: what the trace specialised on is not this
    assert not watched.constants_hold(globals_, (instance,))
    instance.flag = True
    _Settings.scale = 3
    try:
        assert not watched.constants_hold(globals_, (instance,))
        assert watched.differences(globals_, (instance,)) == [f"{names[0]}: 3 (was 2)"]
    finally:
        _Settings.scale = 2
    del instance.flag  # an attribute gone: not the program's state
    assert not watched.constants_hold(globals_, (instance,))


if __name__ == "__main__":
    from torch._dynamo.utils import counters

    from openpop.runtime.compile_cache import CompileCache, watch_compiles
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import test_saved_programs  # Net's module as under pytest: the key holds the model's classes
    torch.set_num_threads(1)
    with watch_compiles(CompileCache.at(sys.argv[2])) as outcome:
        result = test_saved_programs.train(sys.argv[1], "compiled", sys.argv[2])
    result.pop("executor")
    result.update(dynamo_frames=sum(counters["stats"].values()) + sum(counters["frames"].values()),
                  outcome=outcome.describe())
    print(json.dumps(result))


class _ScaledBlock(torch.nn.Module):
    scale = False  # a class attribute, shadowed by an instance attribute after the first call

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        return y * 0.5 if self.scale else y


class _Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = _ScaledBlock()

    def forward(self, x, target):
        out = self.block(x)
        return out, torch.nn.functional.mse_loss(out, target)


def test_an_instance_attribute_shadowing_a_class_attribute_the_trace_read_is_seen(tmp_path):
    """Dynamo guards that no instance shadows a class attribute its trace read; the saved
    program's checks did not keep that guard and ran the old trace."""
    losses = {}
    for cache in (None, str(tmp_path)):
        torch.manual_seed(0)
        model = _Scaled()
        opts = poptorch.Options().deviceIterations(2).openpopBackend("compiled", unit="program")
        opts.enableExecutableCaching(cache)
        pop = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
        g = torch.Generator().manual_seed(0)
        x, target = torch.randn(4, 4, generator=g), torch.randn(4, 4, generator=g)
        pop(x, target)
        model.block.scale = True
        losses[cache] = pop(x, target)[1]
    torch.testing.assert_close(losses[str(tmp_path)], losses[None])
