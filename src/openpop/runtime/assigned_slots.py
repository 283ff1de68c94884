"""Tensors a forward assigns to its modules' existing slots: put back after passes that must
leave no trace, and kept inside the forward in a compiled program.

Models written for PopTorch often reassign, in forward, a tensor their module already holds:
CLIP's attention blocks do ``self.attn_mask = self.attn_mask.to(x.device)`` (a plain tensor
attribute, the same tensor again), Swin's do it with a parameter
(``self.relative_position_bias_table``), and a submodule may reassign a registered buffer
(``self.ema = 0.9 * self.ema + ...``). Eager PyTorch just stores the tensor. In a program the
forward runs inside ``torch.func.grad`` and, for several micro-batches or device iterations,
inside ``while_loop`` bodies, where Dynamo refuses to store anything on an object from outside
("HOP: Unsafe side effect"), and where a stored tensor would be a value of the traced body
escaping it (at one micro-batch: "Cannot access storage of TensorWrapper"); a parameter's slot
holds ``functional_call``'s plain tensor there, which ``Module.__setattr__`` refuses to store.

What openpop does:

* the passes that run the forward and must leave no trace - the compile pass
  (``executable.py``) and the compiled backend's probe (``compiled/eligibility.py``) - run it
  under ``recording()``, which notes every tensor assigned to a slot that already held one: a
  registered buffer, a parameter, or a plain tensor attribute (not a new attribute). They put
  the parameters and plain attributes back afterwards (``Recorded.restore``; buffers:
  ``BufferSnapshot``), so that no value of theirs - a fake tensor of a shapes-only pass - stays
  on the model;
* a plain attribute that ends the probe holding another tensor than before is refused
  (``Ineligible``: a program cannot carry it; a buffer is carried, as every buffer the forward
  changes is, ``buffer_state.py``; a replaced parameter the compile pass refuses, as PopTorch);
* the program passes the noted slots through ``torch.func.functional_call`` with the tensors
  they hold (``Program._forward``), so that the forward's assignment lasts until the forward
  returns and is then undone, as ``functional_call`` undoes its own: a slot holds the same
  tensor before and after the host call, as in eager (a carried buffer's new value is read back
  from ``functional_call`` and committed after the call);
* while a program may be traced (``Program.run``), ``scoped(slots)`` has those assignments - and
  only those, by module and name - pass Dynamo's side-effect check
  (``torch._dynamo.utils._disable_side_effect_safety_checks_for_current_subtracer``): they are
  undone inside the traced body, so nothing escapes it. Any other assignment (an int counter, a
  new attribute, a list a hook appends to) is checked by Dynamo as before.

``recording`` and ``scoped`` patch ``torch.nn.Module.__setattr__`` while any of them is inside
(one patch for all threads), with a function that does what the one before did (outside Dynamo
the safety check is a plain call). A program with slots is traced once: its scope lets a store
pass whatever tensor it stores, and only the probe saw that the tensor was the slot's own, so a
retrace (a Python value the forward reads changed) is refused as past the recompile limit
(``Program.run``) and the backend declines the model.
"""
import contextlib
import threading

import torch


def held(module, name):
    """``(kind, tensor)`` of ``module``'s own slot ``name`` if it holds a tensor - kind
    "buffer", "parameter" or "attribute" (a plain tensor attribute) - else None."""
    for kind, table in (("buffer", module._buffers), ("parameter", module._parameters), ("attribute", vars(module))):
        value = table.get(name)
        if isinstance(value, torch.Tensor):
            return kind, value
    return None


