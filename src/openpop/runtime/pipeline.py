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
  A recomputation computes activations, nothing else: a unit's buffers (BatchNorm's running
  statistics, a memory the forward writes) are swapped for copies of their values when the
  forward started, so it reads what the forward read and its writes land in the copies - the
  statistics are updated once per micro-batch, as without recomputation.
* Concurrent micro-batches share each device's random generator, and a recomputed unit must
  draw exactly the numbers its forward drew. ``DeviceLocks`` therefore gives every device a
  lock that a micro-batch thread holds while it runs forward code on that device (taken and
  released at block boundaries, one lock per thread at a time, so no deadlock); a unit
  remembers its device's generator state under that lock and its recomputation replays it
  under the same lock. Work on one device is thus issued by one thread at a time — as in a
  real pipeline — while different devices run concurrently. Each device also admits
  micro-batches in order (turns), so the generator is drawn in the serial order and a
  concurrent run gives the masks a serial run gives. A unit replays only its own device's
  generator: CPU randomness drawn inside a unit placed on a GPU is not replayed.
* Concurrent micro-batches add their gradients to ``.grad`` in micro-batch order, not in the
  order they finish (``GradientReduction.backward_in_order``): the step's weights are the serial
  run's, bit for bit.
"""
import concurrent.futures
import contextlib
import functools
import threading

import torch
import torch.utils.checkpoint

from .. import openpop_settings
from ..annotations import block_annotation
from ..torch_compat import get_current_function_mode_stack
from . import context
from .buffer_state import buffer_slots
from .devices import SameDeviceOps
from .half_compute import LowPrecisionOps

CONCURRENCY_ENV = openpop_settings.env("concurrent_stages")  # "auto" (default), "on" or "off"


@contextlib.contextmanager
def Recomputation(model: torch.nn.Module, units=(), locks=None, gpu=False):
    """Checkpoint the recomputation ``units`` (module names) and the ``BeginBlock`` modules
    containing none of them, for the duration of the context. With ``locks`` (concurrent
    micro-batches) each unit's forward and recomputation hold its device's lock. With ``gpu``
    (autograd then recomputes on its own threads) the forward's thread state is carried over."""
    units = set(units)
    chosen = []
    for name, module in model.named_modules():
        if name in units:
            chosen.append((name, module))
        elif block_annotation(module) is not None and not any(
                u == name or u.startswith(name + ".") or name.startswith(u + ".") for u in units):
            chosen.append((name, module))
    wrapped = []
    for _, module in chosen:
        if "forward" in module.__dict__:
            continue
        original = module.forward
        slots = tuple(buffer_slots(module))  # listed once, not per micro-batch
        if locks is None:
            module.forward = functools.partial(_checkpointed_on_other_threads if gpu else _checkpointed, original,
                                               openpop_buffer_slots=slots)
        else:
            module.forward = functools.partial(_checkpointed_under_lock, original, locks, openpop_buffer_slots=slots)
        wrapped.append(module)
    try:
        yield
    finally:
        for module in wrapped:
            del module.forward


def _checkpointed(forward, *args, openpop_buffer_slots=(), **kwargs):
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    forward = _buffers_as_in_forward(forward, openpop_buffer_slots)
    if any(isinstance(mode, LowPrecisionOps) for mode in _function_modes()):
        # Backward recomputes after the forward's precision mode has exited.
        forward = _recomputed_inside(forward, _forward_state())
    return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)


def _checkpointed_on_other_threads(forward, *args, openpop_buffer_slots=(), **kwargs):
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    run = _recomputed_inside(_buffers_as_in_forward(forward, openpop_buffer_slots), _forward_state())
    return torch.utils.checkpoint.checkpoint(run, *args, use_reentrant=False, **kwargs)


def _buffers_as_in_forward(forward, slots):
    """``forward`` (of a recomputation unit whose buffers live in ``slots``) for
    ``torch.utils.checkpoint``: its first call is the forward pass and remembers the values of the
    unit's buffers; a later one (the recomputation, in backward) runs with copies of those values
    in the slots, so it reads what the forward read and its writes (running statistics, a memory)
    change nothing."""
    if not slots:
        return forward
    at_forward = []

    def run(*args, **kwargs):
        if not at_forward:
            at_forward.append([table[name].detach().clone() for table, name in slots])
            return forward(*args, **kwargs)
        held = [table.get(name) for table, name in slots]
        for (table, name), value in zip(slots, at_forward[0]):
            table[name] = value
        try:
            return forward(*args, **kwargs)
        finally:
            for (table, name), tensor in zip(slots, held):
                table[name] = tensor

    return run


