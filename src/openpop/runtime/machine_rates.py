"""Rates measured on this machine, kept for the processes that come after.

Two choices rest on how fast this CPU's kernels are: whether float16/bfloat16 matmuls and
convolutions compute natively (``half_compute.py``) and which library runs the compiled backend's
float32 GEMMs (``compiled/onednn_matmuls.py``). Each is measured once, on one thread, best of a
few runs; a machine busy with other work could still measure a ratio near its threshold on the
other side of it, and two processes of one job would then compute differently. So the first
measurement on a machine is kept and every later process reads it: the choice is the machine's,
not the moment's.

The rates live in ``$XDG_CACHE_HOME/openpop/machine-rates.json`` (``~/.cache/openpop/...``), one
entry per measurement and machine kind: the CPU's model name, torch's CPU capability and torch's
version. Delete the file to measure again (after a BIOS or kernel change, say). Where the file
cannot be read or written, each process measures for itself.
"""
import functools
import json
import os
import platform

import torch

from ..atomic_file import atomic_write
from ..log import logger

FILE_NAME = "machine-rates.json"


def path() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "openpop", FILE_NAME)


@functools.cache
def machine_kind() -> str:
    """What the rates depend on: the CPU model, the kernels torch picks for it, torch's version."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as stream:
            model = next((line.split(":", 1)[1].strip() for line in stream if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{model} | {torch.backends.cpu.get_cpu_capability()} | torch {torch.__version__}"


def _load() -> dict:
    try:
        with open(path()) as stream:
            table = json.load(stream)
        return table if isinstance(table, dict) else {}
    except (OSError, ValueError):
        return {}


def _store(name: str, value) -> None:
    table = _load()
    table.setdefault(machine_kind(), {})[name] = value
    try:
        os.makedirs(os.path.dirname(path()), exist_ok=True)
        atomic_write(path(), lambda stream: stream.write(json.dumps(table, indent=1, sort_keys=True).encode()))
    except OSError as exc:
        logger.debug("openpop could not keep this machine's rates in %s: %s", path(), exc)


def remembered(name: str):
    """Decorates a measurement (no arguments, a JSON value): the first call on this machine kind
    measures and keeps the value, later calls - in this process or another - return it."""
    def decorate(measure):
        @functools.wraps(measure)
        def measured_once():
            kept = _load().get(machine_kind(), {}).get(name)
            if kept is not None:
                return kept
            value = measure()
            _store(name, value)
            return value
        measured_once.measure = measure  # the measurement itself
        return measured_once
    return decorate
