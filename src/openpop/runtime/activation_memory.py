"""Peak activation memory per virtual IPU, measured while a host call is traced.

``torch.autograd.graph.saved_tensors_hooks`` see every tensor autograd keeps for the backward
(with recomputation: the checkpointed blocks' stashed inputs). A tensor counts from the moment
it is saved until autograd releases it (its backward has run), towards the virtual IPU of the
stage that saved it first (``StageSpans.current_ipu``); the same memory saved twice (a layer's
output that the next layer saves as its input) counts once; parameters and buffers do not count
(they are in the weights columns). The peak is the largest total alive at once per IPU, so
micro-batches in flight together (concurrent stages) add up, as they would on the devices.
Transient tensors of a backward (recomputed activations, gradients) are not counted.
"""
import threading

import torch


class ActivationMemory:
    def __init__(self, model, ipus: int, current_ipu):
        self.current_ipu = current_ipu
        self.excluded = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
        self.alive = [0] * max(ipus, 1)
        self.peak = [0] * max(ipus, 1)
        self.measured = True  # False once the hooks could not be entered
        self._saved = {}   # (data_ptr, bytes) -> [ipu, references]
        self._lock = threading.Lock()

    def hooks(self):
        """The saved-tensor hooks; enter them in every thread that runs forwards or backwards."""
        return torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def _pack(self, tensor):
        try:
            if tensor.untyped_storage().data_ptr() in self.excluded:
                return tensor
            key = (tensor.data_ptr(), tensor.numel() * tensor.element_size())
        except (RuntimeError, NotImplementedError):  # tensors without plain storage
            return tensor
        if key[1] == 0:
            return tensor
        with self._lock:
            entry = self._saved.get(key)
            if entry is None:
                ipu = min(self.current_ipu(), len(self.alive) - 1)
                entry = self._saved[key] = [ipu, 0]
                self.alive[ipu] += key[1]
                self.peak[ipu] = max(self.peak[ipu], self.alive[ipu])
            entry[1] += 1
        return _Saved(self, key, tensor)

    def _release(self, key):
        with self._lock:
            entry = self._saved[key]
            entry[1] -= 1
            if entry[1] == 0:
                del self._saved[key]
                self.alive[entry[0]] -= key[1]


class _Saved:
    """What autograd keeps instead of the tensor: released (uncounted) when autograd drops it."""
    __slots__ = ("key", "owner", "tensor")

    def __init__(self, owner, key, tensor):
        self.owner, self.key, self.tensor = owner, key, tensor

    def __del__(self):
        self.owner._release(self.key)


class CudaPeaks:
    """The CUDA allocator's peak bytes per device over a host call (``torch.cuda.memory_stats``),
    by virtual IPU; nothing for virtual IPUs on other devices."""

    def __init__(self, plan):
        device_map = getattr(plan, "device_map", None)
        ipus = plan.ipus_per_replica if device_map is not None else 0
        self.devices = {ipu: device_map.device(ipu) for ipu in range(ipus)
                        if device_map.device(ipu).type == "cuda"}
        self.peaks = {}

    def __enter__(self):
        for device in set(self.devices.values()):
            torch.cuda.reset_peak_memory_stats(device)
        return self

    def __exit__(self, *exc):
        self.peaks = {ipu: torch.cuda.max_memory_allocated(device) for ipu, device in self.devices.items()}

    def per_ipu(self) -> dict:
        return self.peaks


def _unpack(saved):
    return saved.tensor if isinstance(saved, _Saved) else saved
