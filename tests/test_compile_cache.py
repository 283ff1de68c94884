"""The executable cache: enableExecutableCaching / POPTORCH_CACHE_DIR point torch's on-disk
compile caches at one directory, so a second process compiling the same model loads from it."""
import io
import json
import os
import subprocess
import sys
import time

import pytest
import torch

import poptorch
from openpop.runtime.compile_cache import CompileCache, compile_cache_for, watch_compiles


def compile_tiny_step(cache_dir):
    """torch.compile one training step of a tiny MLP inside the cache; the outcome and results."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    def step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    x, y = torch.randn(4, 8), torch.randn(4, 1)
    with compile_cache_for(CompileCache.at(cache_dir)) as cache, watch_compiles(cache) as outcome:
        loss = torch.compile(step)(x, y)
    return dict(outcome.as_dict(), loss=loss.item(), grads=[p.grad.tolist() for p in model.parameters()])


@pytest.mark.slow
def test_processes_sharing_a_cache_compile_once(tmp_path):
    """Two processes (one thread each) compiling the same step into one new cache directory: the
    lock lets one compile while the other waits, then loads every graph the first wrote (the second
    process of a job loads from the cache: no graph compiled, none bypassed). The test holds the
    lock until both wait, so neither can start early."""
    cache = CompileCache.at(str(tmp_path / "cache"))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    logs = [tmp_path / f"stderr{i}.log" for i in range(2)]
    with cache.locked() as held:
        assert held
        children = []
        for log in logs:
            with open(log, "w") as stderr:
                children.append(subprocess.Popen([sys.executable, __file__, cache.path], stdout=subprocess.PIPE,
                                                 stderr=stderr, text=True, env=env))
        deadline = time.monotonic() + 300
        while not all("another process is compiling into it" in log.read_text() for log in logs):
            assert time.monotonic() < deadline and all(c.poll() is None for c in children), \
                [log.read_text()[-2000:] for log in logs]
            time.sleep(0.1)
    outcomes = []
    for child, log in zip(children, logs):
        out, _ = child.communicate(timeout=600)
        assert child.returncode == 0, log.read_text()[-3000:]
        outcomes.append(json.loads(out.strip().splitlines()[-1]))
    fresh, loaded = sorted(outcomes, key=lambda o: o["loaded_from_cache"])
    assert fresh["fx_graph_misses"] > 0 and not fresh["loaded_from_cache"], outcomes
    assert loaded["loaded_from_cache"] and loaded["fx_graph_misses"] == loaded["autograd_misses"] == 0, outcomes
    assert loaded["fx_graph_hits"] > 0 and loaded["autograd_hits"] > 0, outcomes
    assert loaded["fx_graph_bypasses"] == loaded["autograd_bypasses"] == 0, outcomes
    assert os.listdir(os.path.join(cache.path, "fxgraph"))
    assert loaded["loss"] == fresh["loss"] and loaded["grads"] == fresh["grads"]


def test_cache_lock_is_reentrant_and_times_out(tmp_path, warnings_logged):
    import fcntl
    cache = CompileCache.at(str(tmp_path))
    with compile_cache_for(cache), compile_cache_for(cache):  # nested in one process: no deadlock
        pass
    with open(tmp_path / "openpop-compile.lock") as other:  # another holder, as another process would be
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again after the blocks above
        with cache.locked(timeout=0.2) as held:
            assert not held
    assert any("still locked after 0 s; compiling without the lock" in m for m in warnings_logged())
    with cache.locked(timeout=0.2) as held:  # the other holder closed its file: free
        assert held


def test_settings_restored_after_the_block(tmp_path, monkeypatch):
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    # torch's own config patching: monkeypatch's undo deletes the attribute (pytest >= 9.2), which
    # hides the entry from every later torch.compile in the process.
    with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "before"))
        monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
        cache = CompileCache.at(str(tmp_path / "cache"))
        with pytest.raises(RuntimeError, match="inside"):
            with compile_cache_for(cache):
                assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == cache.path
                assert os.environ["TRITON_CACHE_DIR"] == os.path.join(cache.path, "triton")
                from torch._inductor.runtime.cache_dir_utils import cache_dir
                assert cache_dir() == cache.path
                assert inductor_config.fx_graph_cache and functorch_config.enable_autograd_cache
                raise RuntimeError("inside")
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "before")
        assert "TRITON_CACHE_DIR" not in os.environ
        assert inductor_config.fx_graph_cache is False and functorch_config.enable_autograd_cache is False

        monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
        with compile_cache_for(cache):
            from torch._inductor.runtime.cache_dir_utils import cache_dir
            cache_dir()  # Inductor writes the variable when it resolves the directory
        assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ


def test_option_wins_over_environment(tmp_path, monkeypatch):
    from_env, from_option = str(tmp_path / "env"), str(tmp_path / "option")
    monkeypatch.setenv("POPTORCH_CACHE_DIR", from_env)
    cache = CompileCache.from_options(poptorch.Options())
    assert cache == CompileCache(from_env, "POPTORCH_CACHE_DIR") and os.path.isdir(from_env)
    assert CompileCache.from_options(poptorch.Options().enableExecutableCaching(from_option)).path == from_option
    assert CompileCache.from_options(poptorch.Options().enableExecutableCaching(None)) is None
    assert CompileCache.from_options(None).path == from_env
    monkeypatch.delenv("POPTORCH_CACHE_DIR")
    assert CompileCache.from_options(poptorch.Options()) is None
    assert CompileCache.from_options(None) is None
    with compile_cache_for(None) as nothing:
        assert nothing is None


def test_unusable_directory_is_a_clear_error_before_the_model_is_wrapped(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    model = torch.nn.Linear(2, 1)
    opts = poptorch.Options().enableExecutableCaching(str(blocker / "cache"))
    with pytest.raises(poptorch.Error, match=r"enableExecutableCaching\(\): cannot use .*a_file/cache as the "
                                             r"executable cache directory"):
        poptorch.trainingModel(model, opts)
    assert type(model) is torch.nn.Linear  # not wrapped
    monkeypatch.setenv("POPTORCH_CACHE_DIR", str(blocker))
    with pytest.raises(poptorch.Error, match="POPTORCH_CACHE_DIR: cannot use"):
        poptorch.inferenceModel(model)
    with pytest.raises(poptorch.Error, match="--executable-cache-dir: cannot use"):
        CompileCache.at(str(blocker), "--executable-cache-dir")


def test_export_and_load_with_caching_on_an_eager_model(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    x = torch.randn(3, 4)
    opts = poptorch.Options().enableExecutableCaching(str(tmp_path / "cache"))
    executor = poptorch.inferenceModel(model, opts)
    with watch_compiles() as outcome:
        executor.compileAndExport(str(tmp_path / "model.poptorch"), x)
    assert not outcome.compiled_anything and "nothing compiled" in outcome.describe()
    loaded = poptorch.load(str(tmp_path / "model.poptorch"))
    torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
    executor.loadExecutable(str(tmp_path / "model.poptorch"))
    torch.testing.assert_close(executor(x), model(x), rtol=0, atol=0)


def test_bert_reports_the_compile_and_checks_the_cache_dir_first(tmp_path, capsys):
    pytest.importorskip("transformers")
    from openpop.bert import train
    from openpop.bert.config import make_config
    cache_dir = str(tmp_path / "executables")
    config = make_config("unit_test", dataset="generated", device_iterations=1, gradient_accumulation=1,
                         training_steps=1, ipus_per_replica=1, layers_per_ipu=[3], compile_only=True,
                         data_cache_dir=str(tmp_path / "data"), disable_progress_bar=True,
                         executable_cache_dir=cache_dir)
    log = io.StringIO()
    result = train.run(config, stream=log)
    assert result.compile_outcome.cache.path == cache_dir and result.compile_outcome.seconds > 0
    lines = log.getvalue().splitlines()
    compiled = next(i for i, line in enumerate(lines) if line.startswith("Compiled/Loaded model in "))
    assert lines[compiled + 1] == (f"Compilation: nothing compiled by torch.compile; "
                                   f"executable cache {cache_dir}")

    blocker = tmp_path / "a_file"
    blocker.write_text("")
    argv = ["--config", "unit_test", "--dataset", "generated", "--data-cache-dir", str(tmp_path / "data"),
            "--executable-cache-dir", str(blocker)]
    assert train.main(argv) == 1
    err = capsys.readouterr().err
    assert "--executable-cache-dir: cannot use" in err and "Data Loading Started" not in err


@pytest.mark.slow
def test_looping_programs_are_saved_and_loaded(tmp_path):
    """A compiled program with while_loops (device iterations, micro-batches) goes into the
    executable cache: a second executor compiling the same program loads it (whole: the saved
    program bundles its graphs; Inductor's FX-graph cache, which the loops are marked cacheable
    for, serves programs compiled the ordinary way, e.g. after a saved program's values changed)."""
    from helpers.models import Regressor, make_data
    outcomes, results = [], []
    for _ in range(2):
        torch.manual_seed(0)
        model = Regressor()
        opts = poptorch.Options().deviceIterations(2).openpopBackend("compiled").enableExecutableCaching(
            str(tmp_path))
        opts.Training.gradientAccumulation(2)
        opts.showCompilationProgressBar(False)
        pop = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1))
        with watch_compiles() as outcome:
            results.append(pop(*make_data(2 * 2 * 3)))
        assert pop._dispatch.compiled.last == "compiled"
        outcomes.append(outcome)
    fresh, loaded = outcomes  # saved whole (saved_programs.py), or, where torch cannot save it, by Inductor
    assert fresh.programs_saved == 1 or fresh.fx_graph_misses > 0, fresh
    assert fresh.fx_graph_bypasses == fresh.autograd_bypasses == 0, fresh
    assert loaded.loaded_from_cache and loaded.programs_loaded == fresh.programs_saved, loaded
    assert loaded.fx_graph_misses == 0 and (loaded.autograd_misses == 0 or not fresh.programs_saved), loaded
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)


