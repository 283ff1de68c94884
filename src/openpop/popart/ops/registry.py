"""The op table: one entry per ONNX ``(domain, op_type)``, each a torch implementation.

An implementation is ``fn(ctx, inputs, attrs) -> tensor | list of tensors`` where ``inputs``
holds one torch tensor per node input (``None`` for an omitted optional input), ``attrs`` the
node's ONNX attributes as Python values and ``ctx`` an ``OpContext`` (the opset the node was
built for, whether the graph trains, the node's name for error messages).
"""
from dataclasses import dataclass
from typing import Callable

ONNX_DOMAIN = "ai.onnx"
GRAPHCORE_DOMAIN = "ai.graphcore"


@dataclass
class OpContext:
    opset: int
    training: bool
    node_name: str
    op_type: str
    # Per-node state an implementation keeps across calls (e.g. BatchNorm running statistics
    # live in the graph's buffers, named here).
    graph: object = None
    node: object = None


@dataclass(frozen=True)
class OpEntry:
    op_type: str
    domain: str
    fn: Callable
    # Builder positional arguments after ``args`` (attribute names or pseudo-arguments such
    # as ``num_outputs``), as PopART's Python bindings order them.
    positional: tuple[str, ...] = ()
    # Inputs that are never differentiated (shapes, indices): initializers feeding only these
    # stay constants in training.
    non_differentiable_inputs: tuple[int, ...] = ()
    differentiable: bool = True
    # Inputs whose value the op updates in place (BatchNorm running statistics in training).
    updated_inputs: tuple[int, ...] = ()
    since: int = 1
    method: str = ""  # the Builder method name (``aiGraphcore.nllloss`` builds ``Nll``)


_TABLE: dict[tuple[str, str], OpEntry] = {}


def _canon(domain: str) -> str:
    return ONNX_DOMAIN if domain in ("", ONNX_DOMAIN) else domain


def register(op_type: str, domain: str = ONNX_DOMAIN, *, positional=(), non_differentiable_inputs=(),
             differentiable=True, updated_inputs=(), since=1, method=None):
    def wrap(fn):
        key = (_canon(domain), op_type)
        _TABLE[key] = OpEntry(op_type, _canon(domain), fn, tuple(positional), tuple(non_differentiable_inputs),
                              differentiable, tuple(updated_inputs), since, method or op_type.lower())
        return fn
    return wrap


def lookup(domain: str, op_type: str):
    return _TABLE.get((_canon(domain), op_type))


def entries():
    return dict(_TABLE)


def graphcore_method(name: str):
    """The ai.graphcore op type built by ``builder.aiGraphcore.<name>``, or None."""
    for (domain, op), entry in _TABLE.items():
        if domain == GRAPHCORE_DOMAIN and entry.method == name.lower():
            return op
    return None
