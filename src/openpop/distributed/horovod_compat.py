"""A compatibility layer for the part of ``horovod.torch`` that IPU-era scripts use under poprun.

Graphcore's examples do their host-side collectives with horovod (``hvd.init()``, ``hvd.rank()``,
``hvd.size()``, ``hvd.broadcast(...)``, ``hvd.broadcast_parameters(...)``,
``hvd.allreduce(..., average=...)``). This module provides those calls on top of torch.distributed
and the process group of poprun's instances. It is not horovod: no tensor fusion, no timeline,
no elastic mode, no ``DistributedOptimizer`` (openpop's runtime already all-reduces gradients).

Scripts that write ``import horovod.torch as hvd`` get this module under poprun when the real
horovod is not installed (``instance.py`` puts ``openpop/distributed/horovod_alias`` on their
path; ``OPENPOP_HOROVOD_COMPAT=0`` turns that off). Elsewhere, import it by its own name:
``import openpop.distributed.horovod_compat as hvd``.

Outside poprun every call works as for a job of one process (rank 0 of 1).
"""
import os

import torch

from . import messages, process_group

Average = "Average"
Sum = "Sum"
Adasum = "Adasum"
Min = "Min"
Max = "Max"
Product = "Product"

_initialized = [False]


def init(comm=None, process_sets=None) -> None:
    """Join poprun's process group (``popdist.init()``); no-op outside poprun."""
    process_group.initialize()
    _initialized[0] = True


def is_initialized() -> bool:
    return _initialized[0]


def shutdown() -> None:
    _initialized[0] = False


def _dist():
    import torch.distributed as dist
    return dist if process_group.is_initialized() else None


def size() -> int:
    return process_group.world_size()


def rank() -> int:
    return process_group.rank()


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def local_size() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def cross_rank() -> int:
    return int(os.environ.get("GROUP_RANK", "0"))


def cross_size() -> int:
    return size() // max(1, local_size())


def _op(average, op):
    if average is not None and op is not None:
        raise ValueError(messages.OP_AND_AVERAGE)
    if op is None:
        op = Average if average is None or average else Sum
    if op == Adasum:
        raise NotImplementedError(messages.NO_ADASUM)
    return op


def allreduce_(tensor: torch.Tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None) -> torch.Tensor:
    """All-reduce ``tensor`` in place (default: average over the processes)."""
    op = _op(average, op)
    dist = _dist()
    if prescale_factor != 1.0:
        tensor.mul_(prescale_factor)
    if dist is not None:
        reduce_op = {Average: dist.ReduceOp.SUM, Sum: dist.ReduceOp.SUM, Min: dist.ReduceOp.MIN,
                     Max: dist.ReduceOp.MAX, Product: dist.ReduceOp.PRODUCT}[op]
        dist.all_reduce(tensor, op=reduce_op, group=process_group.current_group())
        if op == Average:
            if tensor.is_floating_point() or tensor.is_complex():
                tensor.div_(size())
            else:
                tensor.floor_divide_(size())
    if postscale_factor != 1.0:
        tensor.mul_(postscale_factor)
    return tensor


def allreduce(tensor: torch.Tensor, average=None, name=None, compression=None, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=None) -> torch.Tensor:
    """A new tensor: the all-reduce of ``tensor`` (default: average over the processes)."""
    return allreduce_(tensor.detach().clone(), average=average, op=op, prescale_factor=prescale_factor,
                      postscale_factor=postscale_factor)


def allgather(tensor: torch.Tensor, name=None, process_set=None) -> torch.Tensor:
    """Every process's ``tensor`` concatenated along dimension 0 (sizes may differ there)."""
    dist = _dist()
    if dist is None:
        return tensor.detach().clone()
    group = process_group.current_group()
    sizes = [None] * size()
    dist.all_gather_object(sizes, tuple(tensor.shape), group=group)
    rows = max(s[0] if s else 1 for s in sizes)
    padded = torch.zeros((rows,) + tuple(tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    padded[:tensor.shape[0]] = tensor
    parts = [torch.empty_like(padded) for _ in range(size())]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([part[:s[0]] for part, s in zip(parts, sizes)])


def broadcast_(tensor: torch.Tensor, root_rank: int, name=None, process_set=None) -> torch.Tensor:
    """Overwrite ``tensor`` with process ``root_rank``'s, in place."""
    dist = _dist()
    if dist is not None:
        with torch.no_grad():
            dist.broadcast(tensor, src=_global_rank(root_rank), group=process_group.current_group())
    return tensor


def broadcast(tensor: torch.Tensor, root_rank: int, name=None, process_set=None) -> torch.Tensor:
    """A new tensor holding process ``root_rank``'s ``tensor``."""
    return broadcast_(tensor.detach().clone(), root_rank)


def broadcast_object(obj, root_rank: int = 0, name=None, process_set=None):
    dist = _dist()
    if dist is None:
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=_global_rank(root_rank), group=process_group.current_group())
    return holder[0]


def allgather_object(obj, name=None, process_set=None) -> list:
    dist = _dist()
    if dist is None:
        return [obj]
    gathered = [None] * size()
    dist.all_gather_object(gathered, obj, group=process_group.current_group())
    return gathered


def broadcast_parameters(params, root_rank: int) -> None:
    """Overwrite the tensors of ``params`` (a ``state_dict``, ``named_parameters()`` or a list of
    ``(name, tensor)``) with process ``root_rank``'s, in place."""
    items = sorted(params.items()) if isinstance(params, dict) else list(params)
    for _, tensor in items:
        if isinstance(tensor, torch.Tensor):
            broadcast_(tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor, root_rank)


def broadcast_optimizer_state(optimizer, root_rank: int) -> None:
    """Give every process ``root_rank``'s optimizer state and hyper-parameters."""
    state = broadcast_object(optimizer.state_dict() if rank() == root_rank else None, root_rank)
    if rank() != root_rank:
        optimizer.load_state_dict(state)


def join(device=-1) -> int:
    dist = _dist()
    if dist is not None:
        dist.barrier(group=process_group.current_group())
    return 0


def _global_rank(group_rank: int) -> int:
    group = process_group.current_group()
    if group is None:
        return group_rank
    import torch.distributed as dist
    return dist.get_global_rank(group, group_rank)
