"""``builder.aiOnnx`` / ``builder.aiGraphcore``: PopART's op methods, built from the op table.

Each attribute of an ``Opset`` is a method taking PopART's arguments (inputs, then the op's
positional attributes as PopART's bindings order them, then ``debugContext``), plus the
control-flow ops with subgraph builders (``logical_if``, ``loop``, ``scan``) and ``call``.
"""
import functools
import math
from typing import NamedTuple

import numpy as np
import onnx

from . import messages, signatures, tensorinfo
from .builder import Builder, DebugContext
from .enums import ReductionType
from .errors import popart_exception
from .ops import registry
from .shapes import info_of


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

    def __str__(self) -> str:
        if self._domain == registry.ONNX_DOMAIN:
            return f"AiOnnx{self._version}"
        return f"AiGraphcore{self._version}"

    def __getattr__(self, name: str):
        op_type = _op_type_for(self._domain, name, self._version)
        if op_type is None:
            label = "ai.onnx" if self._domain == registry.ONNX_DOMAIN else self._domain
            raise AttributeError(messages.OPSET_HAS_NO_OPERATOR.format(label=label, version=self._version, name=name))
        params = method_parameters(self._domain, self._version, name, op_type)
        builder = self._builder
        domain = self._domain

        version = self._version

        first = _first_parameter(domain, version, name)
        if first != "args":  # an op without inputs: its first parameter is an attribute (init's shape)
            params = (Param(first, True, "ints"),) + tuple(params)

        def op(*pos, **kwargs):
            if first != "args":
                return build_op(builder, op_type, domain, name, [], pos, kwargs, params, version)
            if "args" in kwargs:
                args = kwargs.pop("args")
            elif pos:
                args, pos = pos[0], pos[1:]
            else:
                raise _incompatible(name, params, None, pos, kwargs)
            return build_op(builder, op_type, domain, name, args, pos, kwargs, params, version)
        op.__name__ = name
        op.__doc__ = f"{name}(args, {', '.join(p.name for p in params)})"
        return op

    def constant(self, value, *pos, debugContext="", is_value_sparse=False):
        """``constant(value[, is_value_sparse (opset 11)], debugContext="")``."""
        for extra in pos:
            if isinstance(extra, bool):
                is_value_sparse = extra
            else:
                debugContext = extra
        if is_value_sparse:
            raise popart_exception(messages.SPARSE_CONSTANT_UNSUPPORTED)
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

    def multiconv(self, args, dilations=(), inDilations=(), pads=(), outPads=(), strides=(),
                  availableMemoryProportions=(), partialsTypes=(), planType=None, perConvReservedTiles=None,
                  cycleBackOff=None, enableConvDithering=(), debugContext=""):
        """Several convolutions in one op: ``args`` a list of [data, weights(, bias)], each window parameter a
        list with one entry per convolution (or empty); returns one output per convolution."""
        if self._domain != registry.GRAPHCORE_DOMAIN:
            raise AttributeError(messages.OPSET_HAS_NO_OPERATOR.format(label="ai.onnx", version=self._version,
                                                                       name="multiconv"))
        name = _debug_name_of(debugContext)
        if not args:
            raise popart_exception(messages.MULTICONV_NO_INPUTS.format(name=name))
        for conv_inputs in args:
            if len(conv_inputs) < 2:
                raise popart_exception(messages.MULTICONV_TOO_FEW_INPUTS.format(name=name))
            if len(conv_inputs) > 3:
                raise popart_exception(messages.MULTICONV_TOO_MANY_INPUTS.format(name=name))
        params = {"dilations": dilations, "inDilations": inDilations, "pads": pads, "outPads": outPads,
                  "strides": strides, "availableMemoryProportions": availableMemoryProportions,
                  "partialsTypes": partialsTypes, "enableConvDithering": enableConvDithering}
        for param, values in params.items():
            if len(values) not in (0, len(args)):
                raise popart_exception(messages.MULTICONV_PARAMETER_SETS.format(
                    name=name, param=param, sets=len(values), inputs=len(args)))
        for i, conv_inputs in enumerate(args):  # PopART checks each convolution as Conv's builder does
            _verify_window(self._builder, "Conv", list(conv_inputs), {
                k: (params[k][i] if params[k] else []) for k in ("strides", "pads", "dilations")})
        flat = [t for conv_inputs in args for t in (list(conv_inputs) + [""])[:3]]
        attributes = {k: [int(v) for values in params[k] for v in values]
                      for k in ("strides", "pads", "outPads", "dilations", "inDilations")}
        attributes["numConvs"] = len(args)
        if planType is not None:
            attributes["planType"] = str(planType)
        return self._builder._add_node("MultiConv", self._domain, flat, attributes, len(args), debugContext)

    def call(self, args, num_outputs: int, callee: Builder, debugContext=""):
        if self._domain != registry.GRAPHCORE_DOMAIN:
            raise AttributeError(messages.CALL_ON_AI_ONNX)
        graph = callee._callee_graph()
        name = _debug_name_of(debugContext)
        if int(num_outputs) != len(graph.output):
            raise popart_exception(messages.CALL_OUTPUT_COUNT_MISMATCH.format(
                name=name, n=int(num_outputs), callee=len(graph.output)))
        if len(args) != len(graph.input) - len(graph.initializer):
            raise popart_exception(messages.CALL_INPUT_COUNT_MISMATCH.format(
                name=name, n=len(args), callee=len(graph.input) - len(graph.initializer)))
        outs = self._builder._add_node("Call", self._domain, list(args), {"callee": graph}, int(num_outputs),
                                       debugContext)
        return outs


def _debug_name_of(debugContext) -> str:
    return debugContext if isinstance(debugContext, str) else str(getattr(debugContext, "name", "") or "")


def _op_type_for(domain: str, name: str, version: int):
    if domain == registry.GRAPHCORE_DOMAIN:
        return registry.graphcore_method(name)
    lower = name.lower()
    if lower.startswith("logical_"):  # PopART's names for ONNX And/Or/Not/Xor/If (C++ keywords)
        lower = lower[len("logical_"):]
    op_type = _onnx_op_names().get(lower)
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


DEBUG_PARAMETERS = frozenset(("debugContext", "debug_context", "debugPrefix", "debugName"))
LAST_BOUND_OPSET = max(signatures.AI_ONNX)  # PopART's bindings stop at ai.onnx opset 11


class Param(NamedTuple):
    name: str
    required: bool
    kind: str  # "int", "float", "str", "ints", ... or "" (not checked)


_DEBUG_ONLY = (Param("debugContext", False, ""),)


@functools.cache
def method_parameters(domain: str, version: int, method: str, op_type: str) -> tuple:
    """The parameters of ``builder.<opset>.<method>`` after ``args``, in PopART's order (its bindings
    for ai.graphcore and ai.onnx opsets 6-11). For the ai.onnx opsets openpop adds (12, 13), an op
    unchanged since opset 11 keeps its opset-11 parameters; a changed one takes its ONNX attributes,
    those without a default first, each group in name order (the order PopART's generator gives its
    bindings)."""
    if domain == registry.GRAPHCORE_DOMAIN:
        entry = signatures.AI_GRAPHCORE.get(method.lower()) or signatures.AI_GRAPHCORE.get(method)
        return _parse(entry[1]) if entry else _DEBUG_ONLY
    bound = _bound_onnx_entry(min(version, LAST_BOUND_OPSET), method.lower())
    if version > LAST_BOUND_OPSET:
        schema = onnx.defs.get_schema(op_type, version, "")
        if bound is None or schema.since_version > LAST_BOUND_OPSET:
            return _from_schema(schema, bound)
    return _DEBUG_ONLY if bound is None else bound


def _first_parameter(domain: str, version: int, method: str) -> str:
    """The name of the first parameter of PopART's binding: "args" (the inputs), or an attribute for ops
    without inputs (ai.graphcore init, ai.onnx randomnormal/randomuniform: "shape")."""
    if domain == registry.GRAPHCORE_DOMAIN:
        entry = signatures.AI_GRAPHCORE.get(method.lower()) or signatures.AI_GRAPHCORE.get(method)
        return entry[0] if entry else "args"
    for v in range(min(version, LAST_BOUND_OPSET), min(signatures.AI_ONNX) - 1, -1):
        entry = signatures.AI_ONNX[v].get(method.lower())
        if entry is not None:
            return entry[0]
    return "args"


def _bound_onnx_entry(version: int, method: str):
    for v in range(version, min(signatures.AI_ONNX) - 1, -1):
        entry = signatures.AI_ONNX[v].get(method)
        if entry is not None:
            return _parse(entry[1])
    return None


def _parse(text: str) -> tuple:
    params = []
    for word in text.split():
        required = word.endswith("!")
        name, _, kind = word.rstrip("!").partition(":")
        params.append(Param(name, required, kind))
    return tuple(params)


