"""A training host call is all or nothing.

One host call runs ``device_iterations`` optimizer steps. If it raises part-way - an error in
the model's forward, openpop's floating-point-exception ``poptorch.Error``, Ctrl-C - it is rolled
back: parameters, buffers, optimizer state (Adam's moments and step counts, the attributes an LR
scheduler sees), the automatic loss scale and its counters, torch's random generators (CPU and
the CUDA devices in use) and openpop's stochastic-rounding generators are as they were before the
call, and no ``.grad`` is left behind. A script that catches the error and calls again repeats
nothing: its run is the run it would have been without the failure.

What it costs, and when:

* At the start of every call: the random generators' states, the optimizer's and the loss
  scaler's plain attributes and ``param_groups`` settings, and a copy of every buffer (into
  tensors kept from call to call; buffers are small next to the parameters, and PyTorch does not
  bump the version counter of BatchNorm's running statistics, so the ones a forward mutates
  cannot be picked out cheaply). A few microseconds on top of a call's ~100.
* Parameters and optimizer state are copied only when a call still has steps to run after an
  update: lazily, right before its first update that is not its last (``device_iterations > 1``),
  into tensors kept from call to call (no allocation per call). A call's last update is its commit
  point - before it none of them has changed, after it the call is done - so
  ``device_iterations(1)`` never copies weights, and a training model with more device iterations
  holds one extra copy of its parameters and optimizer state.
  ``Options.Training.rollbackFailedCalls(False)`` gives that memory back: a failed call then keeps
  the updates of the steps it completed and its error carries a note saying how many.

Ctrl-C never leaves an update half-applied. With saved weights any interrupt, also one during an
update, rolls the call back. The last update of a call that saved nothing (``device_iterations(1)``)
holds SIGINT until it is complete and the call has finished; the ``KeyboardInterrupt`` is then
raised and says that the call completed and its update stands. Without rollback, every update
holds SIGINT until it is complete. (Holding needs the main thread and a Python-level SIGINT
handler, the default; it costs two ``sigaction`` calls per held update.) A rollback also holds
SIGINT until it is done.

Limits, logged when they happen: an exception raised by the optimizer's own ``step()`` during the
last update of a call that saved nothing leaves what that ``step()`` already wrote; a call that
fails after its last update (assembling its outputs) keeps its updates. Not undone: what hooks on
the optimizer did outside it during the call (under Lightning, ``global_step`` and the step-interval
LR schedulers' own counters advanced by ``lightning/optimizer_steps.py``; Lightning ends the fit on
an exception anyway).
"""

import copy
import signal
import threading

import torch

from ..log import logger
from ..torch_compat import foreach_copy_
from . import messages
from .buffer_state import buffer_slots, has_history
from .precision import generator_states, restore_generator_states
from .weights import SharedBuffers

try:  # the C functions: signal.py's wrappers convert to and from enums, which costs more
    from _signal import getsignal as _get_handler
    from _signal import signal as _set_handler
except ImportError:  # pragma: no cover - another Python implementation
    from signal import getsignal as _get_handler
    from signal import signal as _set_handler


