"""Whether an optimizer's values changed since the last host call, told in about a microsecond.

A repeated compiled host call (``repeat_call.py``) must notice what the user may have changed on
the optimizer between calls - an LR scheduler's step or a user writing ``group["lr"]`` (new
hyperparameter inputs), ``group["momentum"] = 0.9`` or a new ``max_grad_norm`` (a static choice:
``optimizer_support.signature``, a new program) - but reading every hyperparameter and the
signature again (``hyper_values``, ``signature``) costs several microseconds per call.
``OptimizerSnapshot.unchanged()`` instead compares what the optimizer holds now with what it
held at the last call: the values of its ``__dict__`` (``loss_scaling``, ``max_grad_norm``,
``bias_correction``, the ``param_groups`` list, ...) and of each parameter group's dict, plus each
group's parameter count - by identity first, so an unchanged optimizer costs a few tuple
comparisons. Any new value, key or group makes it ``False`` (the caller then reads everything).

That is exact only while each value the update reads is immutable: a value changed in place (a
tensor ``lr`` that a scheduler ``fill_``s, a list) is the same object and would compare equal.
So a snapshot is taken only of optimizers whose groups hold numbers, booleans, strings, ``None``
and tuples of them besides ``params``, whose update-relevant attributes are such values, and
which have no step hooks attached (``step_hooks.py``: their clipping lives in another object);
for any other optimizer ``unchanged()`` is always ``False``.
"""
from . import step_hooks

_IMMUTABLE = (float, int, bool, str, type(None))
_READ_ATTRIBUTES = ("loss_scaling", "max_grad_norm", "bias_correction", "use_tf_variant")  # (functional_optim)


class OptimizerSnapshot:
    """See the module docstring."""

    def __init__(self, optimizer):
        self._optimizer = optimizer
        self._values = None

    def unchanged(self) -> bool:
        """Whether the optimizer holds the values it held when this was last asked (the first
        time: ``False``). Records the values it holds now."""
        optimizer = self._optimizer
        values = (tuple(vars(optimizer).values()),
                  [(tuple(group.values()), len(group["params"])) for group in optimizer.param_groups])
        try:
            if values == self._values:
                return True
        except Exception:  # (an attribute the update does not read: a new tensor of several elements)
            pass
        self._values = values if _snapshot_exact(optimizer) else None
        return False


def _snapshot_exact(optimizer) -> bool:
    if step_hooks.of(optimizer) is not None:
        return False
    if not all(_immutable(getattr(optimizer, name, None)) for name in _READ_ATTRIBUTES):
        return False
    return all(_immutable(value) for group in optimizer.param_groups
               for key, value in group.items() if key != "params")


def _immutable(value) -> bool:
    if type(value) is tuple:
        return all(_immutable(v) for v in value)
    return type(value) in _IMMUTABLE
