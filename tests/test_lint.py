"""The repository passes `ruff check` with the configuration in pyproject.toml (lint + import order)."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ruff_check_passes():
    # ruff is in the `test` extra: a missing ruff is a broken test environment, not a reason to skip.
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)], cwd=ROOT,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, (
        f"ruff check found problems (fix: ruff check --fix .):\n{result.stdout}{result.stderr}")
