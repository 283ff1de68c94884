"""Custom ops: PyTorch implementations of PopART custom ops, for ``poptorch.custom_op``.

``register_custom_op(name, domain, fn)`` gives the op ``domain::name`` an implementation;
``graphcore`` registers those of the ops Graphcore's public applications call.
"""
from . import graphcore  # (registers the shipped implementations)
from .registry import (
    CustomOp,
    call_custom_op,
    check_attributes,
    register_custom_op,
    registered_custom_op,
    unregister_custom_op,
)

__all__ = ["CustomOp", "call_custom_op", "check_attributes", "register_custom_op", "registered_custom_op",
           "unregister_custom_op"]
