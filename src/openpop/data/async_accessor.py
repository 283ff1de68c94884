"""``poptorch.AsynchronousDataAccessor``: load batches in a separate process, ahead of use.

A worker process iterates the wrapped loader (or any iterable) and fills a ring of
``buffer_size`` shared-memory slots, allocated once from the first batch's structure. For each
batch only the slot number travels through a queue; a batch that doesn't fit the slots (a
shorter last batch, non-tensor leaves) travels through the queue itself. At most
``buffer_size`` batches are loaded and not yet released at any time.

Slot lifetime: a batch returned by ``next()`` lives in shared memory that is handed back to the
worker, and overwritten, when the next batch is requested (or a new epoch starts, or the
accessor terminates). Clone tensors that must outlive that.

Epochs: each ``iter()`` starts one epoch of the wrapped loader and the iteration stops at its
end. ``iter()`` in the middle of an epoch abandons the rest of it. With ``load_indefinitely``
the worker goes on filling the next epoch while the current one is consumed.

``sharing_strategy`` picks how the worker process is started (the data itself always travels
through shared memory): ``Fork`` and ``SharedMemory`` fork the current process (the dataset is
shared copy-on-write, nothing is pickled), ``ForkServer`` forks from a server process with
torch and openpop imported (the dataset must be picklable and importable; the server starts
with the first such accessor of the process and serves all later ones), ``FileSystem`` spawns a
fresh interpreter (the dataset is pickled). Whatever the strategy, the torch workers of a
wrapped ``DataLoader`` are forked from the worker process, unless the loader names a
``multiprocessing_context`` (see ``async_worker.fork_torch_workers_here``).

The worker never outlives its parent's interest: it stops on ``terminate()``, on garbage
collection, at interpreter exit (``atexit``), when the parent dies, and after reporting an
error. The parent never waits on a dead worker: an exception in the worker is re-raised in the
parent (same type and message, with the worker's traceback as its cause), a vanished worker
raises ``poptorch.Error``.
"""
import atexit
import multiprocessing
import os
import pickle
import queue
import weakref
from multiprocessing.reduction import ForkingPickler
from typing import Optional

import torch

from ..enums import SharingStrategy
from ..errors import Error, with_fix
from ..log import logger
from ..runtime import trace
from . import batch_tree, messages
from .async_worker import NUDGE, POLL_SECONDS, Channels, WorkerSettings, worker_main

_STOP_GRACE_SECONDS = 2.0  # how long a worker may take to stop before it is killed

_START_METHODS = {
    SharingStrategy.Fork: "fork",
    SharingStrategy.SharedMemory: "fork",
    SharingStrategy.ForkServer: "forkserver",
    SharingStrategy.FileSystem: "spawn",
}