class HostCallRollback:
    """A training executor's rollback machinery, bound once to what does not change between its
    calls, with the copies it reuses from call to call. ``call(optimizer)`` gives the context of
    one host call.

    ``models``: replica 0 first (replicas with their own weights after it); ``parameters``: the
    model's (a failed call leaves their ``.grad`` unset); ``replica_buffers``: a
    ``weights.ReplicaBuffers`` (or ``SharedBuffers``);
    ``loss_scaler``: the object holding the automatic loss scaling counters; ``generators``:
    openpop's own ``{device: torch.Generator}`` (filled as they are needed); ``devices``: the
    torch devices the calls run on."""

    def __init__(self, enabled: bool, *, steps: int, models, parameters=(), replica_buffers=None,
                 loss_scaler=None, generators=None, devices=()):
        self.enabled = enabled
        self.steps = steps
        self.parameters = list(parameters)
        self.replica_buffers = replica_buffers if replica_buffers is not None else SharedBuffers()
        self.loss_scaler = loss_scaler
        self.generators = generators if generators is not None else {}
        self.cuda_devices = sorted({torch.device(d) for d in devices if torch.device(d).type == "cuda"}, key=str)
        # Modules keep their buffer objects (placement moves them with .data): listed once, and
        # again when the host has assigned new ones between calls (``_save_buffers``).
        self._slots = buffer_slots(*models)
        self._listed = [table[name] for table, name in self._slots]
        self._replica_values = [b for values in self.replica_buffers.values for b in values]
        self.buffers = _unique(self._listed) + self._replica_values
        self._buffer_copies = []   # reused tensors for the buffers
        self._copies = []          # reused tensors for parameters and optimizer state

    def call(self, optimizer) -> "HostCall":
        return HostCall(self, optimizer)

    def _save_buffers(self):
        """Copies of every buffer. All of them, every call: PyTorch does not bump the version
        counter of BatchNorm's running statistics, so which ones a forward mutates cannot be
        told cheaply; buffers are small next to the parameters."""
        held = [table.get(name) for table, name in self._slots]
        if any(now is not listed for now, listed in zip(held, self._listed)):
            self._listed = held
            self.buffers = _unique(b for b in held if b is not None) + self._replica_values
        buffers = self.buffers
        if buffers:
            self._buffer_copies = _reserve(self._buffer_copies, buffers)
            with torch.no_grad():
                foreach_copy_(self._buffer_copies, buffers)

    def _restore_buffers(self):
        if self.buffers:
            for buffer in self.buffers:  # a failed micro-batch may have written values with history
                if has_history(buffer) and not buffer._is_view():
                    buffer.detach_()
            with torch.no_grad():
                foreach_copy_(self.buffers, self._buffer_copies)
        self.replica_buffers.current = 0  # the live buffers hold replica 0's values again

    def _save_rng(self):
        return (torch.get_rng_state(), [(d, torch.cuda.get_rng_state(d)) for d in self.cuda_devices],
                generator_states(self.generators))

    def _restore_rng(self, saved) -> None:
        cpu, cuda, own = saved
        torch.set_rng_state(cpu)
        for device, state in cuda:
            torch.cuda.set_rng_state(state, device)
        restore_generator_states(self.generators, own)  # (drops those the failed call created)

    def _save_weights(self, optimizer) -> "_SavedWeights":
        """Copies of the optimizer's parameters and state, in reused tensors."""
        params = _unique(p for group in optimizer.param_groups for p in group["params"])
        sources = list(params)
        layout = []  # (param, {key: index into sources, or ("value", v)}) for params that have state
        for p in params:
            state = optimizer.state.get(p)
            if not state:
                continue
            entry = {}
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    entry[key] = len(sources)
                    sources.append(value)
                else:
                    entry[key] = ("value", copy.deepcopy(value))
            layout.append((p, entry))
        self._copies = copies = _reserve(self._copies, sources)
        with torch.no_grad():
            foreach_copy_(copies, [t.detach() for t in sources])
        return _SavedWeights(params, copies, layout)


class _SavedWeights:
    """Parameters and optimizer state as they were before a call's first update."""

    def __init__(self, params, copies, layout):
        self.params = params
        self.copies = copies
        self.layout = layout

    def restore(self, optimizer) -> None:
        with torch.no_grad():
            foreach_copy_(self.params, self.copies[:len(self.params)])
            had_state = {id(p) for p, _ in self.layout}
            for p in [p for p in self.params if id(p) not in had_state]:
                optimizer.state.pop(p, None)  # state created by the failed call's first update
            for p, entry in self.layout:
                current = optimizer.state[p]
                for key in [k for k in current if k not in entry]:
                    del current[key]
                for key, where in entry.items():
                    if isinstance(where, tuple):
                        current[key] = copy.deepcopy(where[1])
                        continue
                    live, saved = current.get(key), self.copies[where]
                    if isinstance(live, torch.Tensor) and _same_kind(live, saved):
                        live.copy_(saved)
                    else:
                        current[key] = saved.clone()


