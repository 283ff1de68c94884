"""The command-line tools answer ``--help`` without loading torch (``openpop/__init__.py`` imports
its public names on first use): checked by what is imported, not by a clock."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# pyproject.toml's [project.scripts] (read without tomllib, which Python 3.9 and 3.10 lack)
SCRIPTS = dict(re.findall(r'^([\w-]+) = "([\w.:]+)"$',
                          (ROOT / "pyproject.toml").read_text().split("[project.scripts]")[1].split("\n[")[0], re.M))

HELP_WITHOUT_TORCH = """
import contextlib, io, sys
from {module} import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    try:
        main(["--help"])
    except SystemExit as exit:
        assert exit.code == 0, exit.code
assert "usage:" in out.getvalue(), out.getvalue()
print(sorted(name for name in sys.modules if name == "torch" or name.startswith("torch.")))
"""


@pytest.mark.parametrize("module", sorted({target.split(":")[0] for target in SCRIPTS.values()}))
def test_help_does_not_import_torch(module):
    """Every console script of pyproject.toml (openpop-bert, openpop-k8s, openpop-report, poprun)."""
    assert all(target.endswith(":main") for target in SCRIPTS.values())
    done = subprocess.run([sys.executable, "-c", HELP_WITHOUT_TORCH.format(module=module)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_public_api_still_loads_on_first_use():
    done = subprocess.run([sys.executable, "-c", "import sys, openpop; assert 'torch' not in sys.modules; "
                           "print(openpop.Options.__module__, 'torch' in sys.modules, len(openpop.__all__))"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    module, torch_loaded, names = done.stdout.split()
    assert (module, torch_loaded) == ("openpop.options", "True") and int(names) > 80
