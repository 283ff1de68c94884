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

from .buffer_state import detach_in_place, has_history

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
    """The executor's own copies of the model's parameters and buffers, one per registered slot
    (tied slots share one). The host's tensors are looked up in their slots whenever they are
    needed: a host that assigned a new tensor to a slot between calls (a module that swaps its
    buffers when it enters ``eval()``) uploads and downloads that one, and keeps it."""

    shares_host_tensors = False

    def __init__(self, model: torch.nn.Module, device: torch.device):
        self.model = model
        self.device = torch.device(device)
        copies = {}
        self._slots = []  # (table, name, copy): table is a module's ``_parameters`` or ``_buffers``
        buffer_copies = []
        # Normal tensors even when compiled under torch.inference_mode() (Lightning's evaluation
        # loops): inference tensors have no version counter and cannot be updated outside it.
        with torch.inference_mode(False):
            for which in ("_parameters", "_buffers"):
                for module, name, tensor in _slots(model, which):
                    if id(tensor) not in copies:
                        copies[id(tensor)] = self._copy_of(tensor)
                    self._slots.append((getattr(module, which), name, copies[id(tensor)]))
                    if which == "_buffers":
                        buffer_copies.append(copies[id(tensor)])
        self._buffer_copies = buffer_copies

    def _copy_of(self, tensor):
        data = tensor.detach().to(self.device, copy=True)
        if isinstance(tensor, torch.nn.Parameter):
            return torch.nn.Parameter(data, requires_grad=tensor.requires_grad)
        return data

    def _host_pairs(self):
        """``(host tensor, copy)`` per slot, the host's as its slot holds it now (once per copy)."""
        seen, pairs = set(), []
        for table, name, copy in self._slots:
            host = table.get(name)
            if host is None or host is copy or id(copy) in seen:
                continue
            seen.add(id(copy))
            pairs.append((host, copy))
        return pairs

    def upload(self) -> None:
        with torch.inference_mode(False), torch.no_grad():
            for host, copy in self._host_pairs():
                copy.copy_(host)

    def download(self) -> None:
        with torch.no_grad():
            for host, copy in self._host_pairs():
                host.copy_(copy)

    def upload_buffers(self, names) -> None:
        wanted = set(names)
        copies = {id(host): copy for host, copy in self._host_pairs()}
        with torch.no_grad():
            for name, buf in self.model.named_buffers():
                if name in wanted:
                    copies[id(buf)].copy_(buf)

    @contextlib.contextmanager
    def active(self):
        """Run the user's module with the device copies in place of the host tensors (the slots
        hold the host's again afterwards, whichever tensors they held before)."""
        swapped = []
        try:
            for table, name, copy in self._slots:
                swapped.append((table, name, table.get(name)))
                table[name] = copy
            yield
        finally:
            for table, name, tensor in reversed(swapped):
                table[name] = tensor

    def buffers(self):
        return list(self._buffer_copies)


class BufferSnapshot:
    """Values of every buffer, to undo a pass that must leave no trace (the compile pass, the
    compiled backend's probe). With ``model``, also which tensor each of its modules' buffer
    slots holds: a forward that reassigns a buffer (``self.buf = new``) is told by
    ``reassigned()`` and put back by ``restore()``."""

    def __init__(self, buffers, model=None):
        self._saved = [(b, b.detach().clone()) for b in buffers]
        self._versions = [None if b.is_inference() else b._version for b in buffers]
        self._tables = [] if model is None else [
            (module._buffers, name, t) for module in model.modules() for name, t in module._buffers.items()
            if t is not None]

    def mutated(self) -> list:
        """The buffers that changed (by version counter; by value for inference tensors)."""
        changed = []
        for (buffer, saved), version in zip(self._saved, self._versions):
            if (not torch.equal(buffer, saved)) if version is None else buffer._version != version:
                changed.append(buffer)
        return changed

    def reassigned(self) -> list:
        """``(table, name, registered tensor, the tensor the slot holds now)`` for every buffer slot
        of the model that holds another tensor than when the snapshot was taken."""
        return [(table, name, tensor, table.get(name)) for table, name, tensor in self._tables
                if table.get(name) is not tensor]

    def restore(self) -> None:
        """Every buffer as it was: the slots hold their tensors again, with their values and no
        autograd history (a pass under autograd may have written values that require grad)."""
        for table, name, tensor in self._tables:
            table[name] = tensor
        with torch.no_grad():
            for buf, value in self._saved:
                if has_history(buf) and not buf._is_view():
                    buf.detach_()
                buf.copy_(value)
        for table, name, tensor in self._tables:
            if has_history(tensor):
                detach_in_place(table, name, tensor)


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