class HostCall:
    """One training host call: entered before its first micro-batch; ``update(step, apply,
    *args)`` runs each optimizer update; exited when the call ends, rolling back if it raised."""

    def __init__(self, owner: HostCallRollback, optimizer):
        self._owner = owner
        self._optimizer = optimizer
        self._weights = None       # _SavedWeights once taken
        self._updating = False     # inside an optimizer update
        self.applied = 0           # updates applied so far
        self._interrupts = _HeldInterrupts()

    def __enter__(self) -> "HostCall":
        owner = self._owner
        if owner.enabled:
            owner._save_buffers()
            self._rng = owner._save_rng()
            optimizer = self._optimizer
            self._attributes = [(optimizer, dict(vars(optimizer)))]
            if owner.loss_scaler is not None:
                self._attributes.append((owner.loss_scaler, dict(vars(owner.loss_scaler))))
            self._groups = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
        return self

    def update(self, step: int, apply, *args) -> None:
        """Run ``apply(*args)``, the optimizer update of ``step``. Before an update that is not
        the call's last, parameters and optimizer state are saved (once per call): a later
        failure, or a Ctrl-C in this very update, is then rolled back. The call's last update,
        when nothing was saved, is its commit point: Ctrl-C is held until it is complete."""
        last = step == self._owner.steps - 1
        if self._weights is None and not last and self._owner.enabled:
            self._weights = self._owner._save_weights(self._optimizer)
        unsaved = self._weights is None
        if unsaved:
            self._interrupts.hold()
        self._updating = True
        apply(*args)
        self._updating = False
        self.applied += 1
        if unsaved and not last:  # rollback off: a Ctrl-C held during this update fails the call now
            self._interrupts.release(completed=False)

    def __exit__(self, exc_type, exc, traceback) -> bool:
        try:
            if exc is not None:
                self._interrupts.hold()  # a second Ctrl-C does not cut the rollback short
                self._after_failure(exc)
        finally:
            self._weights = None
            self._interrupts.release(completed=exc is None)
        return False

    def _after_failure(self, exc: BaseException) -> None:
        owner = self._owner
        for p in owner.parameters:
            p.grad = None
        if not owner.enabled:
            if self.applied and hasattr(exc, "add_note"):
                exc.add_note(f"openpop: {self.applied} optimizer update(s) of this host call's {owner.steps} "
                             "step(s) were applied before it failed (Training.rollbackFailedCalls is off).")
            return
        if self._weights is None and (self._updating or self.applied):
            # Nothing was saved because this was the call's last update (its commit point).
            if self._updating:
                logger.error("The optimizer raised while applying the last update of a host call: parameters "
                             "and optimizer state may hold part of that update.")
            else:
                logger.error("A host call failed after applying all of its optimizer updates: they are kept.")
            return
        if self._weights is not None:
            self._weights.restore(self._optimizer)
        for group, saved in zip(self._optimizer.param_groups, self._groups):
            for key in [k for k in group if k != "params" and k not in saved]:
                del group[key]
            group.update(saved)
        for obj, attributes in self._attributes:
            state = vars(obj)
            for key in [k for k in state if k not in attributes]:
                del state[key]
            state.update(attributes)
        owner._restore_buffers()
        owner._restore_rng(self._rng)


class _HeldInterrupts:
    """Holds SIGINT from ``hold()`` to ``release()``, then delivers it (main thread only, and
    only over a Python-level handler: elsewhere a Ctrl-C cannot interrupt the call)."""

    def __init__(self):
        self._previous = None
        self._pending = None

    def hold(self) -> None:
        if self._previous is not None or threading.current_thread() is not threading.main_thread():
            return
        previous = _get_handler(signal.SIGINT)
        if callable(previous):
            self._previous = previous
            _set_handler(signal.SIGINT, self._handle)

    def _handle(self, signum, frame) -> None:
        self._pending = (signum, frame)

    def release(self, completed: bool) -> None:
        """Stop holding; deliver the held interrupt, if any (``completed``: the call has
        finished, its updates stand)."""
        previous, self._previous = self._previous, None
        if previous is None:
            return
        _set_handler(signal.SIGINT, previous)
        pending, self._pending = self._pending, None
        if pending is None:
            return
        if completed and previous is signal.default_int_handler:
            raise KeyboardInterrupt(messages.INTERRUPTED_AFTER_UPDATE)
        previous(*pending)


def _unique(tensors):
    seen, unique = set(), []
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            unique.append(t)
    return unique


def _reserve(copies, sources):
    """``copies`` made to match ``sources`` one to one, reusing the tensors that already match."""
    for index, source in enumerate(sources):
        if index < len(copies) and _same_kind(copies[index], source):
            continue
        fresh = torch.empty_like(source, memory_format=torch.preserve_format)
        if index < len(copies):
            copies[index] = fresh
        else:
            copies.append(fresh)
    del copies[len(sources):]
    return copies


def _same_kind(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and a.layout == b.layout
