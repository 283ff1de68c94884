"""Local replicas on their own devices: data parallelism across GPUs in one process.

When the device map gives replica ``r`` other devices than replica 0 (say two replicas of a
one-IPU model on ``cuda:0`` and ``cuda:1``), each replica needs its own weights there. Replica
0 is the executor's model itself (the user's Parameters for training); replicas ``1..R-1`` are
structural copies (below) placed on their own devices. Per optimizer step:

1. every replica runs its micro-batches on its own weights, accumulating its own gradients;
2. ``reduce_gradients()`` sums the replicas' gradients onto replica 0 (the all-reduce; the
   executor's ``GradientReduction`` then applies Mean/Sum and loss scaling as usual);
3. the optimizer steps replica 0 only (its state lives there, as on one device);
4. before the next step's micro-batches, ``broadcast()`` copies replica 0's parameters to the
   others — at the start of every step rather than after it, so whatever the host did to
   replica 0 between calls (an edit through ``.data``, a loaded state dict) is included.

When every replica's devices are replica 0's (the CPU, one GPU) none of this is needed: the
replicas run one after another on replica 0's weights, which is the same sum. Otherwise every
replica beyond 0 gets a copy, including one that happens to share replica 0's GPU.

A replica is a *structural* copy, as ``torch.nn.DataParallel`` makes them: every module object
is duplicated with its own parameter, buffer, submodule and hook tables, and everything else
(configuration, a Lightning module's trainer, user attributes) is shared with replica 0 and
refreshed from it at the start of every host call (``sync_attributes``, which also brings
hooks added or removed since and frozen flags). Deep-copying the model
would duplicate whatever the user's objects reference (a whole Trainer, locks that cannot be
copied). Plain attributes aliasing a parameter outside the module tables keep pointing at
replica 0's tensor. Modules with no parameters or buffers anywhere inside, on the same device as
their parent in every replica (a torchmetrics metric, an activation), are not copied at all:
every replica calls the same object, so a metric updated in ``forward`` sees every replica's
data, as it does when replicas share replica 0's devices. (Replicas running concurrently
update such an object from several threads.)

Buffers are broadcast only when weights come from the host (attach, ``copyWeightsToDevice``,
an inference model seeing newer trained weights): a buffer a forward pass mutates (BatchNorm's
running statistics) stays per replica, and the host sees replica 0's, as on IPUs.
"""
import functools
import types
from typing import Callable

import torch

from ..torch_compat import foreach_add_, foreach_copy_
from .devices import DevicePlacement
from .wrapping import original_class


class SharedWeightReplicas:
    """Every replica runs on replica 0's weights (``ReplicaModels``' interface, doing nothing)."""

    own_weights = False

    def __init__(self, model: torch.nn.Module):
        self.models: list[torch.nn.Module] = [model]

    def model(self, replica: int) -> torch.nn.Module:
        return self.models[0]

    def sync_attributes(self) -> None:
        pass

    def start_step(self) -> None:
        pass

    def reduce_gradients(self) -> None:
        pass

    def broadcast(self, buffers: bool = False) -> None:
        pass

    def install_hooks(self, locks=None) -> None:
        pass

    def remove_hooks(self) -> None:
        pass

    def place(self) -> None:
        pass

    def release(self) -> None:
        pass


