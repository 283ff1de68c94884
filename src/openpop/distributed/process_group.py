"""The torch.distributed process group that joins poprun's instances.

``initialize()`` creates the default group from the variables torchrun's agent gives every
instance (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``: the ``env://`` method), with
the backend poprun chose for the instance (``OPENPOP_DIST_BACKEND``: gloo on CPUs, NCCL for
CUDA tensors when each instance has GPUs of its own) and a timeout for every collective
(``OPENPOP_COLLECTIVE_TIMEOUT`` seconds, default 600): a collective that one instance never joins
fails with an error instead of hanging.

The group is destroyed at interpreter exit (``atexit``, registered by ``initialize``) while the
interpreter is still whole, so that gloo's worker threads are joined before finalization: a
thread that touches Python during finalization aborts the process ("terminate called without an
active exception", exit status 134). Destroying the group joins them only if nothing else holds
it: ``torch.distributed.nn.functional`` binds ``group.WORLD`` as the default argument of its
functions when first imported (``torch._dynamo`` imports it), so ``initialize`` imports it before
creating the group, where those defaults stay ``None``.

``current_group()`` is the group openpop's own collectives use (the gradient all-reduce, the
initial broadcast, the horovod compatibility layer): the whole job, or inside
``execute_on_instances`` the subgroup of the instances that run the function.
"""
import atexit
import contextlib
import datetime
import os

from .. import openpop_settings
from . import instance as _env

_current = []          # stack of subgroups entered by execute_on_instances
_subgroups = {}        # frozenset(ranks) -> ProcessGroup (created by every rank, in the same order)
_finalize_at_exit = False  # finalize() is registered with atexit


def launched_by_torchrun() -> bool:
    return all(name in os.environ for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"))


def collective_timeout() -> float:
    return openpop_settings.read("collective_timeout")


def backend() -> str:
    chosen = os.environ.get(_env.DIST_BACKEND)
    if chosen:
        return chosen
    import torch
    uses_cuda = "cuda" in os.environ.get(_env.DEVICE_MAP, "") or (
        torch.cuda.is_available() and not os.environ.get(_env.DEVICE_MAP))
    return "cpu:gloo,cuda:nccl" if uses_cuda else "gloo"


def is_initialized() -> bool:
    import torch.distributed as dist
    return dist.is_available() and dist.is_initialized()


def initialize() -> bool:
    """Create the default process group if this process was launched by poprun/torchrun and
    none exists yet. Returns whether a group exists afterwards."""
    global _finalize_at_exit
    import torch.distributed as dist
    if is_initialized():
        return True
    if not launched_by_torchrun():
        return False
    import torch.distributed.nn.functional  # noqa: F401  (see the module docstring)
    dist.init_process_group(backend=backend(), init_method="env://",
                            timeout=datetime.timedelta(seconds=collective_timeout()))
    if not _finalize_at_exit:
        atexit.register(finalize)
        _finalize_at_exit = True
    return True


def finalize() -> None:
    import torch.distributed as dist
    _subgroups.clear()
    _current.clear()
    if is_initialized():
        dist.destroy_process_group()


def current_group():
    """The group openpop's collectives run on (None: the default group)."""
    return _current[-1] if _current else None


def world_size() -> int:
    import torch.distributed as dist
    return dist.get_world_size(current_group()) if is_initialized() else 1


def rank() -> int:
    import torch.distributed as dist
    return dist.get_rank(current_group()) if is_initialized() else 0


@contextlib.contextmanager
def subgroup(ranks):
    """Collectives inside go to the subgroup of ``ranks`` (global ranks). Every process of the
    job must enter it (creating a group is itself collective); yields whether this one is in it."""
    import torch.distributed as dist
    key = frozenset(int(r) for r in ranks)
    if key == frozenset(range(dist.get_world_size())):
        group = current_group()
    else:
        group = _subgroups.get(key)
        if group is None:
            group = dist.new_group(sorted(key))
            _subgroups[key] = group
    member = dist.get_rank() in key
    if member:
        _current.append(group)
    try:
        yield member
    finally:
        if member:
            _current.pop()
