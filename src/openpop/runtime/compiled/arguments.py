"""What a compiled host call hands its program, with what stays the same between calls worked
out once per program: a host call of a small model costs tens of microseconds, so walking the
module tree or recomputing shapes on every call shows (``benchmarks/host_overhead.py``).

* ``parameters()``: the model's parameters in the program's (trained, frozen) order. Resolved by
  name once; later calls check the few dict slots those names go through (``_modules`` and
  ``_parameters`` entries) and resolve again when one holds another object (a parameter or
  submodule replaced), so they see exactly what ``named_parameters()`` would give.
* ``tensors(inputs)``: the call's tensor inputs, in the program's order. Inputs sharing memory
  (the same tensor passed twice, or two views of one tensor) are handed over as copies after the
  first: ``while_loop`` refuses operands that alias each other, and the program cannot tell from
  its trace whether a later call aliases. Nothing is lost by copying: a forward that changes an
  input in place does not run as a program (``eligibility.probe``).
"""


class ProgramArguments:
    """See the module docstring."""

    def __init__(self, model, trained_names, frozen_names):
        self._model = model
        self._names = list(trained_names) + list(frozen_names)
        self._trained_count = len(trained_names)
        self._tensors = None
        self._slots = None  # (dict, key, object) that must still hold; None: resolve every call

    def parameters(self):
        """(trained, frozen): the parameter tensors the model holds now (lists the caller must
        not change: the same ones are handed out until a parameter is replaced)."""
        slots = self._slots
        if slots is None:
            self._resolve()
        else:
            for table, key, value in slots:
                if table.get(key) is not value:
                    self._resolve()
                    break
        return self._tensors

    @staticmethod
    def tensors(inputs):
        """The call's tensor inputs in ``tensor_positions`` order (the program views them per micro-batch)."""
        leaves = inputs.leaves
        tensors = [leaves[pos] for pos in inputs.tensor_positions]
        if len(tensors) > 1 and share_memory(tensors):
            seen = set()
            for index, tensor in enumerate(tensors):
                storage = tensor.untyped_storage().data_ptr()
                if storage in seen:
                    tensors[index] = tensor.clone()
                seen.add(storage)
        return tensors

    def _resolve(self):
        named = dict(self._model.named_parameters())
        tensors = [named[name] for name in self._names]
        self._tensors = tensors[:self._trained_count], tensors[self._trained_count:]
        try:
            self._slots = tuple(_slots_of(self._model, self._names))
        except KeyError:  # names not made of _modules / _parameters keys (a custom named_parameters)
            self._slots = None


def share_memory(tensors) -> bool:
    """Whether two of ``tensors`` (host or device tensors with storage) share a storage."""
    return len({tensor.untyped_storage().data_ptr() for tensor in tensors}) < len(tensors)


def _slots_of(model, names):
    slots = {}
    for name in names:
        module = model
        *path, local = name.split(".")
        for part in path:
            child = module._modules[part]
            slots[(id(module._modules), part)] = (module._modules, part, child)
            module = child
        slots[(id(module._parameters), local)] = (module._parameters, local, module._parameters[local])
    return slots.values()
