"""User-defined input types: how to find the tensors inside them and rebuild them.

A model may take objects of its own types as inputs. For such a type, register an
``ICustomArgParser``; the executor asks ``custom_arg_parser_for(obj)`` and uses
``yieldTensors`` to collect the tensors (to split them into micro-batches, move them to
devices, ...) and ``reconstruct`` to build an object of the same shape around new tensors.
"""
import abc
import math
from collections.abc import Iterator
from typing import Any, Optional

import torch

from . import errors
from .errors import createPoptorchError
from .torch_compat import pytree

__all__ = ["ICustomArgParser", "custom_arg_parser_for", "registerCustomArgParser"]


class ICustomArgParser(abc.ABC):
    """Base class of the parsers given to ``registerCustomArgParser``."""

    @abc.abstractmethod
    def yieldTensors(self, struct) -> Iterator:
        """Yield every tensor of ``struct``, in a fixed order."""

    @abc.abstractmethod
    def reconstruct(self, original_structure, tensor_iterator: Iterator) -> Any:
        """Return a copy of ``original_structure`` whose tensors are taken, in the order
        ``yieldTensors`` gives them, from ``tensor_iterator``."""


_parsers = {}


def registerCustomArgParser(arg_data_type: type, arg_parser: ICustomArgParser) -> None:
    """Use ``arg_parser`` for inputs of type ``arg_data_type`` (and its subclasses)."""
    if not isinstance(arg_parser, ICustomArgParser):
        raise createPoptorchError(errors.ARG_PARSER_TYPE)
    first_registration = arg_data_type not in _parsers
    _parsers[arg_data_type] = arg_parser
    if first_registration and arg_data_type not in pytree.SUPPORTED_NODES:
        # Inputs and outputs are walked with torch's pytree: teach it this type, deferring to
        # whichever parser is registered for the type at the time of the walk.
        pytree.register_pytree_node(
            arg_data_type,
            lambda obj: (list(custom_arg_parser_for(obj).yieldTensors(obj)), ParsedInput(obj)),
            lambda tensors, parsed: custom_arg_parser_for(parsed.obj).reconstruct(parsed.obj, iter(tensors)),
        )


class ParsedInput:
    """How an input of a registered type appears in the structure of a call's inputs (its pytree
    context): the object itself, for ``reconstruct``, and the values its parser does not yield.

    Two calls have the same structure when their objects are of one type and hold equal values
    besides their tensors (``1.0`` in ``Batch(x, scale=1.0)``): a compiled program, which keeps
    those values as constants of its trace, serves both. Comparing the objects themselves would
    tell every new object from the last (a new program each call), or, for a dataclass, compare
    its tensors. The values are the object's attributes (``__dict__`` and ``__slots__``) and, for a
    list, tuple or dict subclass, its items, with the tensors its parser yields left out (another
    tensor is the same only as itself: the program would keep the first one); an object that has
    none of these is only the same as itself."""

    __slots__ = ("obj", "values")

    def __init__(self, obj):
        self.obj = obj
        self.values = _values_besides_tensors(obj, {id(t) for t in custom_arg_parser_for(obj).yieldTensors(obj)})

    def __eq__(self, other) -> bool:
        if not isinstance(other, ParsedInput) or type(self.obj) is not type(other.obj):
            return False
        if self.values is None or other.values is None:
            return self.obj is other.obj
        (spec, leaves), (other_spec, other_leaves) = self.values, other.values
        return spec == other_spec and all(_same_constant(a, b) for a, b in zip(leaves, other_leaves))

    def __hash__(self) -> int:
        return hash(type(self.obj))

    def __repr__(self) -> str:  # (part of a saved program's key: saved_programs.py)
        kind = f"{type(self.obj).__module__}.{type(self.obj).__qualname__}"
        return f"{kind}(at {id(self.obj):#x})" if self.values is None else f"{kind}{self.values!r}"


class _Tensor:
    """Where an attribute held a tensor (its values reach the program as an input)."""

    def __eq__(self, other) -> bool:
        return isinstance(other, _Tensor)

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "<tensor>"


_TENSOR = _Tensor()


def _values_besides_tensors(obj, yielded):
    """``(spec, leaves)`` of ``obj``'s attributes (and items), the ``yielded`` tensors (ids)
    replaced by a marker; None when it has no ``__dict__``, ``__slots__`` or items."""
    attributes = dict(getattr(obj, "__dict__", None) or {})
    if isinstance(obj, dict):
        attributes[" items"] = list(obj.items())
    elif isinstance(obj, (list, tuple)):
        attributes[" items"] = list(obj)
    slotted = False
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in ((slots,) if isinstance(slots, str) else slots):
            slotted = True
            if name not in ("__dict__", "__weakref__") and hasattr(obj, name):
                attributes[name] = getattr(obj, name)
    if not attributes and not slotted and not hasattr(obj, "__dict__"):
        return None
    leaves, spec = pytree.tree_flatten(dict(sorted(attributes.items())))
    return spec, [_TENSOR if isinstance(leaf, torch.Tensor) and id(leaf) in yielded else leaf for leaf in leaves]


def same_constant(a, b) -> bool:
    """Equal as a compiled program's constant: floats also in sign (``-0.0`` is not ``0.0``: a
    program traced with one computes ``copysign`` with it), NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float):
        return (a == b and math.copysign(1.0, a) == math.copysign(1.0, b)) or (math.isnan(a) and math.isnan(b))
    return not a != b


def _same_constant(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    try:
        return same_constant(a, b)
    except Exception:  # a value whose == gives no truth value (an array): only itself is the same
        return a is b


def custom_arg_parser_for(obj) -> Optional[ICustomArgParser]:
    """The parser registered for ``type(obj)``, else for its nearest base class, else None."""
    for cls in type(obj).__mro__:
        parser = _parsers.get(cls)
        if parser is not None:
            return parser
    return None