def _recomputed_inside(forward, recomputation_context):
    """``forward`` for ``torch.utils.checkpoint``: its first call is the forward pass itself,
    later ones (recomputations, in backward) run inside ``recomputation_context()``."""
    calls = []

    def run(*args, **kwargs):
        if not calls:
            calls.append(True)
            return forward(*args, **kwargs)
        with recomputation_context():
            return forward(*args, **kwargs)

    return run


def _forward_state():
    """What a recomputation needs of the forward's thread-local state: the run context
    (``isRunningOnIpu()``, ``for_loop``), cross-device op alignment and the precision rules for
    half tensors. On GPUs autograd recomputes on its own per-device threads, where none is
    active; on the CPU the precision mode has exited by the time backward recomputes."""
    ctx = context.current()
    modes = [mode for mode in _function_modes() if isinstance(mode, (SameDeviceOps, LowPrecisionOps))]

    @contextlib.contextmanager
    def as_in_forward():
        with contextlib.ExitStack() as stack:
            if ctx is not None and context.current() is not ctx:
                stack.enter_context(context.resumed(ctx))
            for mode in modes:
                if not any(type(active) is type(mode) for active in _function_modes()):
                    stack.enter_context(mode)
            yield

    return as_in_forward


def _function_modes():
    return get_current_function_mode_stack()


def _checkpointed_under_lock(forward, locks, *args, openpop_buffer_slots=(), **kwargs):
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    forward = _buffers_as_in_forward(forward, openpop_buffer_slots)
    # The unit runs on the device whose lock this thread holds: its own block boundary took it,
    # or its parent's (same device). Asked per call: one module object may serve several
    # replicas (replicas.py shares parameterless modules).
    device = locks.held() or torch.device("cpu")
    as_in_forward = _forward_state()
    with locks.on(device):
        state = _rng_state(device)

        @contextlib.contextmanager
        def replaying():  # the recomputation draws the numbers the forward drew
            with locks.on(device), as_in_forward():
                current = _rng_state(device)
                _set_rng_state(device, state)
                try:
                    yield
                finally:
                    _set_rng_state(device, current)

        return torch.utils.checkpoint.checkpoint(_recomputed_inside(forward, replaying), *args,
                                                 use_reentrant=False, preserve_rng_state=False, **kwargs)


# The wrappers Recomputation sets as a module's forward, its original forward their first argument
# (compiled/regions.py puts a compiled forward in its place).
RECOMPUTED = (_checkpointed, _checkpointed_on_other_threads, _checkpointed_under_lock)


def _rng_state(device: torch.device) -> torch.Tensor:
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_rng_state(device: torch.device, state: torch.Tensor) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


