"""The worker process of ``AsynchronousDataAccessor``: loads epochs into shared-memory slots.

Messages to the parent (each pickled here, so that a batch that can't be sent raises in the
loading loop instead of vanishing in the queue's thread):
``("ready",)``, ``("slots", trees)`` once, ``("slot", epoch, slot)``, ``("inline", epoch, slot, batch)``,
``("end", epoch)``, ``("empty",)``, ``("error", pickled_error, traceback, summary)``.

A slot number is a credit: the worker holds at most ``buffer_size`` of them, spends one per batch
sent and gets it back through ``free`` when the parent moves on. The parent writes the epoch it
wants into ``target_epoch``; the worker abandons any older epoch between two batches.
"""
import contextlib
import multiprocessing
import pickle
import queue
import signal
import sys
import traceback
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any, Optional

import torch

from . import batch_tree
from .rebatch import rebatch

POLL_SECONDS = 0.1  # how often a waiting process checks that its peer is still there
NUDGE = -1  # wakes a waiting worker; not a slot number


def _reduce_generator(generator: torch.Generator):
    """A ``torch.Generator`` (a loader's ``generator=``, a shuffled distributed shard's) crosses
    to the worker as its device and state bytes: torch's own reduction shares a temporary state
    tensor whose memory is gone by the time the worker maps it ("unable to resize file")."""
    return _rebuild_generator, (str(generator.device), generator.get_state().numpy().tobytes())


def _rebuild_generator(device: str, state: bytes) -> torch.Generator:
    generator = torch.Generator(device)
    generator.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))
    return generator


ForkingPickler.register(torch.Generator, _reduce_generator)


@dataclass
class Channels:
    data: Any  # worker -> parent: pickled messages (see the module docs)
    free: Any  # parent -> worker: slot numbers handed back, and NUDGE
    stop: Any  # Event
    target_epoch: Any  # Value: the epoch the parent wants; older ones are abandoned


@dataclass
class WorkerSettings:
    buffer_size: int
    rebatched_size: Optional[int]
    drop_last: bool
    load_indefinitely: bool
    early_preload: bool


class _Stop(Exception):
    """The parent asked the worker to stop, or went away."""


class SlotLoader:
    """Loads the epochs the parent asks for, one batch per free slot."""

    def __init__(self, source, settings: WorkerSettings, channels: Channels):
        self._source = source
        self._settings = settings
        self._channels = channels
        self._parent = multiprocessing.parent_process()
        self._spare_slots = list(range(settings.buffer_size))
        self._slots = None

    def send(self, *message) -> None:
        self._channels.data.put(bytes(ForkingPickler.dumps(message)))

    def run(self) -> None:
        epoch = 0
        while True:
            epoch = self._wait_for_epoch(epoch + 1)
            self._load_epoch(epoch)

    def wait_for_stop(self) -> None:
        while True:
            self._poll()

    def _wait_for_epoch(self, next_epoch: int) -> int:
        """The epoch to load next: ``next_epoch`` or a later one the parent skipped to."""
        while True:
            target = self._channels.target_epoch.value
            if target >= next_epoch:
                return target
            if self._settings.early_preload if next_epoch == 1 else self._settings.load_indefinitely:
                return next_epoch
            self._poll()

    def _load_epoch(self, epoch: int) -> None:
        batches = self._epoch_batches()
        loaded = 0
        try:
            while True:
                slot = self._acquire_slot(epoch)
                if slot is None:
                    return  # abandoned by the parent
                try:
                    batch = next(batches)
                except StopIteration:
                    self._spare_slots.append(slot)
                    break
                self._send_batch(epoch, slot, batch)
                loaded += 1
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()
            del batches
        if loaded == 0:
            self.send("empty")
            self.wait_for_stop()  # never returns
        self.send("end", epoch)

    def _epoch_batches(self):
        start_epoch = getattr(self._source, "_iter_sync", None)  # poptorch DataLoader in an Async mode
        batches = start_epoch() if start_epoch is not None else iter(self._source)
        if self._settings.rebatched_size is not None:
            batches = rebatch(batches, self._settings.rebatched_size, self._settings.drop_last)
        return batches

    def _acquire_slot(self, epoch: int) -> Optional[int]:
        """A free slot, or None when the parent has moved past ``epoch``."""
        while True:
            self._check_parent()
            if self._channels.target_epoch.value > epoch:
                return None
            if self._spare_slots:
                return self._spare_slots.pop()
            self._poll()

    def _send_batch(self, epoch: int, slot: int, batch) -> None:
        if self._slots is None and batch_tree.is_tensor_only(batch):
            self._slots = [batch_tree.empty_shared_like(batch) for _ in range(self._settings.buffer_size)]
            self.send("slots", self._slots)
        if self._slots is not None and batch_tree.same_layout(self._slots[slot], batch):
            batch_tree.copy_into(self._slots[slot], batch)
            self.send("slot", epoch, slot)
        else:
            self.send("inline", epoch, slot, batch)

    def _poll(self) -> None:
        """Wait briefly for a slot to come back; raise _Stop if the parent is done with us."""
        self._check_parent()
        try:
            slot = self._channels.free.get(timeout=POLL_SECONDS)
        except queue.Empty:
            return
        if slot != NUDGE:
            self._spare_slots.append(slot)

    def _check_parent(self) -> None:
        if self._channels.stop.is_set() or not self._parent.is_alive():
            raise _Stop


def fork_torch_workers_here(source) -> None:
    """Make a torch ``DataLoader`` that names no ``multiprocessing_context`` fork its workers from
    this process.

    A child process inherits the start method that created it, so without this a worker started
    by ``forkserver`` would start a fork server of its own for the torch workers (a fresh
    interpreter importing ``__main__`` and torch: seconds, for every accessor), and one started by
    ``spawn`` would spawn each torch worker. This process is a clean single-purpose one that has
    torch imported and the dataset in memory: forking it gives ready workers at once (its only
    other thread feeds the parent's queue, which the workers never use). A context the user chose
    is kept.
    """
    if (isinstance(source, torch.utils.data.DataLoader) and source.num_workers > 0
            and source.multiprocessing_context is None and sys.platform.startswith("linux")):
        source.multiprocessing_context = "fork"


def worker_main(source, settings: WorkerSettings, channels: Channels, rng_state: torch.Tensor) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    torch.set_num_threads(1)
    fork_torch_workers_here(source)
    torch.set_rng_state(rng_state)  # shuffling starts where the parent's generator was
    loader = SlotLoader(source, settings, channels)
    loader.send("ready")
    try:
        loader.run()
    except _Stop:
        pass
    except Exception as error:
        loader.send("error", _pickle_or_none(error), traceback.format_exc(), f"{type(error).__name__}: {error}")
        # Inline batches already sent are served from this process: stay until the parent is done.
        with contextlib.suppress(_Stop):
            loader.wait_for_stop()
    channels.data.cancel_join_thread()  # the parent no longer reads: don't wait to flush


def _pickle_or_none(error: BaseException) -> Optional[bytes]:
    try:
        pickled = pickle.dumps(error)
        pickle.loads(pickled)
        return pickled
    except Exception:
        return None