def test_isa_probes_are_remembered_in_the_cache(tmp_path, monkeypatch):
    """Inductor's per-process ISA checks load a test library in a child process each; a library
    that loaded once (recorded in the cache directory) is not probed again by a later block."""
    from torch._inductor.cpu_vec_isa import VecISA

    from openpop.runtime.compile_cache import _isa_probes_remembered
    probed = []

    def child_process_load(isa, path):
        probed.append(path)
        return not path.endswith("bad.so")

    monkeypatch.setattr(VecISA, "_probe_load", child_process_load)
    for _ in range(2):  # two processes, as far as the record goes
        with _isa_probes_remembered(str(tmp_path)):
            assert VecISA._probe_load(None, "/c/good.so") and not VecISA._probe_load(None, "/c/bad.so")
        assert VecISA._probe_load is child_process_load
    assert probed == ["/c/good.so", "/c/bad.so", "/c/bad.so"]


def test_outcome_counts_inductor_graphs():
    from openpop.runtime.compile_cache import CompileOutcome
    cache = CompileCache("/cache")
    loaded = CompileOutcome(cache, fx_graph_hits=3, autograd_hits=2, autograd_misses=1)  # unsaved empty graph
    assert loaded.loaded_from_cache and loaded.describe().startswith("loaded from cache (FX graphs: 3 from cache")
    assert loaded.describe().endswith("; executable cache /cache")
    fresh = CompileOutcome(None, fx_graph_misses=2, autograd_misses=1)
    assert not fresh.loaded_from_cache and fresh.describe().startswith("compiled fresh")
    assert fresh.describe().endswith("executable cache off")
    assert CompileOutcome(cache, fx_graph_hits=1, fx_graph_bypasses=1).describe().startswith("partly loaded")
    assert not CompileOutcome(cache).compiled_anything


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(json.dumps(compile_tiny_step(sys.argv[1])))


