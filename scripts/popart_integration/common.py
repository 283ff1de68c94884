"""Paths shared by the PopART integration-test tools (docs/compatibility/popart.md).

POPART_SRC: an extracted PopART source tree (``git --git-dir=<mirror> archive HEAD | tar x -C $POPART_SRC``),
default /tmp/popart. PIT_DIR: where the tools keep their lists and results, default /tmp/pit.
"""
import os

HERE = os.path.dirname(os.path.abspath(__file__))
POPART = os.environ.get("POPART_SRC", "/tmp/popart")
INTEGRATION = os.path.join(POPART, "tests", "integration")
PIT_DIR = os.environ.get("PIT_DIR", "/tmp/pit")
REGISTERED = os.path.join(PIT_DIR, "registered.json")
EXCLUDED = os.path.join(PIT_DIR, "excluded.json")
os.makedirs(PIT_DIR, exist_ok=True)
