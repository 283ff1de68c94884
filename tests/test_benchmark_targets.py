"""``benchmarks/run_all.py``'s targets table (``benchmarks/_targets.py``): each target's verdict from a
benchmark's JSON line, and each figure read from a key its benchmark actually writes."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

BENCHMARKS = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks")


def _targets_module():
    spec = importlib.util.spec_from_file_location("_targets", os.path.join(BENCHMARKS, "_targets.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


targets = _targets_module()


def test_verdicts_follow_each_bound_and_its_direction():
    at_least = targets.Target("x", "b", targets._path("a", "b"), 1.0, True)
    at_most = targets.Target("y", "b", targets._ratio(targets._path("n"), targets._path("d")), 0.5, False)
    assert at_least.check({"a": {"b": 1.2}}) == (1.2, "met")
    assert at_least.check({"a": {"b": 0.9}}) == (0.9, "short")
    assert at_least.check({"a": {}}) == (None, "not measured")
    assert at_least.check(None) == (None, "not measured")
    assert at_most.check({"n": 1.0, "d": 4.0}) == (0.25, "met")
    assert at_most.check({"n": 3.0, "d": 4.0}) == (0.75, "short")
    assert at_most.check({"n": 3.0}) == (None, "not measured")


@pytest.mark.parametrize("target", targets.TARGETS, ids=lambda t: t.benchmark + ":" + t.name[:30])
def test_every_target_reads_keys_its_benchmark_writes(target):
    """A renamed key in a benchmark's JSON line would turn its target into "not measured" for ever:
    the keys a target reads appear in the benchmark's source (literally, or as an f-string's
    prefix: ``f"ipu_di{n}"``)."""
    if target.pending:
        pytest.skip(f"pending: {target.pending}")
    source = open(os.path.join(BENCHMARKS, target.benchmark + ".py")).read()
    keys = [cell.cell_contents for reader in _readers(target.read) for cell in reader.__closure__
            if isinstance(cell.cell_contents, tuple)]
    assert keys, target.name
    for key_path in keys:
        for key in key_path:
            stem = key.rstrip("0123456789")
            assert f'"{key}"' in source or f'"{stem}{{' in source or key in ("fp32", "bf16"), \
                f"{target.benchmark}.py never writes {key!r}"


def _readers(read):
    """The ``_path`` readers inside ``read`` (itself one, or a ``_ratio`` of two)."""
    cells = [cell.cell_contents for cell in read.__closure__ or ()]
    if any(isinstance(c, tuple) for c in cells):
        return [read]
    return [inner for c in cells if callable(c) for inner in _readers(c)]


def test_run_all_prints_the_targets_from_the_recorded_results(tmp_path):
    (tmp_path / "results.jsonl").write_text(json.dumps(
        {"benchmark": "host_overhead", "us_per_step": {"compiled_di256": 10.0, "hand_compiled": 100.0}}) + "\n")
    done = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "run_all.py"), "--targets", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if "compiled DI=256" in line)
    assert "| 0.1 |" in row and row.endswith("| met |")
    assert done.stdout.count("not measured") == len(targets.TARGETS) - 1
