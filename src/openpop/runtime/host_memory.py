"""Host memory that stays with the process from one training step to the next.

A training step allocates and frees the same tensors every time: activations, gradients, the
optimizer's temporaries. With glibc's defaults a block above the mmap threshold (which rises
with use to at most 32 MB) comes from a fresh ``mmap`` and goes back to the kernel when freed,
and the heap's free top goes back once it exceeds twice that threshold; each step then touches
its memory for the first time again, page by page: 400-600 thousand page faults (2 GB) per
BERT-base fp32 step (micro-batch 8 x GA 2), each a kernel entry and a page zeroed
(``benchmarks/host_memory.py`` measures it). An IPU has none of this (its memory is planned
when the program compiles), nor has a GPU under PyTorch's caching allocator.

So when the first training executor is built, openpop tells glibc's ``malloc`` (``mallopt``) to
take blocks from the heap (``M_MMAP_MAX`` 0) and never to give the heap's free top back
(``M_TRIM_THRESHOLD`` at its maximum): the next step reuses the memory the last one freed. This
is what preloading jemalloc or tcmalloc does for PyTorch on CPUs, without their giving memory
back over time. What it costs: the process keeps the most memory it has used since (a one-off
peak, say loading a checkpoint, stays resident), fragmentation can add to that when tensor
sizes keep changing, and forked children (data-loader workers) inherit the setting.
``ctypes.CDLL("libc.so.6").malloc_trim(0)`` gives the free memory back at any time. Threads
other than the main one keep two glibc exceptions: a block larger than a thread heap (64 MB)
is still mapped on its own, and an empty thread heap is still unmapped. It is process-wide and
not undone. ``OPENPOP_HOST_MEMORY``: ``auto`` (default) applies it for training executors only (an
inference server's changing input sizes are where fragmentation grows), ``retain`` for inference
executors too, ``release`` never (glibc's defaults). It is not applied off Linux or with another
C library.
"""
import ctypes
import sys
from typing import Optional

from .. import openpop_settings
from ..log import logger
from . import messages

SETTING_ENV = openpop_settings.env("host_memory")
SETTINGS = ("auto", "retain", "release")  # auto: training executors retain
# mallopt's parameter numbers (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
# mallopt takes an int; glibc stores the trim threshold as a size_t, so -1 is "never trim".
_NEVER = -1

_retaining = None  # None: not decided yet; then True or False for the process


def setting_from_env() -> str:
    """``OPENPOP_HOST_MEMORY`` (default ``auto``); a bad value raises ``ValueError`` naming the fix."""
    return openpop_settings.choice("host_memory", SETTINGS, messages.HOST_MEMORY_ENV)


def _glibc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        version = libc.gnu_get_libc_version
    except (OSError, AttributeError, TypeError):
        return None
    version.restype = ctypes.c_char_p
    return libc, version().decode()


def applies(setting: str, training: bool) -> bool:
    """Whether an executor (``training`` or inference) applies ``setting``: ``auto`` retains for
    training executors only, ``retain`` for every executor, ``release`` for none."""
    return setting == "retain" or (setting == "auto" and training)


def retain_freed_memory(setting: Optional[str] = None, training: bool = True) -> bool:
    """Apply ``setting`` (``setting_from_env()`` when None) for an executor (``training`` or
    inference), once per process; True when freed host memory stays in the process. Later calls
    return the first answer (a later ``release`` cannot undo a ``retain`` and is logged as such)."""
    global _retaining
    setting = setting_from_env() if setting is None else setting
    if not applies(setting, training):
        if setting == "release" and _retaining:
            logger.warning(messages.HOST_MEMORY_TOO_LATE.format(env=SETTING_ENV))
        return bool(_retaining)
    if _retaining is not None:
        return _retaining
    found = _glibc()
    if found is None:
        _retaining = False
        logger.debug(messages.HOST_MEMORY_SYSTEM.format(reason="not Linux with glibc"))
        return _retaining
    libc, version = found
    _retaining = bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, _NEVER))
    if _retaining:
        logger.info(messages.HOST_MEMORY_RETAINED.format(version=version, env=SETTING_ENV))
    else:
        logger.debug(messages.HOST_MEMORY_SYSTEM.format(reason=f"glibc {version} refused mallopt"))
    return _retaining
