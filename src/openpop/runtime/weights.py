"""Where a model's weights live while an executor runs it, and how they sync with the host.

``SharedWeights`` (every training executor): the device tensors *are* the user's Parameters and
buffers (placement moves them onto their stages' devices). Nothing is ever copied; the user's
model always holds the trained values.

``CopiedWeights`` (every inference executor): the executor holds its own copies, on the host
CPU until placement moves them. Host changes reach them only through ``upload()``
(``copyWeightsToDevice``) — or automatically when a training executor of the same user model
has produced newer weights (tracked by ``weights_version``).
"""
import contextlib
import weakref

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_versions = weakref.WeakKeyDictionary()  # model -> [version]


def weights_version(model: torch.nn.Module) -> int:
    """How many training host calls have changed ``model``'s weights so far."""
    return version_cell(model)[0]


def bump_weights_version(model: torch.nn.Module) -> None:
    version_cell(model)[0] += 1


def version_cell(model: torch.nn.Module) -> list:
    """``[weights_version(model)]``, the list that holds it (a caller may keep it and add to it:
    a compiled host call costs microseconds, a weak dictionary's look-up shows)."""
    cell = _versions.get(model)
    if cell is None:
        cell = _versions[model] = [0]
    return cell


def _slots(model: torch.nn.Module, which: str):
    """``(module, name, tensor)`` for every registered parameter or buffer, tied ones included."""
    for module in model.modules():
        for name, tensor in getattr(module, which).items():
            if tensor is not None:
                yield module, name, tensor


class SharedWeights:
    shares_host_tensors = True

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def upload(self) -> None:
        pass

    def download(self) -> None:
        pass

    @contextlib.contextmanager
    def active(self):
        yield

    def buffers(self):
        return [t for _, _, t in _slots(self.model, "_buffers")]


class CopiedWeights:
    shares_host_tensors = False

    def __init__(self, model: torch.nn.Module, device: torch.device):
        self.model = model
        self.device = torch.device(device)
        self._param_slots = list(_slots(model, "_parameters"))
        self._buffer_slots = list(_slots(model, "_buffers"))
        copies = {}
        # Normal tensors even when compiled under torch.inference_mode() (Lightning's evaluation
        # loops): inference tensors have no version counter and cannot be updated outside it.
        with torch.inference_mode(False):
            for _, _, tensor in self._param_slots + self._buffer_slots:
                if id(tensor) not in copies:
                    copies[id(tensor)] = self._copy_of(tensor)
        self._copies = copies

    def _copy_of(self, tensor):
        data = tensor.detach().to(self.device, copy=True)
        if isinstance(tensor, torch.nn.Parameter):
            return torch.nn.Parameter(data, requires_grad=tensor.requires_grad)
        return data

    def upload(self) -> None:
        with torch.inference_mode(False), torch.no_grad():
            for _, _, tensor in self._param_slots + self._buffer_slots:
                self._copies[id(tensor)].copy_(tensor)

    def download(self) -> None:
        with torch.no_grad():
            for _, _, tensor in self._param_slots + self._buffer_slots:
                tensor.copy_(self._copies[id(tensor)])

    def upload_buffers(self, names) -> None:
        wanted = set(names)
        with torch.no_grad():
            for name, buf in self.model.named_buffers():
                if name in wanted:
                    self._copies[id(buf)].copy_(buf)

    @contextlib.contextmanager
    def active(self):
        """Run the user's module with the device copies in place of the host tensors."""
        swapped = []
        try:
            for module, name, tensor in self._param_slots:
                module._parameters[name] = self._copies[id(tensor)]
                swapped.append((module._parameters, name, tensor))
            for module, name, tensor in self._buffer_slots:
                module._buffers[name] = self._copies[id(tensor)]
                swapped.append((module._buffers, name, tensor))
            yield
        finally:
            for table, name, tensor in swapped:
                table[name] = tensor

    def buffers(self):
        return [self._copies[id(t)] for _, _, t in self._buffer_slots]


