"""``import horovod.torch`` finds openpop's compatibility layer (when horovod is not installed)
whichever IPU-stack package a script imports first: Graphcore's Swin imports ``popdist`` and then
``horovod.torch`` before it imports ``poptorch``."""
import subprocess
import sys

import pytest


@pytest.mark.slow
@pytest.mark.parametrize("first", ["popdist", "popart", "openpop"])
def test_horovod_resolves_after_any_ipu_package(first):
    code = ("import importlib.util\n"
            "real = importlib.util.find_spec('horovod') is not None\n"
            f"import {first}\n"
            "import horovod.torch as hvd\n"
            "hvd.init()\n"
            "print(real or (hvd.rank(), hvd.size()) == (0, 1))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr
