"""``builder.aiOnnx`` / ``builder.aiGraphcore``: PopART's op methods, built from the op table.

Each attribute of an ``Opset`` is a method taking PopART's arguments (inputs, then the op's
positional attributes as PopART's bindings order them, then ``debugContext``), plus the
control-flow ops with subgraph builders (``logical_if``, ``loop``, ``scan``) and ``call``.
"""
import numpy as np
import onnx

from . import messages, tensorinfo
from .builder import Builder, DebugContext
from .enums import ReductionType
from .ops import registry


class Opset:
    """``builder.aiOnnx`` / ``builder.aiGraphcore``: every op of the domain as a method returning its
    output id (a list of ids for several outputs)."""

    def __init__(self, builder: Builder, domain: str, version: int):
        self._builder = builder
        self._domain = domain
        self._version = version

    @property
    def version(self) -> int:
        return self._version

    def __getattr__(self, name: str):
        op_type = _op_type_for(self._domain, name, self._version)
        if op_type is None:
            label = "ai.onnx" if self._domain == registry.ONNX_DOMAIN else self._domain
            raise AttributeError(messages.OPSET_HAS_NO_OPERATOR.format(label=label, version=self._version, name=name))
        entry = registry.lookup(self._domain, op_type)
        positional = entry.positional if entry is not None else ()
        builder = self._builder
        domain = self._domain

        def op(args, *pos, debugContext="", **attrs):
            return build_op(builder, op_type, domain, args, pos, positional, attrs, debugContext)
        op.__name__ = name
        return op

    def constant(self, value, debugContext="") -> str:
        array = np.array(value, copy=True, order="C")  # keeps 0-d arrays 0-d (ascontiguousarray would not)
        return self._builder._add_node("Constant", self._domain, [], {"value": array}, 1,
                                       debugContext)[0]

    def _control(self, op_type, args, num_outputs, attributes, debugContext):
        if self._domain != registry.ONNX_DOMAIN:
            raise AttributeError(messages.ONNX_OPERATOR_ON_AI_GRAPHCORE.format(op_type=op_type))
        return self._builder._add_node(op_type, self._domain, list(args), attributes, int(num_outputs),
                                       debugContext)

    def logical_if(self, args, num_outputs: int, else_branch: Builder, then_branch: Builder, debugContext=""):
        """ONNX ``If``: ``then_branch``'s outputs if ``args[0]`` is true, else ``else_branch``'s."""
        return self._control("If", args, num_outputs, {"then_branch": then_branch, "else_branch": else_branch},
                             debugContext)

    def loop(self, args, num_outputs: int, body: Builder, debugContext=""):
        """ONNX ``Loop``: ``args`` = [trip count, condition, loop-carried values...]."""
        return self._control("Loop", args, num_outputs, {"body": body}, debugContext)

    def scan(self, args, num_outputs: int, body: Builder, num_scan_inputs: int, scan_input_axes=(),
             scan_input_directions=(), scan_output_axes=(), scan_output_directions=(), debugContext=""):
        """ONNX ``Scan`` (opset 9+): ``args`` = [initial states..., scan inputs...]."""
        return self._control("Scan", args, num_outputs, {
            "body": body, "num_scan_inputs": int(num_scan_inputs), "scan_input_axes": list(scan_input_axes),
            "scan_input_directions": list(scan_input_directions), "scan_output_axes": list(scan_output_axes),
            "scan_output_directions": list(scan_output_directions)}, debugContext)

    def call(self, args, num_outputs: int, callee: Builder, debugContext=""):
        if self._domain != registry.GRAPHCORE_DOMAIN:
            raise AttributeError(messages.CALL_ON_AI_ONNX)
        outs = self._builder._add_node("Call", self._domain, list(args), {"callee": callee}, int(num_outputs),
                                       debugContext)
        return outs


def _op_type_for(domain: str, name: str, version: int):
    if domain == registry.GRAPHCORE_DOMAIN:
        return registry.graphcore_method(name)
    op_type = _onnx_op_names().get(name.lower())
    if op_type is None:
        return None
    try:
        onnx.defs.get_schema(op_type, version, "")
    except Exception:
        return None
    return op_type


_ONNX_NAMES = {}


def _onnx_op_names():
    if not _ONNX_NAMES:
        for schema in onnx.defs.get_all_schemas_with_history():
            if schema.domain == "":
                _ONNX_NAMES[schema.name.lower()] = schema.name
    return _ONNX_NAMES


def build_op(self, op_type, domain, args, pos, positional, attrs, debugContext):
    """Add one node for ``builder.<opset>.<op>(args, *pos, **attrs)`` (``self``: the builder)."""
    if isinstance(args, str):
        args = [args]
    values = dict(zip(positional, pos))
    if len(pos) > len(positional):
        # A trailing positional argument beyond the known ones is PopART's debugContext.
        if len(pos) == len(positional) + 1 and isinstance(pos[-1], (str, DebugContext)):
            debugContext = pos[-1]
        else:
            raise TypeError(messages.TOO_MANY_POSITIONAL_ARGUMENTS.format(
                op_type=op_type, n_pos=len(pos), positional=list(positional)))
    values.update(attrs)
    num_outputs = int(values.pop("num_outputs", _FIXED_OUTPUTS.get(op_type, 1)))
    if op_type == "Cast" and isinstance(values.get("to"), str):  # PopART: cast([x], "FLOAT")
        values["to"] = tensorinfo.onnx_type(values["to"].upper())
    if "lambda" in values:
        values["lambda"] = float(values["lambda"])
    if domain == registry.GRAPHCORE_DOMAIN:
        _graphcore_defaults(op_type, values)
    outs = self._add_node(op_type, domain, list(args), values, num_outputs, debugContext)
    # Ops taking ``num_outputs`` (MaxPool, Dropout, BatchNormalization, Split, LSTM...) return a
    # list in PopART's bindings, even of one id; scripts index it.
    if num_outputs == 1 and "num_outputs" not in positional and op_type not in _FIXED_OUTPUTS:
        return outs[0]
    return outs


# Ops whose PopART binding always returns several outputs (no num_outputs argument).
_FIXED_OUTPUTS = {"TopK": 2, "GroupNormalization": 3}


def _graphcore_defaults(op_type: str, values: dict) -> None:
    if "reduction" in values:
        values["reduction"] = int(values["reduction"])
    elif op_type in ("L1Loss", "Nll", "IdentityLoss"):
        values["reduction"] = int(ReductionType.Mean)
    if op_type == "Nll":
        if values.get("ignoreIndex") is None:
            values.pop("ignoreIndex", None)
        if "inputIsLogProbability" in values:
            values["inputIsLogProbability"] = int(bool(values["inputIsLogProbability"]))

