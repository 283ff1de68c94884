"""Global replication (popdist / poprun: replicas in several processes) on the compiled backend.

The eager backend all-reduces a step's gradients between the processes in
``GradientReduction.finish_step`` (``distributed_reduce.py``): after the step's micro-batches, on the
loss-scaled gradients, before they are unscaled and checked for overflow. Each unit keeps that place:

* **regions** (``regions.py``): the host call *is* the eager backend's, so its all-reduce is eager's
  - between and after the compiled regions, overlapped with the last backward, in the same buckets.
* **program** (``program.py``): the all-reduce is part of the program - ``ProgramAllReduce`` on the
  step's summed, loss-scaled gradients, before the division that unscales them, through torch's
  functional collectives (traced by Dynamo, run by Inductor as calls into the same process group:
  gloo on the CPU). ``Mean`` divides by the number of processes first, as eager does, so every
  process then unscales, checks and updates from the same values: the same weights everywhere,
  and the steps automatic loss scaling skips are the same in every process.

The processes must agree on which backend and unit run each host call, since eager's buckets and
the program's one flat all-reduce are different collectives: the choice is made from counted
quantities only (``selection.py``), and with several processes nothing one process's cache holds
changes it (``compile_cost.py`` ignores the warm markers and the remembered unit then).

``program_reason`` says why the program unit cannot run a model under several processes: a program
with CUDA graphs (not checked with NCCL collectives inside a graph). ``auto`` then takes the regions.
"""
import torch

from .. import messages


def num_processes(call) -> int:
    """How many processes train this model together (1: this one alone, or inference)."""
    return getattr(call.processes, "num_processes", 1)


def program_reason(call):
    """Why the program unit cannot run ``call`` under several processes, or None."""
    if num_processes(call) <= 1:
        return None
    parameter = next(call.model.parameters(), None)
    if parameter is not None and parameter.device.type == "cuda":
        return messages.PROGRAM_PROCESSES_CUDA
    return None


class ProgramAllReduce:
    """The step's gradients summed (``Sum``) or averaged (``Mean``) over the processes, traced into
    the program: one flat all-reduce per dtype, as the eager buckets' values (``distributed_reduce``)."""

    def __init__(self, processes):
        import torch.distributed as dist

        from ...distributed import process_group
        self.num_processes = processes.num_processes
        self.mean = processes.mean
        self.group = process_group.current_group() or dist.group.WORLD

    @classmethod
    def of(cls, call):
        """The all-reduce of ``call``'s training programs, or None (one process, inference)."""
        if not call.training or num_processes(call) <= 1:
            return None
        return cls(call.processes)

    def __call__(self, grads):
        from ...torch_compat import functional_all_reduce
        groups = {}
        for index, grad in enumerate(grads):
            groups.setdefault(grad.dtype, []).append(index)
        reduced = list(grads)
        for indices in groups.values():
            flat = torch.cat([grads[i].reshape(-1) for i in indices])
            if self.mean:
                flat = flat / self.num_processes
            flat = functional_all_reduce(flat, "sum", self.group)
            offset = 0
            for i in indices:
                n = grads[i].numel()
                reduced[i] = flat[offset:offset + n].view_as(grads[i])
                offset += n
        return reduced
