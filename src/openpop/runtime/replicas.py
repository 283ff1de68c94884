"""Local replicas on their own devices: data parallelism across GPUs in one process.

When the device map gives replica ``r`` other devices than replica 0 (say two replicas of a
one-IPU model on ``cuda:0`` and ``cuda:1``), each replica needs its own weights there. Replica
0 is the executor's model itself (the user's Parameters for training); replicas ``1..R-1`` are
deep copies placed on their own devices. Per optimizer step:

1. every replica runs its micro-batches on its own weights, accumulating its own gradients;
2. ``reduce_gradients()`` sums the replicas' gradients onto replica 0 (the all-reduce; the
   executor's ``GradientReduction`` then applies Mean/Sum and loss scaling as usual);
3. the optimizer steps replica 0 only (its state lives there, as on one device);
4. ``broadcast()`` copies replica 0's parameters to the others.

Replicas sharing their devices with replica 0 (the CPU, or fewer GPUs than replicas) do not
need any of this: they run one after another on replica 0's weights, which is the same sum.

Buffers are broadcast only when weights come from the host (attach, ``copyWeightsToDevice``,
an inference model seeing newer trained weights): a buffer a forward pass mutates (BatchNorm's
running statistics) stays per replica, and the host sees replica 0's, as on IPUs.
"""
import copy
from typing import Callable, List

import torch

from .devices import DevicePlacement


class ReplicaModels:
    """Deep copies of ``model`` for replicas ``1..replicas-1``, each placed by
    ``device_of_module(replica, module_name)``."""

    def __init__(self, model: torch.nn.Module, replicas: int,
                 device_of_module: Callable[[int, str], torch.device]):
        self.master = model
        self.models: List[torch.nn.Module] = [model]
        self.placements: List[DevicePlacement] = []
        for r in range(1, replicas):
            with torch.inference_mode(False):
                replica = copy.deepcopy(model)
            placement = DevicePlacement(replica, lambda name, r=r: device_of_module(r, name))
            placement.place()
            self.models.append(replica)
            self.placements.append(placement)
        self._params = [list(m.parameters()) for m in self.models]
        self._buffers = [list(m.buffers()) for m in self.models]

    def model(self, replica: int) -> torch.nn.Module:
        return self.models[replica]

    def zero_grad(self) -> None:
        for params in self._params[1:]:
            for p in params:
                p.grad = None

    def reduce_gradients(self) -> None:
        """Sum every replica's gradients into replica 0's (on replica 0's devices)."""
        with torch.no_grad():
            for params in self._params[1:]:
                for master, replica in zip(self._params[0], params):
                    if replica.grad is None:
                        continue
                    grad = replica.grad.to(master.device, non_blocking=True)
                    if master.grad is None:
                        master.grad = grad if grad is not replica.grad else grad.clone()
                    else:
                        master.grad.add_(grad)
                    replica.grad = None

    def broadcast(self, buffers: bool = False) -> None:
        """Copy replica 0's parameters (and buffers) to every other replica."""
        with torch.inference_mode(False), torch.no_grad():
            for r in range(1, len(self.models)):
                for source, target in zip(self._params[0], self._params[r]):
                    target.copy_(source, non_blocking=True)
                if buffers:
                    for source, target in zip(self._buffers[0], self._buffers[r]):
                        target.copy_(source, non_blocking=True)

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
