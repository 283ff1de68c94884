"""Shared by the openpop-k8s tests: paths of the test manifests and a CLI runner."""

import os
from pathlib import Path

import yaml

from openpop.k8s.cli import main

DATA = Path(__file__).parent.parent / "data" / "k8s"
UPDATE_GOLDEN = os.environ.get("OPENPOP_UPDATE_GOLDEN") == "1"


def run_cli(capsys, *argv):
    """``openpop-k8s argv...`` in-process: (exit code, stdout, stderr)."""
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


def documents(text):
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def write_manifest(tmp_path, text, name="job.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path
