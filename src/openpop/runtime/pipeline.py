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
* ``Recomputation`` (PopTorch's default for pipelined training) re-runs each
  ``BeginBlock`` module's forward during backward instead of keeping its activations
  (``torch.utils.checkpoint``, RNG state preserved so dropout matches). Turn it off with
  ``opts._Popart.set("autoRecomputation", 0)`` (PopART's ``RecomputationType.NoRecompute``).
"""
import contextlib
import functools
import os
import threading

import torch
import torch.utils.checkpoint

from ..annotations import block_annotation

CONCURRENCY_ENV = "OPENPOP_CONCURRENT_STAGES"  # "auto" (default), "on" or "off"


def recomputation_enabled(options) -> bool:
    setting = options._Popart.options.get("autoRecomputation")
    return setting is None or int(setting) != 0


@contextlib.contextmanager
def Recomputation(model: torch.nn.Module):
    """Checkpoint every ``BeginBlock`` module of ``model`` for the duration of the context."""
    wrapped = []
    for module in model.modules():
        if block_annotation(module) is None or "forward" in module.__dict__:
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
    """Runs ``task(index)`` for each micro-batch on worker threads, at most ``in_flight`` at a
    time, in order of submission; re-raises the first failure after all workers stop."""

    def __init__(self, in_flight: int):
        self.in_flight = max(1, in_flight)

    def run(self, count: int, task) -> list:
        results = [None] * count
        failures = []
        slots = threading.Semaphore(self.in_flight)
        threads = []

        def worker(index):
            try:
                if not failures:
                    results[index] = task(index)
            except BaseException as exc:  # surfaced in the caller's thread below
                failures.append(exc)
            finally:
                slots.release()

        for index in range(count):
            slots.acquire()
            thread = threading.Thread(target=worker, args=(index,), daemon=True)
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join()
        if failures:
            raise failures[0]
        return results