_SCHEMA_KINDS = {onnx.defs.OpSchema.AttrType.INT: "int", onnx.defs.OpSchema.AttrType.FLOAT: "float",
                 onnx.defs.OpSchema.AttrType.STRING: "str", onnx.defs.OpSchema.AttrType.INTS: "ints",
                 onnx.defs.OpSchema.AttrType.FLOATS: "floats", onnx.defs.OpSchema.AttrType.STRINGS: "strs",
                 onnx.defs.OpSchema.AttrType.GRAPH: "graph"}


def _from_schema(schema, bound) -> tuple:
    attrs = schema.attributes
    names = sorted(n for n in attrs if attrs[n].required) + sorted(n for n in attrs if not attrs[n].required)
    lead = (Param("num_outputs", True, "int"),) if bound and bound[0].name == "num_outputs" else ()
    return lead + tuple(Param(n, attrs[n].required, _SCHEMA_KINDS.get(attrs[n].type, "")) for n in names) + \
        _DEBUG_ONLY


def _accepts(kind: str, value) -> bool:
    """Whether PopART's binding (pybind11) would convert ``value`` for a parameter of ``kind``."""
    if value is None or not kind:
        return True
    if kind == "int":
        return isinstance(value, (int, np.integer)) or hasattr(value, "__index__")
    if kind in ("float", "bool"):
        return isinstance(value, (int, float, np.integer, np.floating, np.bool_))
    if kind == "str":
        return isinstance(value, str)
    if kind in ("ints", "floats", "strs"):
        if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
            return False
        return all(_accepts(kind[:-1], v) for v in value)
    if kind == "graph":
        return isinstance(value, Builder)
    return True


def _converted(kind: str, value):
    """``value`` as the binding's C++ parameter holds it (``gemm(..., 1, 1)``: alpha 1.0)."""
    if value is None:
        return value
    if kind == "float":
        return float(value)
    if kind == "int":
        return int(value)
    if kind == "floats":
        return [float(v) for v in value]
    if kind == "ints":
        return [int(v) for v in value]
    return value


def _incompatible(method: str, params, args, pos, kwargs) -> TypeError:
    signature = ", ".join(["args: List[str]"] + [f"{p.name}: {p.kind or 'object'}" + ("" if p.required else " = ...")
                                                 for p in params])
    invoked = ", ".join([repr(args)] + [repr(v) for v in pos] + [f"{k}={v!r}" for k, v in kwargs.items()])
    return TypeError(messages.INCOMPATIBLE_FUNCTION_ARGUMENTS.format(
        method=method, signature=signature, invoked=invoked))


def build_op(self, op_type, domain, method, args, pos, kwargs, params, version=None):
    """Add one node for ``builder.<opset>.<method>(args, *pos, **kwargs)`` (``self``: the builder):
    positional arguments bind to ``params`` in order, as PopART's bindings take them; arguments its
    bindings would not accept raise PopART's ``TypeError``."""
    if isinstance(args, str):
        args = [args]
    by_name = {p.name: p for p in params}
    if len(pos) > len(params) or any(k not in by_name and k not in DEBUG_PARAMETERS for k in kwargs):
        raise _incompatible(method, params, args, pos, kwargs)
    values = {}
    debugContext = ""
    for name, value in list(zip((p.name for p in params), pos)) + list(kwargs.items()):
        if name in DEBUG_PARAMETERS:
            if not isinstance(value, (str, DebugContext)):
                raise _incompatible(method, params, args, pos, kwargs)
            debugContext = value
            continue
        if name in values:
            raise _incompatible(method, params, args, pos, kwargs)
        kind = by_name[name].kind
        if not (_accepts(kind, value) or (op_type == "Cast" and name == "to" and isinstance(value, int))):
            raise _incompatible(method, params, args, pos, kwargs)
        values[name] = _converted(kind, value)
    missing = [p.name for p in params if p.required and p.name not in values and p.name != "num_outputs"]
    if missing:
        raise _incompatible(method, params, args, pos, kwargs)
    returns_list = "num_outputs" in by_name or method.lower() in _LIST_RESULTS.get(domain, ())
    num_outputs = int(values.pop("num_outputs", _FIXED_OUTPUTS.get(op_type, 1)))
    if op_type == "Cast" and isinstance(values.get("to"), str):  # PopART: cast([x], "FLOAT")
        values["to"] = tensorinfo.onnx_type(values["to"].upper())
    if "lambda" in values:
        values["lambda"] = float(values["lambda"])
    if domain == registry.GRAPHCORE_DOMAIN:
        _graphcore_defaults(op_type, values)
    elif version is not None:
        _verify_onnx(self, op_type, version, list(args), values, num_outputs)
    extra = []
    if op_type.startswith("Reduce") and values.get("axes") is not None and len(values["axes"]) == 0:
        # PopART writes given axes even when empty: no axis reduced (absent axes: all of them).
        extra.append(onnx.helper.make_attribute("axes", [], attr_type=onnx.AttributeProto.INTS))
    outs = self._add_node(op_type, domain, list(args), values, num_outputs, debugContext, extra)
    if not outs:
        return None  # abort: no output
    return outs if returns_list else outs[0]


