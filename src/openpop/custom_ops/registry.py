"""The registry of custom-op implementations and ``poptorch.custom_op``'s call.

PopART custom ops are IPU programs, found by ``(domain, name)`` in a loaded ``.so``. openpop
keeps a table from ``(domain, name)`` to a PyTorch function instead; ``poptorch.custom_op``
runs the function registered for its op and returns its outputs as PopTorch did: a list of
tensors shaped and typed like ``example_outputs``.
"""
import threading
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..errors import createPoptorchError
from ..runtime import context
from . import messages


@dataclass(frozen=True)
class CustomOp:
    """One registered implementation."""

    domain: str
    name: str
    fn: Callable
    eager_only: bool = False

    @property
    def qualified_name(self) -> str:
        return f"{self.domain}::{self.name}"

    def describe(self) -> str:
        fn = self.fn
        return f"{getattr(fn, '__module__', None) or '?'}.{getattr(fn, '__qualname__', type(fn).__name__)}"


_registry: dict[tuple[str, str], CustomOp] = {}
_lock = threading.Lock()


def register_custom_op(name: str, domain: str, fn: Optional[Callable] = None, *, replace: bool = False,
                       eager_only: bool = False):
    """Registers a PyTorch implementation of the PopART custom op ``domain::name``.

    ``poptorch.custom_op(inputs, name, domain, ...)`` then calls ``fn(*inputs, **attributes)``
    wherever the model runs (in an executor or as a plain PyTorch model). ``fn`` returns a
    tensor or a list/tuple of tensors, as many as the call's ``example_outputs`` and with their
    shapes; outputs of another dtype are cast to the example's. Gradients flow through ``fn`` by
    autograd (or by the ``torch.autograd.Function`` it applies).

    Without ``fn`` it returns a decorator:

    >>> @openpop.register_custom_op("LeakyRelu", "custom.ops")
    ... def leaky_relu(x, alpha=0.01):
    ...     return torch.where(x < 0, alpha * x, x)

    Graphcore's applications' ops (``ai.graphcore`` RemapCE, CopyTensor, Ctc, Nms;
    ``com.acme::ExpMovAvg``; the tutorial's ``custom.ops::LeakyRelu``) are registered already
    (``openpop.custom_ops.graphcore``).

    Args:
        name (str): The op's name, as the C++ ``OperatorIdentifier`` and ``custom_op`` give it.
        domain (str): The op's domain, for example ``"ai.graphcore"``. Any ``domain_version``
            of the op runs the same implementation.
        fn (callable): ``fn(*inputs, **attributes)`` returning the op's outputs.
        replace (bool): Replace an implementation registered before for ``domain::name``
            (otherwise that is an error).
        eager_only (bool): ``fn`` has effects a compiled program would lose (it updates
            tensors in place, say): models that call it run eagerly.

    Returns:
        ``fn`` (or, without ``fn``, a decorator that registers the function it decorates).
    """
    for what, value in (("name", name), ("domain", domain)):
        if not isinstance(value, str) or not value:
            raise ValueError(messages.REGISTER_NAME.format(what=what, value=value))
    if fn is None:
        return lambda function: register_custom_op(name, domain, function, replace=replace,
                                                   eager_only=eager_only)
    if not callable(fn):
        raise ValueError(messages.REGISTER_FN.format(value=fn))
    op = CustomOp(domain, name, fn, bool(eager_only))
    with _lock:
        existing = _registry.get((domain, name))
        if existing is not None and not replace:
            raise ValueError(messages.ALREADY_REGISTERED.format(op=op.qualified_name, fn=existing.describe()))
        _registry[(domain, name)] = op
    return fn


def unregister_custom_op(name: str, domain: str) -> Callable:
    """Removes the implementation of ``domain::name``; returns its function."""
    with _lock:
        op = _registry.pop((domain, name), None)
    if op is None:
        raise ValueError(messages.NOT_REGISTERED_TO_REMOVE.format(op=f"{domain}::{name}"))
    return op.fn


def registered_custom_op(name: str, domain: str) -> Optional[CustomOp]:
    """The implementation registered for ``domain::name``, or None."""
    return _registry.get((domain, name))


def check_attributes(attributes: Optional[dict]) -> dict:
    """PopTorch's checks of ``custom_op``'s attributes (its texts); a copy to call with."""
    if attributes is None:
        return {}
    for key, value in attributes.items():
        if not isinstance(key, str):
            raise ValueError(messages.ATTRIBUTE_KEYS)
        if not isinstance(value, (float, int, str, list, tuple)):
            raise ValueError(messages.ATTRIBUTE_VALUES)
        if isinstance(value, (list, tuple)) and not all(isinstance(v, type(value[0])) for v in value):
            raise ValueError(messages.ATTRIBUTE_LIST_TYPES)
    for text in list(attributes) + list(attributes.values()):
        for value in text if isinstance(text, (list, tuple)) else (text,):
            if isinstance(value, str) and not value.isascii():
                raise ValueError(messages.ATTRIBUTE_NON_ASCII.format(value=value))
    return dict(attributes)


def call_custom_op(inputs, name: str, domain: str, example_outputs, attributes: Optional[dict]) -> list:
    """``poptorch.custom_op``: the registered implementation's outputs, as a list."""
    attributes = check_attributes(attributes)
    qualified = f"{domain}::{name}"
    examples = list(example_outputs)
    for index, example in enumerate(examples):
        if not isinstance(example, torch.Tensor):
            raise ValueError(messages.EXAMPLE_NOT_TENSOR.format(op=qualified, index=index,
                                                                kind=type(example).__name__))
    op = _registry.get((domain, name))
    if op is None:
        known = ", ".join(sorted(f"{d}::{n}" for d, n in _registry)) or "none"
        raise createPoptorchError(messages.NOT_REGISTERED.format(name=name, domain=domain, known=known))
    ctx = context.current()
    if op.eager_only and ctx is not None and ctx.tracing:
        ctx.host_io = messages.EAGER_ONLY.format(op=qualified)  # the compiled backend declines
    tracker = getattr(ctx, "loss_tracker", None)
    tracked = len(tracker.losses) if tracker is not None else 0
    result = op.fn(*inputs, **attributes)
    if tracker is not None:  # one op: torch losses inside it are not the model's (identity_loss marks those)
        del tracker.losses[tracked:]
    outputs = list(result) if isinstance(result, (list, tuple)) else [result]
    if len(outputs) != len(examples):
        raise createPoptorchError(messages.OUTPUT_COUNT.format(op=qualified, fn=op.describe(), got=len(outputs),
                                                               expected=len(examples)))
    for index, (output, example) in enumerate(zip(outputs, examples)):
        if not isinstance(output, torch.Tensor):
            raise createPoptorchError(messages.OUTPUT_NOT_TENSOR.format(op=qualified, fn=op.describe(), index=index,
                                                                        kind=type(output).__name__))
        if output.shape != example.shape:
            raise createPoptorchError(messages.OUTPUT_SHAPE.format(
                op=qualified, fn=op.describe(), index=index, got=list(output.shape), expected=list(example.shape)))
        if output.dtype != example.dtype:
            outputs[index] = output.to(example.dtype)
    return outputs
