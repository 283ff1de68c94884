"""The device side of a compiled executor: where its model runs and what that attachment holds.

``DeviceLayout`` (decided at compile from the plan and the device map) says whether the plan
spans several devices, whether replicas have devices of their own and whether micro-batches run
concurrently. ``DeviceSession`` holds what one attachment to those devices needs: the model's
placement (``devices.HostPlacement`` when it stays on the host), the replicas
(``replicas.SharedWeightReplicas`` or per-device ``ReplicaModels``), the device locks and thread
pool of concurrent micro-batches, and the training calls' rollback. ``attach()`` puts the
weights on the devices, ``detach()`` brings them back; ``close()`` ends the session
(``destroy()``).
"""
import contextlib
from dataclasses import dataclass

import torch

from ..log import logger
from . import compile_phases, context
from .devices import DeviceMap, DevicePlacement, HostPlacement, SameDeviceOps, reset_boundary_frames, resolve_device_map
from .pipeline import ConcurrentMicroBatches, DeviceLocks, Recomputation, concurrency_wanted
from .replicas import ReplicaModels, SharedWeightReplicas
from .transaction import HostCallRollback
from .weights import bump_weights_version, weights_version

_NO_HOST_CALL = contextlib.nullcontext()  # inference: nothing to roll back


@dataclass(frozen=True)
class DeviceLayout:
    device_map: DeviceMap
    #: Replicas beyond 0 run on devices of their own, with their own weights.
    replicas_apart: bool
    #: Micro-batches overlap across devices (``pipeline.ConcurrentMicroBatches``).
    concurrent: bool
    #: One replica's plan spans several torch devices.
    multi_device: bool
    #: Pipelined training checkpoints its recomputation units.
    recompute: bool

    @classmethod
    def of(cls, plan, settings, serial: bool = False) -> "DeviceLayout":
        """Map the plan's virtual IPUs to devices (recorded in ``plan.device_map``) and log the
        allocation. ``serial``: micro-batches run one after another whatever the devices (a model
        whose buffers carry state from one micro-batch to the next, ``buffer_state.py``)."""
        replicas = settings.geometry.replication_factor
        device_map = resolve_device_map(plan.ipus_per_replica, replicas, settings.device_map)
        plan.device_map = device_map
        if len(plan.blocks) > 1:
            logger.info("\n%s", plan.allocation_table())
        replicas_apart = replicas > 1 and not device_map.replicas_share_devices()
        return cls(
            device_map=device_map,
            replicas_apart=replicas_apart,
            concurrent=(plan.pipelined or replicas_apart) and not serial
            and concurrency_wanted(len(device_map.all_devices())),
            multi_device=any(len(device_map.distinct_devices(r)) > 1 for r in range(replicas)),
            recompute=settings.training and plan.pipelined and settings.recompute,
        )

    @property
    def on_host(self) -> bool:
        """Everything runs on the host CPU, one micro-batch after another."""
        return self.device_map.is_host_only and not (self.multi_device or self.concurrent or self.replicas_apart)