class DeviceLocks:
    """One lock per device, and a turn order per device.

    ``enter(device)`` makes the calling thread hold that device's lock (releasing the one it
    held before); ``exit()`` returns to the previous device's lock. A thread holds at most one
    lock at a time, so threads never wait on each other in a cycle.

    Turns make concurrent runs repeat serial ones: within a step (``start_step``), a
    micro-batch thread (``begin_micro_batch(i)``) first enters a device only after every
    earlier micro-batch using that device has left it for the last time — so each device's
    random generator is drawn in micro-batch order, exactly as one after another, while
    different devices still work on different micro-batches. Later re-entries (the root ``forward``'s code after the
    blocks) and threads outside a micro-batch (autograd's, during recomputation) take the lock
    only."""

    def __init__(self):
        self._locks = {}
        self._guard = threading.Lock()
        self._local = threading.local()
        self._turns = threading.Condition()
        self._generation = 0
        self._visits = []     # per micro-batch of the step: {device: planned visits}
        self._positions = []  # per micro-batch of the step: {device: its place in that device's queue}
        self._released = {}   # device -> places that have left it
        self._next = {}       # device -> the place allowed in next

    def _lock(self, device) -> threading.Lock:
        with self._guard:
            lock = self._locks.get(device)
            if lock is None:
                lock = self._locks[device] = threading.Lock()
            return lock

    def _stack(self) -> list:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    # ------------------------------------------------------------------ turns
    def start_step(self, visits_of_micro_batch) -> None:
        """For each micro-batch of the coming step, in order: ``{device: visits}``, how many
        separate times its forward runs on each device (from the plan: a device holding
        stages 0 and 2 is visited twice). A micro-batch gives up its turn on a device after
        its last visit, so the next one never runs there in between."""
        positions, counts = [], {}
        for visits in visits_of_micro_batch:
            places = {}
            for device in visits:
                places[device] = counts.get(device, 0)
                counts[device] = places[device] + 1
            positions.append(places)
        with self._turns:
            self._generation += 1
            self._visits = list(visits_of_micro_batch)
            self._positions = positions
            self._released = {device: set() for device in counts}
            self._next = dict.fromkeys(counts, 0)

    def begin_micro_batch(self, index: int) -> None:
        local = self._local
        local.index = index
        local.generation = self._generation
        local.entered = set()
        local.left = {}      # device -> visits ended so far
        local.released = set()

    def end_micro_batch(self) -> None:
        """Give up this micro-batch's turn on every device (used or not)."""
        if not self._in_current_step():
            return
        for device in self._positions[self._local.index]:
            self._release_turn(device)
        self._local.index = None

    def _in_current_step(self) -> bool:
        """Whether the calling thread runs a micro-batch of the current step (a straggler from
        an interrupted call must not touch the turns of the next one)."""
        local = self._local
        return getattr(local, "index", None) is not None and local.generation == self._generation

    def _wait_turn(self, device) -> None:
        if not self._in_current_step() or device in self._local.entered:
            return
        self._local.entered.add(device)
        place = self._positions[self._local.index].get(device)
        if place is not None:
            with self._turns:
                self._turns.wait_for(lambda: self._next[device] == place)

    def _leave_turn(self, device) -> None:
        """The calling micro-batch stops running on ``device``; after its last planned visit
        the next micro-batch may start there."""
        if not self._in_current_step():
            return
        local = self._local
        local.left[device] = local.left.get(device, 0) + 1
        if local.left[device] >= self._visits[local.index].get(device, 1):
            self._release_turn(device)

    def _release_turn(self, device) -> None:
        local = self._local
        if device in local.released:
            return
        local.released.add(device)
        place = self._positions[local.index].get(device)
        if place is None:
            return
        with self._turns:
            released = self._released[device]
            released.add(place)
            while self._next[device] in released:
                self._next[device] += 1
            self._turns.notify_all()

    # ------------------------------------------------------------------ locks
    def enter(self, device: torch.device) -> None:
        stack = self._stack()
        held = stack[-1] if stack else None
        if held != device:
            if held is not None:
                self._lock(held).release()
                self._leave_turn(held)
            self._wait_turn(device)
            self._lock(device).acquire()
        stack.append(device)

    def exit(self) -> None:
        stack = self._stack()
        device = stack.pop()
        previous = stack[-1] if stack else None
        if previous != device:
            self._lock(device).release()
            self._leave_turn(device)
            if previous is not None:
                self._wait_turn(previous)
                self._lock(previous).acquire()

    def release_all(self) -> None:
        """Drop whatever the calling thread still holds, lock and turns (a forward abandoned
        mid-way)."""
        stack = self._stack()
        if stack:
            self._lock(stack[-1]).release()
            stack.clear()
        self.end_micro_batch()

    def held(self):
        """The device whose lock the calling thread holds, or None."""
        stack = self._stack()
        return stack[-1] if stack else None

    @contextlib.contextmanager
    def on(self, device: torch.device):
        self.enter(device)
        try:
            yield
        finally:
            self.exit()


def concurrency_wanted(distinct_devices: int) -> bool:
    setting = openpop_settings.read("concurrent_stages")
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
        try:
            concurrent.futures.wait(futures)
        except BaseException:  # KeyboardInterrupt: let the running ones finish before unwinding
            for future in futures:
                future.cancel()
            concurrent.futures.wait(futures)
            raise
        return [future.result() for future in futures]

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