# Ops whose PopART binding returns a list of ids without taking num_outputs.
_LIST_RESULTS = {
    registry.ONNX_DOMAIN: frozenset(("topk", "unique", "dynamicquantizelinear")),
    registry.GRAPHCORE_DOMAIN: frozenset(("batchnormalization", "groupnormalization", "multiconv", "lstm", "call",
                                          "reducemedian", "sort", "splinebasis", "ctcbeamsearchdecoder")),
}
# How many outputs those ops have.
_FIXED_OUTPUTS = {"TopK": 2, "GroupNormalization": 3, "Sort": 2, "ReduceMedian": 2, "DynamicQuantizeLinear": 3,
                  "Abort": 0}


def _verify_onnx(builder, op_type: str, version: int, args: list, values: dict, num_outputs: int) -> None:
    """The checks PopART's builder makes as it adds an ai.onnx node: output count, and the window
    parameters of convolutions and pools and the pads of Pad-2 against the input shapes when known."""
    schema = onnx.defs.get_schema(op_type, version, "")
    if num_outputs > schema.max_output:
        raise popart_exception(messages.TOO_MANY_OUTPUTS.format(op_type=op_type, num_outputs=num_outputs,
                                                                max_outputs=schema.max_output))
    if op_type in ("Conv", "AveragePool", "MaxPool"):
        _verify_window(builder, op_type, args, values)
    elif op_type == "Pad" and schema.since_version < 11 and args:
        shape = _known_shape(builder, args[0])
        pads = list(values.get("pads") or [])
        if shape is not None and len(pads) != 2 * len(shape):
            raise popart_exception(messages.PAD_VECTOR_LENGTH.format(length=len(pads), rank=len(shape)))


def _known_shape(builder, tensor_id):
    type_proto = builder._inference.types.get(tensor_id) if tensor_id else None
    info = info_of(type_proto) if type_proto is not None else None
    return None if info is None else info.shape()


def _verify_window(builder, op_type: str, args: list, values: dict) -> None:
    kernel = list(values.get("kernel_shape") or [])
    if op_type == "Conv":
        if len(args) < 2:
            raise popart_exception(messages.CONV_NEEDS_TWO_INPUTS.format(n=len(args)))
        weights = _known_shape(builder, args[1])
        if weights is not None:
            inferred = weights[2:]
            if kernel and kernel != inferred:
                raise popart_exception(messages.KERNEL_SHAPE_MISMATCH.format(
                    kernel=" ".join(map(str, kernel)), weights=args[1], inferred=" ".join(map(str, inferred))))
            kernel = inferred
        else:
            kernel = []
    shape = _known_shape(builder, args[0]) if args else None
    if shape is None:
        return
    spatial = len(shape) - 2
    if spatial < 1:
        raise popart_exception(messages.NO_SPATIAL_DIMENSIONS)
    strides = list(values.get("strides") or [])
    pads = list(values.get("pads") or [])
    dilations = list(values.get("dilations") or [])
    if strides and len(strides) != spatial:
        raise popart_exception(messages.WINDOW_VECTOR_LENGTH.format(name="strides", length=len(strides),
                                                                    spatial=spatial))
    if pads and len(pads) != 2 * spatial:
        raise popart_exception(messages.WINDOW_PADDING_LENGTH.format(length=len(pads), spatial=spatial))
    if dilations and len(dilations) != spatial:
        raise popart_exception(messages.WINDOW_VECTOR_LENGTH.format(name="dilations", length=len(dilations),
                                                                    spatial=spatial))
    if not kernel or len(kernel) != spatial or values.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        return
    pads = pads or [0] * (2 * spatial)
    strides = strides or [1] * spatial
    dilations = dilations or [1] * spatial
    ceil = bool(values.get("ceil_mode", 0))
    out = []
    for i in range(spatial):
        span = shape[2 + i] + pads[i] + pads[i + spatial] - dilations[i] * (kernel[i] - 1) - 1
        out.append((math.ceil if ceil else math.floor)(span / strides[i]) + 1)
    if any(o < 0 for o in out):
        raise popart_exception(messages.INVALID_SPATIAL_OUTPUT.format(shape=" ".join(map(str, out))))


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