class DeviceSession:
    """One compiled model's devices (see the module docstring). Built at compile, inside the
    weights' ``active()`` context, with the model still on the host."""

    def __init__(self, model: torch.nn.Module, executable, settings):
        self.model = model
        self.executable = executable
        self.settings = settings
        layout = executable.layout
        self.locks = DeviceLocks() if layout.concurrent else None
        self.placement = HostPlacement()
        self.replicas = SharedWeightReplicas(model)
        self.uploaded_version = weights_version(model)
        self.attached = True
        self._pool = None
        self._rollback = None
        if layout.on_host:
            return
        plan = executable.plan
        ipu_of_module = {}
        for block in plan.blocks:
            for name in block.modules:
                ipu_of_module.setdefault(name, block.ipu)

        def device_of_module(replica, name):
            while name not in ipu_of_module and name:
                name = name.rpartition(".")[0]
            return layout.device_map.device(ipu_of_module.get(name, 0), replica)

        with compile_phases.phase(model, compile_phases.PLACEMENT):  # the compile's placement
            if layout.replicas_apart:
                # Copied while the model is still on the host: no second copy on replica 0's devices.
                self.replicas = ReplicaModels(model, settings.geometry.replication_factor, device_of_module)
            self.placement = DevicePlacement(model, lambda name: device_of_module(0, name))
            self.placement.place()

    # ------------------------------------------------------------------ attachment
    def upload_weights(self) -> None:
        """Host weights to the device copies, and on to every replica with its own devices."""
        weights = self.executable.weights
        weights.upload()
        self.uploaded_version = weights_version(self.model)
        with weights.active():
            self.replicas.broadcast(buffers=True)

    def upload_buffers(self, names) -> None:
        """``copyNamedBuffersToDevice``: these host buffers to the device, and on to every replica."""
        weights = self.executable.weights
        if not weights.shares_host_tensors:
            weights.upload_buffers(names)
        with weights.active():
            self.replicas.broadcast(buffers=True)

    def upload_weights_if_stale(self) -> None:
        """An inference model sees the weights a training model sharing them has changed."""
        if weights_version(self.model) != self.uploaded_version:
            self.upload_weights()

    def attach(self, optimizer) -> None:
        if self.settings.training:
            self.placement.place()
            move_optimizer_state(optimizer)
        self.replicas.place()
        self.upload_weights()
        self.attached = True

    def detach(self, optimizer) -> None:
        """Trained weights back to the host; replicas' device memory freed."""
        if self.settings.training:
            self.executable.weights.download()
            self.placement.restore()
            move_optimizer_state(optimizer)
        self.replicas.release()
        self.attached = False

    def close(self, optimizer) -> None:
        if self.attached:
            self.detach(optimizer)
        if self._pool is not None:
            self._pool.shutdown()

    # ------------------------------------------------------------------ host calls
    def micro_batch_pool(self) -> ConcurrentMicroBatches:
        """Workers for concurrent micro-batches: one per pipeline stage per replica device set."""
        if self._pool is None:
            replica_sets = self.settings.geometry.replication_factor if self.replicas.own_weights else 1
            self._pool = ConcurrentMicroBatches(self.executable.plan.pipeline_stages * replica_sets)
        return self._pool

    def host_call(self, optimizer, precision):
        """A training call is all or nothing: rolled back if it raises (transaction.py)."""
        if self._rollback is None:
            self._rollback = HostCallRollback(
                self.settings.rollback_failed_calls, steps=self.settings.geometry.device_iterations,
                models=self.replicas.models, parameters=self.executable.parameters,
                replica_buffers=self.executable.replica_buffers,
                loss_scaler=precision.dynamic, generators=precision.generators,
                devices=self.executable.plan.device_map.all_devices())
        return self._rollback.call(optimizer)

    def move_inputs(self, inputs, callers) -> None:
        # With replicas apart, each micro-batch goes to its replica's device as it enters.
        if not self.replicas.own_weights:
            self.placement.move_inputs(inputs, callers)

    @contextlib.contextmanager
    def running(self, training: bool, precision, host_call=_NO_HOST_CALL):
        """Context of one host call's run: the model in the train/eval mode it was compiled in
        (as a compiled graph would be), device hooks, ``host_call`` (a training call's rollback),
        the device weights, recomputation, the precision's settings."""
        executable = self.executable
        changed = [(module, module.training) for module, mode in executable.training_flags
                   if module.training != mode]
        for module, _ in changed:
            module.training = not module.training
        self.replicas.sync_attributes()
        same_device = SameDeviceOps() if executable.layout.multi_device else contextlib.nullcontext()
        try:
            self.placement.install_hooks(self.locks)
            self.replicas.install_hooks(self.locks)
            with host_call, executable.weights.active(), context.running(training), self._recomputation(), \
                    same_device, precision.running(self.model):
                yield
        finally:
            for module, mode in changed:
                module.training = mode
            self.placement.remove_hooks()
            reset_boundary_frames()
            self.replicas.remove_hooks()
            if training:
                # Even a failed call may have stepped the optimizer: sharing models must re-sync.
                bump_weights_version(self.model)

    def _recomputation(self):
        """Checkpointing of every replica's recomputation units for one host call."""
        if not self.executable.layout.recompute:
            return contextlib.nullcontext()
        plan = self.executable.plan
        with contextlib.ExitStack() as stack:  # unwinds what was entered if one fails
            for model in self.replicas.models:
                stack.enter_context(Recomputation(model, plan.recomputation_units, self.locks,
                                                  gpu=not plan.device_map.is_host_only))
            return stack.pop_all()


def move_optimizer_state(optimizer) -> None:
    """Optimizer state follows its parameter's device."""
    if optimizer is None:
        return
    for param, state in optimizer.state.items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.device != param.device:
                state[key] = value.to(param.device)
