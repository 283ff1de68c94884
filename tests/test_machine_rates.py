"""Rates measured once per machine (``runtime/machine_rates.py``): the half-precision and GEMM
choices of every later process follow the first measurement, not the load of the moment."""
import json
import os
import subprocess
import sys

import pytest

from openpop.runtime import machine_rates


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


def test_a_measurement_is_made_once_and_kept_in_the_file(cache_home):
    calls = []

    @machine_rates.remembered("probe")
    def measure():
        calls.append(1)
        return [1.0, 2.0]

    assert measure() == [1.0, 2.0] and measure() == [1.0, 2.0] and len(calls) == 1
    with open(machine_rates.path()) as stream:
        assert json.load(stream) == {machine_rates.machine_kind(): {"probe": [1.0, 2.0]}}
    assert machine_rates.path() == os.path.join(str(cache_home), "openpop", "machine-rates.json")


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", ""])
def test_an_unreadable_file_is_measured_again(cache_home, content):
    os.makedirs(cache_home / "openpop")
    (cache_home / "openpop" / "machine-rates.json").write_text(content)
    assert machine_rates.remembered("probe")(lambda: 3.0)() == 3.0
    assert machine_rates.remembered("probe")(lambda: 4.0)() == 3.0  # (kept now)


def test_an_unwritable_cache_measures_in_each_process(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))  # a file where the directory should be
    assert machine_rates.remembered("probe")(lambda: 5.0)() == 5.0
    assert machine_rates.remembered("probe")(lambda: 6.0)() == 6.0


CHOICES = """
from openpop.runtime.compiled.onednn_matmuls import gemm_choice
from openpop.runtime.half_compute import CPU_SPEEDS, MATMUL
import torch
print(gemm_choice(), CPU_SPEEDS.half_is_fast(torch.bfloat16, MATMUL))
"""


@pytest.mark.slow
@pytest.mark.parametrize("kept, expected", [((1.0, 100.0), "onednn True"), ((100.0, 1.0), "aten False")])
def test_later_processes_choose_from_the_kept_rates(cache_home, kept, expected):
    """A file written as if the first process had measured ``kept``: the children do not measure."""
    a, b = kept
    halves = {f"{dtype} {family}": [b, a] for dtype in ("float16", "bfloat16") for family in ("matmul", "convolution")}
    os.makedirs(cache_home / "openpop")
    (cache_home / "openpop" / "machine-rates.json").write_text(json.dumps(
        {machine_rates.machine_kind(): {"cpu_gemm_float32": [a, b], "cpu_half_rates": halves}}))
    env = dict(os.environ, XDG_CACHE_HOME=str(cache_home), OMP_NUM_THREADS="1")
    for name in ("OPENPOP_CPU_GEMM", "OPENPOP_HALF_COMPUTE"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-c", CHOICES], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == expected.split()
