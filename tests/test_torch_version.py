"""The torch versions openpop accepts (``openpop/torch_version.py``)."""
import pathlib
import re
import warnings

import pytest

from openpop import torch_version


@pytest.mark.parametrize("version", ["2.13.0", "2.13.0+cpu", "2.13.1+cu126"])
def test_the_checked_version_imports_silently(version):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch_version.check(version)


@pytest.mark.parametrize("version", ["2.12.1", "2.4.0+cpu", "1.13.1"])
def test_an_older_torch_is_refused_naming_the_fix(version):
    found = re.escape(version)
    with pytest.raises(ImportError, match=rf"openpop needs torch 2\.13 or newer; torch {found} is installed\. "
                                          r"Install a supported version: pip install torch==2\.13\.0"):
        torch_version.check(version)


@pytest.mark.parametrize("version", ["2.14.0", "2.14.0.dev20261101+cpu", "3.0.0"])
def test_a_newer_torch_warns(version):
    found = re.escape(version)
    with pytest.warns(RuntimeWarning, match=rf"openpop was checked with torch 2\.13; torch {found} is newer"):
        torch_version.check(version)


def test_pyproject_declares_the_same_minimum():
    text = (pathlib.Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert re.search(r'^\s*"torch>=' + re.escape(".".join(map(str, torch_version.MINIMUM))) + '"', text, re.M)
