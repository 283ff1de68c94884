"""User-defined input types: how to find the tensors inside them and rebuild them.

A model may take objects of its own types as inputs. For such a type, register an
``ICustomArgParser``; the executor asks ``custom_arg_parser_for(obj)`` and uses
``yieldTensors`` to collect the tensors (to split them into micro-batches, move them to
devices, ...) and ``reconstruct`` to build an object of the same shape around new tensors.
"""
import abc
from collections.abc import Iterator
from typing import Any, Optional

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
            lambda obj: (list(custom_arg_parser_for(obj).yieldTensors(obj)), obj),
            lambda tensors, obj: custom_arg_parser_for(obj).reconstruct(obj, iter(tensors)),
        )


def custom_arg_parser_for(obj) -> Optional[ICustomArgParser]:
    """The parser registered for ``type(obj)``, else for its nearest base class, else None."""
    for cls in type(obj).__mro__:
        parser = _parsers.get(cls)
        if parser is not None:
            return parser
    return None