class AsynchronousDataAccessor:
    """Iterate ``dataset`` (usually a ``DataLoader``) in a separate process; see the module docs."""

    def __init__(self,
                 dataset,
                 buffer_size: int = 3,
                 miss_sleep_time_in_ms: float = 0.1,
                 load_indefinitely: bool = True,
                 early_preload: bool = False,
                 sharing_strategy: SharingStrategy = SharingStrategy.ForkServer,
                 rebatched_size: Optional[int] = None):
        """
        :param dataset: a ``DataLoader`` or any iterable of batches.
        :param buffer_size: number of batches loaded ahead (shared-memory slots).
        :param miss_sleep_time_in_ms: accepted for compatibility; waiting for a batch blocks
            without polling, so it has no effect.
        :param load_indefinitely: keep loading the next epoch while the current one is used;
            otherwise each epoch is loaded when ``iter()`` asks for it.
        :param early_preload: start loading now rather than at the first ``iter()``.
        :param sharing_strategy: how the worker process is started (see the module docs).
        :param rebatched_size: re-cut the loader's batches into batches of this many rows.
        """
        self._process = None  # first, so that terminate() works whatever fails below
        if getattr(dataset, "_accessor", None) is not None:
            raise Error(messages.ALREADY_ASYNC)
        if rebatched_size is not None and rebatched_size <= 1:
            raise AssertionError(messages.REBATCHED_SIZE_TOO_SMALL.format(size=rebatched_size))
        if buffer_size < 1:
            raise AssertionError(messages.BUFFER_SIZE_TOO_SMALL.format(size=buffer_size))
        self._source = dataset
        self._rebatched_size = rebatched_size
        self._drop_last = bool(getattr(dataset, "_rebatch_drop_last", getattr(dataset, "drop_last", False)))
        self._miss_sleep_time_in_ms = miss_sleep_time_in_ms
        if self._known_length() == 0:
            reason = getattr(dataset, "no_batch_reason", lambda: None)()  # a poptorch.DataLoader's sizes
            raise Error(messages.DATASET_EMPTY if reason is None else
                        with_fix(messages.DATASET_EMPTY, "{}: {}".format(*reason)))

        context = _context(sharing_strategy)
        self._channels = Channels(data=context.Queue(), free=context.Queue(), stop=context.Event(),
                                  target_epoch=context.Value("q", 0))
        settings = WorkerSettings(buffer_size=buffer_size, rebatched_size=rebatched_size,
                                  drop_last=self._drop_last, load_indefinitely=load_indefinitely,
                                  early_preload=early_preload)
        self._owner_pid = os.getpid()
        self._slots = None
        self._epoch = 0  # the epoch being consumed; epochs are numbered from 1
        self._epoch_started = False  # at least one batch of it was returned
        self._epoch_finished = False  # its StopIteration was raised
        self._held_slot = None
        self._unusable_reason = None

        process = context.Process(target=worker_main, name="AsynchronousDataAccessor", daemon=False,
                                  args=(dataset, settings, self._channels, torch.get_rng_state()))
        try:
            process.start()
        except Exception as error:
            logger.error("Could not start the AsynchronousDataAccessor worker: %s: %s", type(error).__name__,
                         error, exc_info=True)
            self._close_channels()
            raise Error(messages.WORKER_FAILED_TO_START) from error
        self._process = process
        _register(self)
        _close_writing_end(self._channels.data)
        self._wait_until_ready()

    # --- iteration ---------------------------------------------------------------------
    def __iter__(self):
        if self._epoch == 0 or self._epoch_finished or self._epoch_started:
            self._check_usable()
            self._begin_epoch()
        return self

    def __next__(self):
        with trace.window_span("dataloader_wait"):
            return self._next()

    def _next(self):
        self._check_usable()
        if self._epoch == 0 or self._epoch_finished:
            self._begin_epoch()
        self._release_held_slot()
        while True:
            message = self._receive()
            kind = message[0]
            if kind == "slots":
                self._slots = message[1]
            elif kind == "error":
                self._raise_worker_error(*message[1:])
            elif kind == "empty":
                self._stop_with(messages.DATASET_EMPTY)
            elif kind == "end":
                if message[1] == self._epoch:
                    self._epoch_finished = True
                    raise StopIteration
            else:
                kind, epoch, slot = message[:3]
                if epoch != self._epoch:  # left over from an abandoned epoch
                    self._channels.free.put(slot)
                    continue
                self._held_slot = slot
                self._epoch_started = True
                if kind == "slot":
                    return batch_tree.rebuild(self._slots[slot])
                return message[3]

    def __len__(self) -> int:
        if self._rebatched_size is None:
            return len(self._source)
        elements = len(getattr(self._source, "dataset", self._source))
        full, rest = divmod(elements, self._rebatched_size)
        return full + (1 if rest and not self._drop_last else 0)

    # --- shutting down -----------------------------------------------------------------
    def terminate(self) -> None:
        """Stop the worker process; the accessor can't be used afterwards."""
        if self.__dict__.get("_process") is None or os.getpid() != self._owner_pid:
            return
        self._request_stop()
        process, self._process = self._process, None
        _live_accessors.discard(self)
        process.join(_STOP_GRACE_SECONDS)
        if process.is_alive():
            process.terminate()
            process.join(_STOP_GRACE_SECONDS)
        if process.is_alive():
            process.kill()
            process.join()
        process.close()
        self._close_channels()
        self._slots = None
        if self._unusable_reason is None:
            self._unusable_reason = messages.TERMINATED

    def __del__(self):
        try:
            self.terminate()
        except Exception:  # interpreter shutdown may have torn down what terminate() needs
            pass

    def _request_stop(self) -> None:
        if self.__dict__.get("_process") is None or os.getpid() != self._owner_pid:
            return
        self._channels.stop.set()
        try:
            self._channels.free.put(NUDGE)
        except (ValueError, OSError):
            pass

    def _close_channels(self) -> None:
        for channel in (self._channels.free, self._channels.data):
            channel.cancel_join_thread()
            channel.close()

    # --- talking to the worker ---------------------------------------------------------
    def _begin_epoch(self) -> None:
        self._release_held_slot()
        self._epoch += 1
        self._epoch_started = False
        self._epoch_finished = False
        self._channels.target_epoch.value = self._epoch
        self._channels.free.put(NUDGE)

    def _release_held_slot(self) -> None:
        if self._held_slot is not None:
            self._channels.free.put(self._held_slot)
            self._held_slot = None

    def _wait_until_ready(self) -> None:
        try:
            message = self._receive()
        except Error:
            self._unusable_reason = messages.WORKER_FAILED_TO_START
            raise Error(messages.WORKER_FAILED_TO_START) from None
        if message != ("ready",):
            raise AssertionError(messages.WORKER_FIRST_MESSAGE.format(message=message[0]))

    def _receive(self):
        """The worker's next message; raises ``Error`` if the worker dies first."""
        while True:
            try:
                return ForkingPickler.loads(self._channels.data.get(timeout=POLL_SECONDS))
            except queue.Empty:
                pass
            except Exception as error:
                if isinstance(error, EOFError):  # no writer left: the worker is gone or going
                    self._process.join(_STOP_GRACE_SECONDS)
                if not self._process.is_alive():
                    self._stop_with(messages.WORKER_DIED.format(code=self._process.exitcode))
                # A message that can't be rebuilt would lose its slot and starve the worker.
                self._stop_with(f"Could not receive a batch from the AsynchronousDataAccessor worker: "
                                f"{type(error).__name__}: {error}")
            if not self._process.is_alive():
                try:
                    return ForkingPickler.loads(self._channels.data.get(timeout=POLL_SECONDS))
                except Exception:
                    self._stop_with(messages.WORKER_DIED.format(code=self._process.exitcode))

    def _raise_worker_error(self, pickled_error: Optional[bytes], worker_traceback: str, summary: str):
        self._stop_with_reason(messages.WORKER_FAILED.format(error=summary))
        error = None
        if pickled_error is not None:
            try:
                error = pickle.loads(pickled_error)
            except Exception:
                error = None
        if not isinstance(error, BaseException):
            error = Error(messages.WORKER_RAISED.format(summary=summary))
        raise error from WorkerTraceback(worker_traceback)

    def _stop_with(self, reason: str):
        self._stop_with_reason(reason)
        raise Error(reason)

    def _stop_with_reason(self, reason: str) -> None:
        self._unusable_reason = reason
        self.terminate()

    def _check_usable(self) -> None:
        if self._unusable_reason is not None:
            raise Error(self._unusable_reason)

    def _known_length(self) -> Optional[int]:
        try:
            return len(self)
        except (TypeError, NotImplementedError):
            return None


