"""Where virtual IPUs run: the map from (replica, IPU) to a real ``torch.device``.

Default: all visible CUDA GPUs, round-robin over ``replica * ipus_per_replica + ipu``; without
a GPU, every virtual IPU is the CPU. Override it, most specific first:

* ``Options.deviceMap(["cuda:0", "cuda:1", ...])`` (openpop extension), or
* the environment variable ``OPENPOP_DEVICE_MAP="cuda:0,cuda:1,..."``.

Entry ``k`` of an explicit map serves virtual IPU ``k`` of replica 0, then the list continues
with replica 1 (``replica * ipus_per_replica + ipu``); a shorter list is reused round-robin.
Replicas whose devices differ from replica 0's get their own weights there (``replicas.py``);
replicas sharing replica 0's devices run one after another on its weights.
"""
import threading
from collections.abc import Sequence
from typing import Optional

import torch
from torch.overrides import TorchFunctionMode

from .. import errors, openpop_settings
from . import messages

DEVICE_MAP_ENV = openpop_settings.env("device_map")
HOST = torch.device("cpu")


class DeviceMap:
    """Torch device of each virtual IPU of each replica."""

    def __init__(self, devices: Sequence[torch.device], ipus_per_replica: int, replicas: int):
        self.devices = [torch.device(d) for d in devices]
        self.ipus_per_replica = ipus_per_replica
        self.replicas = replicas

    def device(self, ipu: int, replica: int = 0) -> torch.device:
        return self.devices[(replica * self.ipus_per_replica + ipu) % len(self.devices)]

    def distinct_devices(self, replica: int = 0) -> list[torch.device]:
        seen = []
        for ipu in range(self.ipus_per_replica):
            device = self.device(ipu, replica)
            if device not in seen:
                seen.append(device)
        return seen

    def replicas_share_devices(self) -> bool:
        """Whether every replica's IPUs sit on the same devices as replica 0's."""
        return all(self.device(ipu, r) == self.device(ipu, 0)
                   for r in range(1, self.replicas) for ipu in range(self.ipus_per_replica))

    def all_devices(self) -> list[torch.device]:
        """Distinct devices used by any replica, in first-use order."""
        seen = []
        for r in range(self.replicas):
            for device in self.distinct_devices(r):
                if device not in seen:
                    seen.append(device)
        return seen

    @property
    def is_host_only(self) -> bool:
        return all(d.type == "cpu" for d in self.devices)


def parse_device_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def resolve_device_map(ipus_per_replica: int, replicas: int, explicit: Optional[Sequence[str]] = None) -> DeviceMap:
    """The device map for a plan; validates that every named device exists."""
    source = "Options.deviceMap"
    if not explicit:
        env = openpop_settings.read("device_map")
        if env:
            explicit, source = parse_device_list(env), DEVICE_MAP_ENV
    if explicit:
        devices = [_checked_device(name, source) for name in explicit]
    elif torch.cuda.is_available():
        devices = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    else:
        devices = [torch.device("cpu")]
    return DeviceMap(devices, ipus_per_replica, replicas)


def _checked_device(name, source) -> torch.device:
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as exc:
        raise errors.createPoptorchError(messages.NOT_A_DEVICE.format(source=source, name=name, error=exc)) from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = 0 if device.index is None else device.index
        if index >= count:
            raise errors.createPoptorchError(messages.NO_SUCH_CUDA_DEVICE.format(
                source=source, name=name, count=count, env=DEVICE_MAP_ENV))
        if device.index is None:  # one name per device: locks and generators are per device
            device = torch.device("cuda", torch.cuda.current_device())
    elif device.type != "cpu":
        raise errors.createPoptorchError(messages.DEVICE_TYPE.format(source=source, name=name))
    else:
        device = torch.device("cpu")  # 'cpu:1' is the same CPU, with the same random generator
    return device


class HostPlacement:
    """The model stays where it is, on the host (``DevicePlacement``'s interface, doing nothing)."""

    on_host = True

    def place(self) -> None:
        pass

    def install_hooks(self, locks=None) -> None:
        pass

    def remove_hooks(self) -> None:
        pass

    def restore(self) -> None:
        pass

    def move_inputs(self, inputs, callers) -> None:
        pass


