"""The import hook: Lightning scripts find openpop's IPU classes with no import line.

Each case starts a fresh interpreter, as a user script would (Lightning's import takes a few
seconds, so there are only two)."""
import os
import subprocess
import sys
import sysconfig

import pytest

pytest.importorskip("lightning.pytorch")

SCRIPT = """
import sys
assert "openpop" not in sys.modules  # nothing of openpop's is imported at start-up
from lightning.pytorch.strategies import IPUStrategy
from lightning.pytorch.accelerators import IPUAccelerator
from lightning.pytorch.plugins import IPUPrecisionPlugin
import lightning.pytorch as pl
trainer = pl.Trainer(accelerator="ipu", devices=2, logger=False)
assert type(trainer.strategy) is IPUStrategy and type(trainer.accelerator) is IPUAccelerator
assert type(trainer.precision_plugin) is IPUPrecisionPlugin
from pytorch_lightning.strategies import IPUStrategy as Classic
import pytorch_lightning
trainer = pytorch_lightning.Trainer(strategy=Classic(device_iterations=4), logger=False)
assert type(trainer.accelerator).__name__ == "IPUAccelerator"
print(IPUStrategy.__module__, Classic.__module__)
"""


def _run(code, **env):
    environment = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=300)


def test_pth_file_is_installed():
    from openpop.lightning import hook
    site = sysconfig.get_paths()["purelib"]
    path = os.path.join(site, hook.PTH_NAME)
    assert os.path.exists(path), f"{hook.PTH_NAME} missing from {site}: reinstall openpop (pip install -e .)"
    with open(path) as stream:
        assert stream.read() == hook.PTH_LINE


@pytest.mark.slow
def test_fresh_interpreter_needs_no_import_line():
    result = _run(SCRIPT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-2:] == ["openpop.lightning.strategy", "openpop._pytorch_lightning.strategy"]


@pytest.mark.slow
def test_hook_can_be_turned_off_and_import_line_still_works():
    code = ("try:\n    from lightning.pytorch.strategies import IPUStrategy\n"
            "except ImportError:\n    print('absent')\n"
            "import openpop.lightning\nfrom lightning.pytorch.strategies import IPUStrategy\n"
            "print(IPUStrategy.__name__)")
    result = _run(code, OPENPOP_LIGHTNING_HOOK="0")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["absent", "IPUStrategy"]
