"""Manual optimization (``self.automatic_optimization = False``, any number of optimizers).

No executor runs the step: the user's ``training_step`` calls ``manual_backward`` and
``optimizer.step()`` itself, so it runs eagerly on the host, once per micro-batch of the host
call (``device_iterations`` of them, times the replicas). With several replicas the replicas'
steps run in lock-step as DDP ranks (``lockstep.py``): ``IPUStrategy.backward`` calls
``meet_after_backward`` (gradients averaged over replicas) and ``IPUStrategy.optimizer_step``
calls ``lockstep_optimizer_step`` (one update, with the averaged gradients). While they run,
Lightning's per-step counters and the LR schedulers see the first replica only: each DDP rank
counts and steps its own copy once.

Under poprun (several processes, ``instances.py``) the replicas of every instance are one DDP
group: at the first manual step every instance checks it holds the same model and takes instance
0's weights, buffers and optimizer states; at every ``manual_backward`` the gradients are averaged
over the instance's replicas, then over the instances (``GlobalReplication``'s all-reduce, the
automatic path's too). Each instance then applies the same update.
"""
import functools

import torch

from openpop.enums import OutputMode
from openpop.options import Options
from openpop.runtime.distributed_reduce import GlobalReplication
from openpop.runtime.geometry import BatchGeometry
from openpop.runtime.outputs import OutputCollector

from . import lockstep
from .steps import StepCall, StepModule, run_on_host, split_on_host


def training_step(step_module: StepModule, call: StepCall, batch, options: Options, *, precision_plugin,
                  lightning_optimizers, schedulers, instances=None):
    """Run one host call of a manual-optimization ``training_step``; outputs as the training
    output mode returns them. ``instances``: the ``GlobalReplication`` of poprun's instances
    (``instances_of``), or None for one process."""
    geometry = call.geometry
    for path, tensor in _tensors(batch):
        geometry.check_divisible(path, tensor)
    mode = OutputMode.Final if options.defaultOutputMode() else OutputMode(options.output_mode)
    global _instances
    _instances = instances
    try:
        with step_module.running(call):
            if geometry.replication_factor == 1:
                return run_on_host(step_module, call, batch, geometry, mode, options.output_return_period)
            return _replicas_in_lockstep(step_module, call, batch, mode, options.output_return_period,
                                         precision_plugin, lightning_optimizers, schedulers, instances)
    finally:
        _instances = None


_instances = None  # the GlobalReplication of the manual step running now (several processes)


def instances_of(module: torch.nn.Module, optimizers, world_size: int, global_rank: int):
    """The instances' data-parallel group for manual steps under poprun, joined (instance 0's
    model and optimizer states everywhere); None for one process."""
    if world_size <= 1:
        return None
    replication = GlobalReplication(world_size, global_rank, mean=True)
    replication.join(module, optimizers[0] if optimizers else None)
    for optimizer in optimizers[1:]:
        replication.broadcast_optimizer(optimizer)
    return replication


def in_lockstep() -> bool:
    """True inside a replica thread of a lock-stepped manual-optimization step."""
    return lockstep.current() is not None


def meet_after_backward(module: torch.nn.Module) -> None:
    """After ``manual_backward``: the replicas' gradients are averaged (DDP's all-reduce), over
    the instances too under poprun."""
    replicas = lockstep.current()
    if replicas is not None:
        replicas.meet("backward")
    elif _instances is not None:
        _instances.all_reduce(list(module.parameters()))


def lockstep_optimizer_step(optimizer, closure):
    """``optimizer.step()`` inside a replica: the closure runs per replica, the update once."""
    result = closure()
    lockstep.current().meet("step", optimizer)
    return result


def _replicas_in_lockstep(step_module: StepModule, call: StepCall, batch, mode: OutputMode, period: int,
                          precision_plugin, lightning_optimizers, schedulers, instances):
    lightning_module = step_module.module
    geometry: BatchGeometry = call.geometry
    collector = OutputCollector(mode, period, geometry)
    micro_batches = dict(split_on_host(batch, geometry))
    replicas = geometry.replication_factor

    def apply_step(optimizer):
        precision_plugin._after_closure(lightning_module, optimizer)
        optimizer.step()

    saved = [(lo, lo._on_before_step, lo._on_after_step) for lo in lightning_optimizers]
    for lo, before, after in saved:  # Lightning counts each step once, not once per replica
        lo._on_before_step = _first_replica_only(before)
        lo._on_after_step = _first_replica_only(after)
    for scheduler in schedulers:  # one shared scheduler stands for every replica's copy
        scheduler.step = _first_replica_only(scheduler.step)
    try:
        for d in range(geometry.device_iterations):
            positions = [geometry.input_position(m) for m in geometry.micro_batches(steps=d, replicas=replicas)]
            steps = [functools.partial(step_module, micro_batches[p], torch.tensor([p], dtype=torch.int32))
                     for p in positions]
            outputs = lockstep.Lockstep(lightning_module, replicas, instances).run(steps, apply_step)
            if collector.wants(d, 0):
                for r, output in enumerate(outputs):
                    collector.add(r, output)
    finally:
        for lo, before, after in saved:
            lo._on_before_step, lo._on_after_step = before, after
        for scheduler in schedulers:
            del scheduler.step  # back to the class's method
    return collector.result()


def _first_replica_only(function):
    def wrapped(*args, **kwargs):
        if lockstep.replica() == 0:
            return function(*args, **kwargs)
        return None
    return wrapped


def _tensors(batch):
    from openpop.torch_compat import pytree
    leaves, _ = pytree.tree_flatten(batch)
    return [(f"batch[{i}]", leaf) for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