class WorkerTraceback(Exception):
    """The traceback of an exception raised in the worker process (shown as the cause)."""

    def __str__(self) -> str:
        return "\n\nIn the AsynchronousDataAccessor worker process:\n" + self.args[0]


# --- processes and clean-up -----------------------------------------------------------------
def _close_writing_end(channel) -> None:
    """Drop this process's copy of the queue's writing end, so that once the worker is gone a
    read hits end-of-file instead of waiting forever for the rest of a half-written message."""
    writer = getattr(channel, "_writer", None)
    if writer is not None:
        writer.close()


def _sharing_strategy(value) -> SharingStrategy:
    """``value`` as a ``SharingStrategy``: a member, its number, or its name - configs written in
    YAML pass ``sharing_strategy: "SharedMemory"`` (Graphcore's conformer); PopTorch compared the
    value with the members and treated what matched none as SharedMemory."""
    if isinstance(value, str) and value in SharingStrategy.__members__:
        return SharingStrategy[value]
    try:
        return SharingStrategy(value)
    except ValueError:
        raise ValueError(messages.SHARING_STRATEGY_UNKNOWN.format(
            value=value, names=", ".join(SharingStrategy.__members__))) from None


def _context(sharing_strategy: SharingStrategy):
    method = _START_METHODS[_sharing_strategy(sharing_strategy)]
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        _preload_in_forkserver(context)
    return context


_FORKSERVER_PRELOAD = ("torch", "openpop", "poptorch")


def _preload_in_forkserver(context) -> None:
    """Import torch and openpop once, in the fork server, rather than in every worker it forks.

    Only has an effect before the fork server starts (at the first ``ForkServer`` accessor of the
    process). A forked worker still re-runs the top level of the main script (Python 3.11's fork
    server never preloads ``__main__``), but finds these modules imported.
    """
    from multiprocessing import forkserver
    preload = list(getattr(forkserver._forkserver, "_preload_modules", ["__main__"]))
    missing = [name for name in _FORKSERVER_PRELOAD if name not in preload]
    if missing:
        context.set_forkserver_preload(preload + missing)


_live_accessors = weakref.WeakSet()
_exit_hook_registered = False


def _register(accessor: AsynchronousDataAccessor) -> None:
    # Registered after multiprocessing's own exit hook, so it runs before that one joins children.
    global _exit_hook_registered
    if not _exit_hook_registered:
        atexit.register(_terminate_all)
        _exit_hook_registered = True
    _live_accessors.add(accessor)


def _terminate_all() -> None:
    accessors = list(_live_accessors)
    for accessor in accessors:  # ask all first, so they stop in parallel
        accessor._request_stop()
    for accessor in accessors:
        accessor.terminate()