class ReplicaModels:
    """Structural copies of ``model`` for replicas ``1..replicas-1``, each placed by
    ``device_of_module(replica, module_name)``."""

    own_weights = True

    def __init__(self, model: torch.nn.Module, replicas: int,
                 device_of_module: Callable[[int, str], torch.device]):
        self.models: list[torch.nn.Module] = [model]
        self.placements: list[DevicePlacement] = []
        self._module_pairs = []  # (replica 0's module, replica r's module) for every replica r
        shared = _shareable_modules(model, replicas, device_of_module)
        for r in range(1, replicas):
            modules: dict[torch.nn.Module, torch.nn.Module] = {m: m for m in shared}
            with torch.inference_mode(False), torch.no_grad():
                replica = _replicate(model, modules, {})
            self._module_pairs.extend((a, b) for a, b in modules.items() if a is not b)
            placement = DevicePlacement(replica, lambda name, r=r: device_of_module(r, name))
            placement.place()
            self.models.append(replica)
            self.placements.append(placement)
        self._params = [list(m.parameters()) for m in self.models]
        self._buffers = [list(m.buffers()) for m in self.models]

    def model(self, replica: int) -> torch.nn.Module:
        return self.models[replica]

    def sync_attributes(self) -> None:
        """Give every replica module replica 0's current plain attributes (``training`` flags,
        anything the user or a callback changed since the last call), its hooks, and which
        parameters are frozen."""
        missing = _MISSING
        for source, target in self._module_pairs:
            own = target.__dict__
            for key, value in source.__dict__.items():
                current = own.get(key, missing)
                if current is value or key in _OWN_TABLES:
                    continue
                if _is_hook_name(key) and current is not missing and _same_hooks(current, value):
                    continue  # the tables themselves are per replica
                own[key] = _replica_value(key, value, source, target)
        for params in self._params[1:]:
            for master, replica in zip(self._params[0], params):
                if replica.requires_grad != master.requires_grad:
                    replica.requires_grad_(master.requires_grad)

    def start_step(self) -> None:
        """Before a step's micro-batches: replica 0's weights as they are now (host edits included),
        no gradients."""
        self.broadcast()
        self.zero_grad()

    def zero_grad(self) -> None:
        for params in self._params[1:]:
            for p in params:
                p.grad = None

    def reduce_gradients(self) -> None:
        """Sum every replica's gradients into replica 0's (on replica 0's devices)."""
        with torch.no_grad():
            for params in self._params[1:]:
                into, added = [], []
                for master, replica in zip(self._params[0], params):
                    if replica.grad is None or not master.requires_grad:
                        replica.grad = None
                        continue
                    # Non-blocking only towards a GPU: a CPU destination must be complete when read.
                    grad = replica.grad.to(master.device, non_blocking=master.device.type == "cuda")
                    if master.grad is None:
                        master.grad = grad if grad is not replica.grad else grad.clone()
                    else:
                        into.append(master.grad)
                        added.append(grad)
                    replica.grad = None
                if into:
                    foreach_add_(into, added)

    def broadcast(self, buffers: bool = False) -> None:
        """Copy replica 0's parameters (and buffers) to every other replica."""
        with torch.inference_mode(False), torch.no_grad():
            for r in range(1, len(self.models)):
                pairs = list(zip(self._params[r], self._params[0]))
                if buffers:
                    pairs += zip(self._buffers[r], self._buffers[0])
                targets, sources = [], []  # same device and dtype: one batched copy
                for target, source in pairs:
                    if target.device == source.device and target.dtype == source.dtype:
                        targets.append(target)
                        sources.append(source)
                    else:
                        target.copy_(source, non_blocking=target.device.type == "cuda")
                if targets:
                    foreach_copy_(targets, sources)

    def install_hooks(self, locks=None) -> None:
        for placement in self.placements:
            placement.install_hooks(locks)

    def remove_hooks(self) -> None:
        for placement in self.placements:
            placement.remove_hooks()

    def place(self) -> None:
        for placement in self.placements:
            placement.place()

    def release(self) -> None:
        """Free the replicas' device memory (detach): their tensors move to the host."""
        for placement in self.placements:
            placement.restore()


_OWN_TABLES = frozenset(("_parameters", "_buffers", "_modules"))


_MISSING = object()


@functools.cache
def _is_hook_name(key: str) -> bool:
    return key.startswith("_") and "hooks" in key


def _is_hook_table(key: str, value) -> bool:
    return _is_hook_name(key) and isinstance(value, dict)


def _same_hooks(current, value) -> bool:
    """Whether a replica's hook table ``current`` holds the hooks of ``value``; both empty is
    the usual case, and the cheapest to tell."""
    return isinstance(value, dict) and ((not current and not value) or current.keys() == value.keys())


def _replica_value(key: str, value, source, target):
    """What replica module ``target`` holds for attribute ``key`` of ``source``: its own copy of
    a hook table, a method of ``source`` re-bound to itself, else the very same object."""
    if _is_hook_table(key, value):
        return type(value)(value)
    return _rebound(value, source, target)


def _replicate(module: torch.nn.Module, modules: dict, tensors: dict) -> torch.nn.Module:
    """A structural copy of ``module``: new module objects and tensor copies (ties kept through
    ``modules``/``tensors``), all other attributes shared."""
    if module in modules:
        return modules[module]
    cls = original_class(type(module))  # a replica is not the user's wrapped model: no destroy()
    replica = module.__new__(cls)
    replica.__dict__ = {key: _replica_value(key, value, module, replica) for key, value in module.__dict__.items()}
    modules[module] = replica
    replica._parameters = {name: _copied(p, tensors) for name, p in module._parameters.items()}
    replica._buffers = {name: _copied(b, tensors) for name, b in module._buffers.items()}
    replica._modules = {name: None if child is None else _replicate(child, modules, tensors)
                        for name, child in module._modules.items()}
    return replica


def _shareable_modules(model, replicas, device_of_module):
    """Modules every replica can call as they are: no tensors of their own anywhere inside, and
    no block boundary (where a device placement would hook them) in any replica."""
    shared = set()
    for name, module in model.named_modules():
        if not name or next(module.parameters(), None) is not None or next(module.buffers(), None) is not None:
            continue
        parent = name.rsplit(".", 1)[0] if "." in name else ""
        if all(device_of_module(r, name) == device_of_module(r, parent) for r in range(replicas)):
            shared.add(module)
    return shared


def _rebound(value, source, target):
    """A method bound to ``source`` stored as an attribute (an instance ``forward``) binds to
    ``target`` instead."""
    if isinstance(value, types.MethodType) and value.__self__ is source:
        return types.MethodType(value.__func__, target)
    return value


def _copied(tensor, tensors: dict):
    if tensor is None:
        return None
    copy = tensors.get(id(tensor))
    if copy is None:
        data = tensor.detach().clone()
        copy = torch.nn.Parameter(data, tensor.requires_grad) if isinstance(tensor, torch.nn.Parameter) else data
        tensors[id(tensor)] = copy
    return copy