class Recorded:
    """The slots a forward assigned a tensor to (``recording()``), in order of first assignment:
    ``{qualified name: (module, attribute, kind, the tensor it held before, its version then)}``.

    A slot whose tensor was changed in place (``self.total += x``: the same tensor assigned
    back, as torchmetrics' states are) is left to whoever restores values (a compile pass's
    ``lightning.steps._restored_metrics`` puts copies back): it is neither reported as replaced
    nor put back."""

    def __init__(self, model):
        self._prefix = {}  # a module's first name, as named_buffers() and named_parameters() name its tensors
        for prefix, module in model.named_modules(remove_duplicate=False):
            self._prefix.setdefault(id(module), prefix)
        # Versions before the forward: ``self.total += x`` changes the tensor before it is assigned.
        self._versions = {id(value): _version(value) for module in model.modules()
                          for value in vars(module).values() if isinstance(value, torch.Tensor)}
        self.slots = {}

    def note(self, module, name, value) -> None:
        prefix = self._prefix.get(id(module))
        found = held(module, name) if prefix is not None and isinstance(value, torch.Tensor) else None
        if found is not None:
            qualified = f"{prefix}.{name}" if prefix else name
            if qualified not in self.slots:
                self.slots[qualified] = (module, name, *found, self._versions.get(id(found[1]), _version(found[1])))

    def names(self) -> list:
        return list(self.slots)

    def replaced(self):
        """The qualified name of the first plain attribute that holds another tensor than before
        (a program undoes the assignment, so the new tensor would not reach the module), or None.
        A changed buffer a program carries; a replaced parameter the compile pass refuses
        (``errors.PARAMETER_REASSIGNED``, PopTorch's message)."""
        for qualified, (module, name, kind, before, version) in self.slots.items():
            if kind == "attribute" and _version(before) == version and vars(module).get(name) is not before:
                return qualified
        return None

    def restore(self) -> None:
        """Put back every parameter and plain attribute the forward assigned (buffers:
        ``weights.BufferSnapshot``)."""
        for module, name, kind, before, version in self.slots.values():
            if kind == "parameter":
                module._parameters[name] = before
            elif kind == "attribute" and _version(before) == version:
                object.__setattr__(module, name, before)


# One patch of ``Module.__setattr__`` for every recording and scope inside, on any thread: each
# saving and restoring the function it found would leave a patch installed when two overlap.
_lock = threading.Lock()
_recorders = []  # the ``Recorded`` of the recordings inside
_scopes = []  # the slot maps (``{id(module): names}``) of the scopes inside
_replaced = None  # the ``Module.__setattr__`` the patch replaced


def _setattr(module, name, value):
    """``Module.__setattr__`` while a recording or a scope is inside (module docstring)."""
    for record in _recorders:
        record.note(module, name, value)
    for slots in _scopes:
        if name in slots.get(id(module), ()):
            # A parameter's slot holds functional_call's tensor, which Module.__setattr__ would
            # refuse there (not an nn.Parameter): it is stored as functional_call stores it.
            store = _store_parameter if name in module._parameters else _replaced
            return _dynamo_side_effects_allowed(store, module, name, value)
    return _replaced(module, name, value)


@contextlib.contextmanager
def _patched(entries, entry):
    global _replaced
    with _lock:
        if not _recorders and not _scopes:
            _replaced = torch.nn.Module.__setattr__
            torch.nn.Module.__setattr__ = _setattr
        entries.append(entry)
    try:
        yield
    finally:
        with _lock:
            del entries[next(i for i, e in enumerate(entries) if e is entry)]
            if not _recorders and not _scopes:
                torch.nn.Module.__setattr__ = _replaced
                _replaced = None


def recording(record):
    """Note in ``record`` (a ``Recorded``) the tensors assigned to its model's modules' existing
    slots while inside."""
    return _patched(_recorders, record)


def scoped(slots):
    """While inside, the assignments to ``slots`` (``{id(module): names}``) pass Dynamo's
    side-effect check (module docstring)."""
    global _dynamo_side_effects_allowed
    if _dynamo_side_effects_allowed is None:
        from ..torch_compat import dynamo_side_effects_allowed  # (imports Dynamo: programs only)
        _dynamo_side_effects_allowed = dynamo_side_effects_allowed
    return _patched(_scopes, slots)


_dynamo_side_effects_allowed = None


def _store_parameter(module, name, value):
    module._parameters[name] = value


def _version(tensor):
    """The tensor's version counter (None for an inference tensor, which keeps none)."""
    return None if tensor.is_inference() else tensor._version
