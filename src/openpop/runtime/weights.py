"""Where a model's weights live while an executor runs it, and how they sync with the host.

``SharedWeights``: the device tensors *are* the user's Parameters and buffers (the device is
the host CPU and the model trains). Nothing is ever copied; the host always sees trained values.

``CopiedWeights``: the executor holds its own copies (inference models, and any model on a
device other than the host's). Host changes reach them only through ``upload()``
(``copyWeightsToDevice``) — or automatically when a training executor of the same user model
has produced newer weights (tracked by ``weights_version``).
"""
import contextlib
import weakref

import torch

_versions = weakref.WeakKeyDictionary()


def weights_version(model: torch.nn.Module) -> int:
    """How many training host calls have changed ``model``'s weights so far."""
    return _versions.get(model, 0)


def bump_weights_version(model: torch.nn.Module) -> None:
    _versions[model] = _versions.get(model, 0) + 1


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

    def mutated(self) -> bool:
        """Whether any buffer changed (by version counter; by value for inference tensors)."""
        for (buffer, saved), version in zip(self._saved, self._versions):
            if version is None:
                if not torch.equal(buffer, saved):
                    return True
            elif buffer._version != version:
                return True
        return False

    def restore(self) -> None:
        with torch.no_grad():
            for buf, value in self._saved:
                buf.copy_(value)


def registered_tensors(model: torch.nn.Module):
    """``{qualified name: tensor}`` for parameters and buffers, to detect forward() replacing them."""
    params = {name: p for name, p in model.named_parameters(remove_duplicate=False)}
    buffers = {name: b for name, b in model.named_buffers(remove_duplicate=False)}
    return params, buffers


class ReplicaBuffers:
    """Per-replica buffer values for models whose forward mutates buffers (BatchNorm) when
    replicas do not broadcast buffers: each replica keeps its own running statistics, and the
    host sees replica 0's, as on IPUs."""

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