class BufferSnapshot:
    """Values of every buffer, to undo a pass that must leave no trace (the compile pass)."""

    def __init__(self, buffers):
        self._saved = [(b, b.detach().clone()) for b in buffers]
        self._versions = [None if b.is_inference() else b._version for b in buffers]

    def mutated(self) -> list:
        """The buffers that changed (by version counter; by value for inference tensors)."""
        changed = []
        for (buffer, saved), version in zip(self._saved, self._versions):
            if (not torch.equal(buffer, saved)) if version is None else buffer._version != version:
                changed.append(buffer)
        return changed

    def restore(self) -> None:
        with torch.no_grad():
            for buf, value in self._saved:
                buf.copy_(value)


class NormStatistics(TorchFunctionMode):
    """Records, while the compile trace runs, the buffers batch and instance normalisation
    update as their running statistics (``nn.BatchNorm*``, ``SyncBatchNorm``, ``InstanceNorm*``
    with ``track_running_stats``, and ``F.batch_norm`` on a model's own buffers).

    PopTorch lets these change on every replica - each keeps its own, as ``broadcastBuffers(False)``
    allows for any buffer - because the normalisation op itself updates them; a buffer changed
    in place by any other code needs ``broadcastBuffers(False)`` with replicas. The kernels update
    running statistics without bumping their version counters, so this record is also how a
    trace knows they changed."""

    # function -> (running_mean, running_var, the flag that makes the call update them, its
    # default), each argument as (position, name)
    _ARGUMENTS = {
        F.batch_norm: ((1, "running_mean"), (2, "running_var"), (5, "training"), False),
        F.instance_norm: ((1, "running_mean"), (2, "running_var"), (5, "use_input_stats"), True),
        torch.batch_norm: ((3, "running_mean"), (4, "running_var"), (5, "training"), None),
        torch.instance_norm: ((3, "running_mean"), (4, "running_var"), (5, "use_input_stats"), None),
    }

    def __init__(self):
        super().__init__()
        self._updated = {}  # id -> tensor updated as a running statistic

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        arguments = self._ARGUMENTS.get(func)
        if arguments is not None:
            mean, var, flag, default = arguments
            if _argument(args, kwargs, flag, default):
                for position in (mean, var):
                    value = _argument(args, kwargs, position, None)
                    if isinstance(value, torch.Tensor):
                        self._updated[id(value)] = value
        return func(*args, **kwargs)

    def of(self, model: torch.nn.Module) -> list:
        """The buffers of ``model`` updated as statistics, with the ``num_batches_tracked``
        counter of each module holding one (BatchNorm counts its updates there)."""
        statistics = []
        for module in model.modules():
            own = [b for b in module._buffers.values() if b is not None and id(b) in self._updated]
            counter = module._buffers.get("num_batches_tracked")
            if own and counter is not None:
                own.append(counter)
            statistics.extend(own)
        return statistics


def _argument(args, kwargs, where, default):
    position, name = where
    return kwargs.get(name, args[position] if position < len(args) else default)


def registered_tensors(model: torch.nn.Module):
    """``{qualified name: tensor}`` for parameters and buffers, to detect forward() replacing them."""
    params = dict(model.named_parameters(remove_duplicate=False))
    buffers = dict(model.named_buffers(remove_duplicate=False))
    return params, buffers


class SharedBuffers:
    """Replicas share the live buffers (``ReplicaBuffers``' interface, doing nothing)."""

    per_replica = False
    values = ()
    current = 0

    def switch_to(self, replica: int) -> None:
        pass


class ReplicaBuffers:
    """Per-replica buffer values for models whose forward mutates buffers (BatchNorm statistics;
    any buffer with ``broadcastBuffers(False)``) when replicas share weights: each replica keeps
    its own values, and the host sees replica 0's, as on IPUs."""

    per_replica = True

    def __init__(self, buffers, replicas: int):
        self.buffers = buffers
        self.values = [[b.detach().clone() for b in buffers] for _ in range(replicas)]
        self.current = 0

    def switch_to(self, replica: int) -> None:
        if replica == self.current:
            return
        with torch.no_grad():
            for live, stored in zip(self.buffers, self.values[self.current]):
                stored.copy_(live)
            for live, stored in zip(self.buffers, self.values[replica]):
                live.copy_(stored)
        self.current = replica
