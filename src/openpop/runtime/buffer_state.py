"""Buffers as device state between micro-batches, as on an IPU.

On an IPU a buffer is device memory: a forward may write it (BatchNorm's running statistics, a
memory module, a cache) and the next micro-batch - of the same step, the next device iteration,
the next host call - reads what was written, as a plain value. Every micro-batch is a forward and
backward of its own: gradients flow through a buffer's use inside the micro-batch that wrote it,
as in PyTorch, and never into an earlier micro-batch's graph.

Eager PyTorch keeps the autograd history instead: a buffer written in place with a value that
requires grad (``self.memory[idx] = new``, ``index_put_``, ``copy_``) becomes a non-leaf of that
micro-batch's graph, and the next micro-batch's backward walks into it ("Trying to backward
through the graph a second time"). A buffer reassigned in forward (``self.buf = new``) leaves a
new tensor in the module, which nothing else of the run holds.

``BufferState`` ends each micro-batch - after its backward (training), after its forward
(inference) - the way an IPU does:

* a buffer written with autograd history is detached in place (``detach_``: the same tensor and
  values, no history);
* a buffer reassigned in forward has its new value copied into the tensor registered when the
  step started, which goes back into the module's table. So the host, a training call's rollback,
  per-replica buffer sets and compiled programs keep holding the buffer (the compile trace checks
  that a reassignment keeps the buffer's shape and dtype: device state does not change them).

The plain-PyTorch oracle is the hand-written loop that detaches (``detach_()``) the buffers after
every micro-batch's backward, as Graphcore's TGN application does after each batch on the CPU.

The compile trace tells whether a model needs it (``Executable.stateful_buffers``: a buffer got
autograd history or was reassigned in the traced micro-batch); other models get none, and nothing
is done per micro-batch. A model that needs it runs its micro-batches one after another (the
serial schedule: a micro-batch's backward must be over before the next reads the buffer), on
whatever devices its plan maps. With replicas every replica keeps buffers of its own
(``weights.ReplicaBuffers``, or each replica model's own when replicas are apart) and the host sees
replica 0's, as on PopTorch with ``broadcastBuffers(False)``, which such a replicated model needs
(PopTorch's rule for buffers other than normalisation statistics).
"""
import torch


def buffer_slots(*models) -> list:
    """``(module._buffers, name)`` for every registered buffer of ``models``' modules (each module
    once, tied buffers in every slot): where a buffer lives, whichever tensor the slot holds."""
    seen, slots = set(), []
    for model in models:
        for module in model.modules():
            if id(module) not in seen:
                seen.add(id(module))
                slots.extend((module._buffers, name) for name, t in module._buffers.items() if t is not None)
    return slots


def has_history(tensor) -> bool:
    """Whether ``tensor`` carries autograd history (written, or made, from values requiring grad)."""
    return tensor.requires_grad and tensor.grad_fn is not None


def detach_in_place(table: dict, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` (``table[name]``) without its autograd history: the same tensor, detached in
    place; a view (which cannot be) is replaced in the table by a detached alias. Returns it."""
    if tensor._is_view():
        tensor = table[name] = tensor.detach()
    else:
        tensor.detach_()
    return tensor


class BufferState:
    """The buffer slots of a run's models (replica 0 first, then each replica model with buffers
    of its own) and what ends each micro-batch (module docstring)."""

    def __init__(self, models):
        self.slots = buffer_slots(*models)
        self.registered = [table.get(name) for table, name in self.slots]

    def start_step(self) -> None:
        """The tensors the modules hold now are the buffers (the host may have assigned new ones
        between calls; inference models hold their device copies here)."""
        self.registered = [table.get(name) for table, name in self.slots]

    def settle(self) -> None:
        """End a micro-batch: its buffers keep their values, not their history."""
        for index, ((table, name), tensor) in enumerate(zip(self.slots, self.registered)):
            live = table.get(name)
            if live is tensor:
                if tensor is not None and has_history(tensor):
                    self.registered[index] = detach_in_place(table, name, tensor)
                continue
            if tensor is None or live is None:  # (a buffer set or removed by the forward: its own business)
                continue
            if has_history(tensor):
                tensor = self.registered[index] = detach_in_place(table, name, tensor)
            with torch.no_grad():
                tensor.copy_(live)
            table[name] = tensor
