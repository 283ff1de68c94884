"""Lightning's collectives across poprun's instances.

Under poprun every instance runs its own ``Trainer``: Lightning's ``world_size`` is the number
of instances and ``global_rank`` the instance index (from torchrun's variables), so
``trainer.is_global_zero``, ``rank_zero_only`` logging and checkpoint writing happen on instance
0 only, ``self.log(..., sync_dist=True)`` averages over the instances and ``trainer.num_devices``
is the instance's local replicas. The gradients of all replicas of all instances are combined
by the executor (``openpop.runtime.distributed_reduce``). With one process every call here
returns its input.
"""
import torch

from openpop.distributed import process_group

from . import messages


def join(world_size: int) -> None:
    """Join poprun's process group when Lightning sees several processes."""
    if world_size > 1 and not process_group.initialize():
        raise RuntimeError(messages.NO_PROCESS_GROUP.format(world_size=world_size))


def _active() -> bool:
    return process_group.is_initialized() and process_group.world_size() > 1


def reduce(tensor, reduce_op="mean"):
    if not _active() or not isinstance(tensor, torch.Tensor):
        return tensor
    import torch.distributed as dist
    op = str(reduce_op).lower() if reduce_op is not None else "mean"
    mean = op in ("mean", "avg", "reduceop.avg")
    reduced = tensor.detach().clone().float() if mean and not tensor.is_floating_point() else tensor.detach().clone()
    if op in ("max", "reduceop.max"):
        dist_op = dist.ReduceOp.MAX
    elif op in ("min", "reduceop.min"):
        dist_op = dist.ReduceOp.MIN
    else:
        dist_op = dist.ReduceOp.SUM
    dist.all_reduce(reduced, op=dist_op, group=process_group.current_group())
    return reduced / process_group.world_size() if mean else reduced


def barrier() -> None:
    if _active():
        import torch.distributed as dist
        dist.barrier(group=process_group.current_group())


def broadcast(obj, src: int = 0):
    if not _active():
        return obj
    import torch.distributed as dist
    holder = [obj]
    dist.broadcast_object_list(holder, src=src, group=process_group.current_group())
    return holder[0]


def all_gather(tensor):
    if not _active():
        return tensor
    import torch.distributed as dist
    parts = [torch.empty_like(tensor) for _ in range(process_group.world_size())]
    dist.all_gather(parts, tensor.contiguous(), group=process_group.current_group())
    return torch.stack(parts)
