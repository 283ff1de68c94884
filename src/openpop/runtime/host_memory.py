"""Host memory that stays with the process from one step to the next.

A training step allocates and frees the same tensors every time: activations, gradients, the
optimizer's temporaries. With glibc's defaults a block above the mmap threshold (which rises
with use to at most 32 MB) comes from a fresh ``mmap`` and goes back to the kernel when freed,
and the heap's free top goes back once it exceeds twice that threshold; each step then touches
its memory for the first time again, page by page: 400-600 thousand page faults (2 GB) per
BERT-base fp32 step (micro-batch 8 x GA 2), each a kernel entry and a page zeroed
(``benchmarks/host_memory.py`` measures it). An IPU has none of this (its memory is planned
when the program compiles), nor has a GPU under PyTorch's caching allocator.

So when the first executor is built, openpop tells glibc's ``malloc`` (``mallopt``) to take
every block from the heap (``M_MMAP_MAX`` 0) and never to give the heap's free top back
(``M_TRIM_THRESHOLD`` at its maximum): freed memory is reused by the next step, as PyTorch's
CPU tuning guide gets with jemalloc or tcmalloc preloaded. The process's peak memory is what it
was; what changes is that the process keeps its peak after the step. It is process-wide and
not undone: ``OPENPOP_HOST_MEMORY=release`` keeps glibc's defaults. Other C libraries (musl,
macOS) are left alone.
"""
import ctypes
import os

from ..log import logger
from . import messages

SETTING_ENV = "OPENPOP_HOST_MEMORY"
SETTINGS = ("retain", "release")
# mallopt's parameter numbers (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
# mallopt takes an int; glibc stores the trim threshold as a size_t, so -1 is "never trim".
_NEVER = -1

_retaining = None  # None: not decided yet; then True or False for the process


def setting_from_env() -> str:
    """``OPENPOP_HOST_MEMORY`` (default ``retain``); a bad value raises ``ValueError`` naming the fix."""
    value = os.environ.get(SETTING_ENV, "retain").strip().lower() or "retain"
    if value not in SETTINGS:
        raise ValueError(messages.HOST_MEMORY_ENV.format(env=SETTING_ENV, value=os.environ.get(SETTING_ENV)))
    return value


def _glibc():
    try:
        libc = ctypes.CDLL(None)
        version = libc.gnu_get_libc_version
    except (OSError, AttributeError):
        return None
    version.restype = ctypes.c_char_p
    return libc, version().decode()


def retain_freed_memory() -> bool:
    """True when freed host memory stays in the process. The setting is checked on every call
    (a bad value is an error) and applied by the first (later calls return its answer)."""
    global _retaining
    setting = setting_from_env()
    if _retaining is not None:
        return _retaining
    found = _glibc() if setting == "retain" else None
    if found is None:
        _retaining = False
        logger.debug(messages.HOST_MEMORY_SYSTEM.format(reason=f"{SETTING_ENV}=release" if setting == "release"
                                                      else "the C library is not glibc"))
        return _retaining
    libc, version = found
    _retaining = bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, _NEVER))
    logger.debug(messages.HOST_MEMORY_RETAINED.format(version=version, env=SETTING_ENV) if _retaining
                 else messages.HOST_MEMORY_SYSTEM.format(reason=f"glibc {version} refused mallopt"))
    return _retaining
