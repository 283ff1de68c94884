"""Pipelined execution on real devices.

Numerics never depend on the schedule: a pipelined step is gradient accumulation over its
micro-batches, so openpop runs each micro-batch's forward and backward through the blocks in
order, with activations hopping devices at block boundaries.

* On one device (the CPU here) micro-batches run one after another: a 1F1B schedule
  serialised, so at most one micro-batch's activations are alive — memory is bounded by the
  stage count, never by the accumulation count.
* On several devices, ``ConcurrentMicroBatches`` keeps up to ``stages`` micro-batches in
  flight, one host thread each (as torchgpipe does): while micro-batch ``i`` runs its later
  blocks on device ``k+1``, micro-batch ``i+1`` runs its first blocks on device ``k``; CUDA
  kernels queue per device and autograd's per-device threads overlap the backward passes.
* ``Recomputation`` (PopTorch's default for pipelined training) re-runs forward passes during
  backward instead of keeping activations (``torch.utils.checkpoint``, RNG state preserved so
  dropout matches). The recomputed units are the innermost modules whose output the user
  marked with ``recomputationCheckpoint`` (their inputs — the previous checkpoints — are what
  is stashed), and every ``BeginBlock`` module that contains no such unit. Turn it off with
  ``opts._Popart.set("autoRecomputation", 0)`` (PopART's ``RecomputationType.NoRecompute``).
"""
import concurrent.futures
import contextlib
import functools
import os

import torch
import torch.utils.checkpoint

from ..annotations import block_annotation

CONCURRENCY_ENV = "OPENPOP_CONCURRENT_STAGES"  # "auto" (default), "on" or "off"


def recomputation_enabled(options) -> bool:
    setting = options._Popart.options.get("autoRecomputation")
    return setting is None or int(setting) != 0


@contextlib.contextmanager
def Recomputation(model: torch.nn.Module, units=()):
    """Checkpoint the recomputation ``units`` (module names) and the ``BeginBlock`` modules
    containing none of them, for the duration of the context."""
    units = set(units)
    chosen = []
    for name, module in model.named_modules():
        if name in units:
            chosen.append(module)
        elif block_annotation(module) is not None and not any(
                u == name or u.startswith(name + ".") or name.startswith(u + ".") for u in units):
            chosen.append(module)
    wrapped = []
    for module in chosen:
        if "forward" in module.__dict__:
            continue
        original = module.forward
        module.forward = functools.partial(_checkpointed, original)
        wrapped.append(module)
    try:
        yield
    finally:
        for module in wrapped:
            del module.forward


def _checkpointed(forward, *args, **kwargs):
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)


def concurrency_wanted(distinct_devices: int) -> bool:
    setting = os.environ.get(CONCURRENCY_ENV, "auto").lower()
    if setting == "on":
        return True
    if setting == "off":
        return False
    return distinct_devices > 1


class ConcurrentMicroBatches:
    """A persistent pool of ``in_flight`` worker threads: ``run(count, task)`` calls
    ``task(index)`` for every micro-batch, at most ``in_flight`` at once, starting them in
    order, and returns the results in order (re-raising the first failure after all stopped)."""

    def __init__(self, in_flight: int):
        self.in_flight = max(1, in_flight)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.in_flight,
                                                           thread_name_prefix="openpop-micro-batch")

    def run(self, count: int, task) -> list:
        futures = [self._pool.submit(task, index) for index in range(count)]
        concurrent.futures.wait(futures)
        return [future.result() for future in futures]

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