class DevicePlacement:
    """Puts each module's parameters and buffers on its block's device, and moves activations
    to a module's device as it is entered (block boundaries are where they change device).

    Only used when the map names a device other than the host CPU; the host model's tensors
    then live on those devices while the executor is attached (``restore()`` brings them back).
    """

    def __init__(self, model: torch.nn.Module, device_of_module):
        self.model = model
        self.device_of_module = device_of_module  # qualified module name -> torch.device
        self._boundaries = self._block_boundaries()
        self._hooks = []

    def _block_boundaries(self):
        """``(module, device)`` where activations change device: the root, and every module whose
        device differs from its parent's. Computed once; hooks go only there."""
        parents = {}
        for name, module in self.model.named_modules():
            for child_name, _ in module.named_children():
                parents[f"{name}.{child_name}" if name else child_name] = name
        boundaries = []
        for name, module in self.model.named_modules():
            device = self.device_of_module(name)
            if not name or self.device_of_module(parents.get(name, "")) != device:
                boundaries.append((module, device))
        return boundaries

    def place(self) -> None:
        with torch.no_grad():
            for name, module in self.model.named_modules():
                device = self.device_of_module(name)
                for table in (module._parameters, module._buffers):
                    for tensor in table.values():
                        if tensor is not None and tensor.device != device:
                            tensor.data = tensor.data.to(device)
                            if tensor.grad is not None:
                                tensor.grad = tensor.grad.to(device)

    def install_hooks(self, locks=None) -> None:
        """Move activations at the boundaries; with ``locks`` (a ``pipeline.DeviceLocks``, for
        concurrent micro-batches) the running thread also holds the device's lock inside."""
        for module, device in self._boundaries:
            self._hooks.append(module.register_forward_pre_hook(_mover(device, locks), with_kwargs=True))
            if locks is not None or device.type == "cuda":
                self._hooks.append(module.register_forward_hook(_leaver(device, locks), always_call=True))

    def remove_hooks(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def move_inputs(self, inputs, callers) -> None:
        """One host-to-device copy of the combined batch per call (to the root module's device),
        not one per micro-batch. ``inputs``: ``args.BoundInputs``; ``callers``: ``args.CallerTensors``."""
        device = self.device_of_module("")
        for pos in inputs.tensor_positions:
            tensor = inputs.leaves[pos]
            if tensor.device != device:
                on_device = tensor.to(device, non_blocking=device.type == "cuda")
                callers.replaced(pos, tensor, on_device)
                inputs.leaves[pos] = on_device

    def restore(self, host=HOST) -> None:
        self.remove_hooks()
        with torch.no_grad():
            for module in self.model.modules():
                for table in (module._parameters, module._buffers):
                    for tensor in table.values():
                        if tensor is not None and tensor.device != host:
                            tensor.data = tensor.data.to(host)


def _mover(device, locks=None):
    def move(module, args, kwargs):
        if locks is None and device.type != "cuda":  # nothing to undo: no leaver is installed
            return to_device(args, device), to_device(kwargs, device)
        frames = _frames()
        frame = [module, None, False]  # module, CUDA device to restore, lock entered
        frames.append(frame)
        if locks is not None:
            locks.enter(device)
            frame[2] = True
        if device.type == "cuda":
            frame[1] = torch.cuda.current_device()
            torch.cuda.set_device(device)
        return to_device(args, device), to_device(kwargs, device)
    return move


def _leaver(device, locks=None):
    def leave(module, args, output):
        frames = _frames()
        if not frames or frames[-1][0] is not module:
            return  # this module's mover never ran (an earlier pre-hook raised)
        _, cuda_before, locked = frames.pop()
        try:
            if cuda_before is not None:
                torch.cuda.set_device(cuda_before)
        finally:
            if locked:
                locks.exit()
    return leave


# Per thread: one frame per block boundary being run. While a block runs on a GPU that GPU is
# the thread's current CUDA device, so ``torch.randn(..., device="cuda")``, ``.cuda()`` and the
# block's random numbers use it (as ``DataParallel`` does for its replicas).
_boundary_frames = threading.local()


def _frames() -> list:
    frames = getattr(_boundary_frames, "frames", None)
    if frames is None:
        frames = _boundary_frames.frames = []
    return frames


def reset_boundary_frames() -> None:
    """After an interrupted forward (KeyboardInterrupt skips forward hooks): restore the CUDA
    device the thread had before its first block and forget the frames."""
    frames = _frames()
    first_cuda = next((cuda for _, cuda, _ in frames if cuda is not None), None)
    frames.clear()
    if first_cuda is not None:
        torch.cuda.set_device(first_cuda)


def to_device(value, device):
    """``value`` with every tensor inside moved to ``device`` (non-blocking where possible)."""
    if isinstance(value, torch.Tensor):
        # Non-blocking only towards a GPU: a CPU destination must be complete when it is read.
        return value if value.device == device else value.to(device, non_blocking=device.type == "cuda")
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(to_device(v, device) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(to_device(v, device) for v in value)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    return value


class SameDeviceOps(TorchFunctionMode):
    """Active while a model spanning several devices runs: an op whose tensor arguments sit on
    different devices (say ``F.mse_loss(output_of_last_block, target)`` in the root forward)
    runs on its first tensor argument's device, where PopTorch would run it in the active block."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        first = _first_tensor(args)
        if first is not None and _devices_differ(first.device, args, kwargs):
            args, kwargs = to_device(args, first.device), to_device(kwargs, first.device)
        return func(*args, **kwargs)


def _first_tensor(values):
    for value in values:
        if isinstance(value, torch.Tensor):
            return value
        if isinstance(value, (list, tuple)):
            found = _first_tensor(value)
            if found is not None:
                return found
    return None


def _devices_differ(device, args, kwargs) -> bool:
    def differs(value):
        if isinstance(value, torch.Tensor):
            return value.dim() > 0 and value.device != device
        if isinstance(value, (list, tuple)):
            return any(differs(v) for v in value)
        if isinstance(value, dict):
            return any(differs(v) for v in value.values())
        return False
    return differs(args) or differs(kwargs)
