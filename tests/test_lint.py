"""The repository passes `ruff check` with the configuration in pyproject.toml (lint + import order)."""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ruff_check_passes():
    # ruff is in the `test` extra: a missing ruff is a broken test environment, not a reason to skip.
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)], cwd=ROOT,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, (
        f"ruff check found problems (fix: ruff check --fix .):\n{result.stdout}{result.stderr}")


def test_torch_configs_are_patched_with_their_own_patch():
    """Setting a torch config attribute with pytest's monkeypatch passes here, but pytest 9.2's undo deletes
    the torch config entry for the rest of the session (CI's fresh venv failed 37 compiled tests
    after one such test): use the config module's ``patch()`` instead."""
    pattern = re.compile(r"monkeypatch\.setattr\(\s*torch\.[\w.]*config\b")
    offenders = [f"{path.relative_to(ROOT)}:{number}"
                 for path in sorted((ROOT / "tests").rglob("*.py"))
                 for number, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert not offenders, f"patch torch configs with their own patch(): {offenders}"