@pytest.fixture
def default_cache_root(tmp_path, monkeypatch):
    """The default executable cache on (the suite turns it off), under a directory of the test's."""
    monkeypatch.delenv("OPENPOP_EXECUTABLE_CACHE")
    monkeypatch.delenv("POPTORCH_CACHE_DIR", raising=False)
    monkeypatch.setenv("OPENPOP_CACHE_DIR", str(tmp_path / "root"))
    return tmp_path / "root"


def test_the_default_cache_applies_unless_a_directory_or_none_is_named(default_cache_root, tmp_path, monkeypatch):
    from openpop.runtime.compile_cache import DEFAULT_SOURCE
    default = CompileCache(str(default_cache_root / "executables"), DEFAULT_SOURCE, managed=True)
    assert CompileCache.from_options(poptorch.Options()) == default
    assert CompileCache.from_options(None) == default
    assert os.path.isdir(default.path)
    model = poptorch.trainingModel(torch.nn.Linear(2, 1))
    assert model._compile_cache == default
    named = CompileCache.from_options(poptorch.Options().enableExecutableCaching(str(tmp_path / "mine")))
    assert named == CompileCache(str(tmp_path / "mine")) and not named.managed
    assert CompileCache.from_options(poptorch.Options().enableExecutableCaching(None)) is None
    monkeypatch.setenv("POPTORCH_CACHE_DIR", str(tmp_path / "env"))
    assert CompileCache.from_options(poptorch.Options()) == CompileCache(str(tmp_path / "env"), "POPTORCH_CACHE_DIR")
    monkeypatch.delenv("POPTORCH_CACHE_DIR")
    for off in ("0", "off"):
        monkeypatch.setenv("OPENPOP_EXECUTABLE_CACHE", off)
        assert CompileCache.from_options(poptorch.Options()) is None
        assert CompileCache.from_options(None) is None


def test_an_unwritable_default_cache_is_a_warning_not_an_error(default_cache_root, warnings_logged):
    default_cache_root.write_text("")  # a file where the directory would go
    model = torch.nn.Linear(2, 1)
    assert poptorch.trainingModel(model)._compile_cache is None
    assert CompileCache.from_options(None) is None
    said = [m for m in warnings_logged() if "cannot write the default directory" in m]
    assert len(said) == 1 and "OPENPOP_EXECUTABLE_CACHE=0" in said[0], warnings_logged()


def _files_aged(directory, sizes):
    """Files of the given sizes, the first one the least recently used."""
    paths = []
    for age, size in enumerate(sizes):
        path = directory / "entries" / f"file{age}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)
        stamp = 1_000_000 + age * 100
        os.utime(path, (stamp, stamp))
        paths.append(path)
    return paths


def test_prune_deletes_the_least_recently_used_files_down_to_80_percent_of_the_cap(tmp_path):
    cache = CompileCache.at(str(tmp_path / "cache"), managed=True)
    (tmp_path / "cache" / "openpop-compile.lock").write_bytes(b"")
    paths = _files_aged(tmp_path / "cache", [300, 300, 300, 300])  # 1200 bytes
    assert cache.prune(max_bytes=1200) == 0 and all(p.exists() for p in paths)  # at the cap: kept
    assert cache.prune(max_bytes=1000) == 600  # over: down to 600 <= 800
    assert [p.exists() for p in paths] == [False, False, True, True]
    assert (tmp_path / "cache" / "openpop-compile.lock").exists()


def test_the_default_cache_takes_no_lock_and_is_pruned_after_a_compile(default_cache_root, monkeypatch,
                                                                       warnings_logged):
    import fcntl
    cache = CompileCache.from_options(None)
    paths = _files_aged(default_cache_root / "executables", [2**19] * 4)  # 2 MiB, over a 1.5 MiB cap
    monkeypatch.setenv("OPENPOP_EXECUTABLE_CACHE_MAX_MB", "1.5")
    with open(os.path.join(cache.path, "openpop-compile.lock"), "w") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another process's lock: not waited for
        with compile_cache_for(cache) as active:
            assert active is cache and os.environ["TORCHINDUCTOR_CACHE_DIR"] == cache.path
            assert all(p.exists() for p in paths)
    assert [p.exists() for p in paths] == [False, False, True, True]
    assert not any("another process is compiling" in m for m in warnings_logged())
