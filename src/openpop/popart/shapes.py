"""Shapes and data types of a graph's tensors: ONNX shape inference for ai.onnx nodes, the torch
implementation on meta tensors for ai.graphcore nodes (ONNX knows nothing of them). Errors
name the node, as PopART's do."""
from typing import Optional

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper, shape_inference

from . import external_data, messages, tensorinfo
from .errors import popart_exception
from .ops import registry

ANNOTATION_PREFIX = "__"


def node_label(node) -> str:
    outs = ", ".join(node.output)
    return f"{node.op_type} node '{node.name or outs}' (outputs: {outs})"


def strip_annotations(node, schema=None):
    """``node`` without PopART's ``__`` annotation attributes (ONNX's schemas do not know them), nor, given
    the op's ``schema``, attributes it does not define (``builder.addNodeAttribute`` adds any name; PopART's
    non-strict ONNX inference ignores them)."""
    def keep(a):
        return not a.name.startswith(ANNOTATION_PREFIX) and (schema is None or a.name in schema.attributes)
    if all(keep(a) for a in node.attribute):
        return node
    clean = onnx.NodeProto()
    clean.CopyFrom(node)
    del clean.attribute[:]
    clean.attribute.extend(a for a in node.attribute if keep(a))
    return clean


def type_of(dtype_name: str, shape) -> onnx.TypeProto:
    return helper.make_tensor_type_proto(tensorinfo.onnx_type(dtype_name), list(shape))


def info_of(type_proto: onnx.TypeProto) -> Optional[tensorinfo.TensorInfo]:
    tensor = type_proto.tensor_type
    if not tensor.HasField("shape") or tensor.elem_type == 0:
        return None
    dims = []
    for d in tensor.shape.dim:
        if not d.HasField("dim_value"):
            return None
        dims.append(d.dim_value)
    return tensorinfo.TensorInfo(tensorinfo.popart_name(tensor.elem_type), dims)


class ShapeInference:
    """Incremental: ``run(graph)`` types the outputs of nodes not yet typed."""

    def __init__(self, opsets: dict[str, int]):
        self.opsets = opsets
        self.types: dict[str, onnx.TypeProto] = {}
        self.constants: dict[str, onnx.TensorProto] = {}
        self._done = 0

    def add_value(self, name: str, type_proto: onnx.TypeProto, constant: onnx.TensorProto = None):
        self.types[name] = type_proto
        if constant is not None:
            self.constants[name] = constant

    def run(self, graph: onnx.GraphProto) -> None:
        for node in graph.node[self._done:]:
            self.infer_node(node)
            self._done += 1

    def infer_node(self, node) -> None:
        domain = registry._canon(node.domain)
        missing = [i for i in node.input if i and i not in self.types]
        if missing:
            raise popart_exception(messages.INPUT_NOT_IN_GRAPH.format(
                node=node_label(node), missing=missing[0]))
        if domain == registry.ONNX_DOMAIN:
            out = self._onnx(node)
        else:
            out = self._meta(node)
        for name, type_proto in out.items():
            self.types[name] = type_proto
        if node.op_type == "Constant" and domain == registry.ONNX_DOMAIN:
            value = _constant_value(node)
            if value is not None:
                self.constants[node.output[0]] = numpy_helper.from_array(value, node.output[0])

    def _onnx(self, node):
        version = self.opsets.get("", self.opsets.get(registry.ONNX_DOMAIN, 10))
        try:
            schema = onnx.defs.get_schema(node.op_type, version, "")
        except Exception:
            raise popart_exception(messages.NO_ONNX_OPERATOR_IN_OPSET.format(
                node=node_label(node), op_type=node.op_type, version=version)) from None
        if node.op_type.startswith("Reduce") and any(a.name == "axes" and a.type == onnx.AttributeProto.INTS
                                                     and not a.ints for a in node.attribute):
            return {node.output[0]: self.types[node.input[0]]}  # PopART: empty axes reduce nothing
        if node.op_type in _META_FIRST:
            try:
                return self._meta(node)
            except popart_exception:
                pass
        clean = strip_annotations(node, schema)
        types = {k: self.types[k] for k in node.input if k}
        constants = {k: self.constants[k] for k in node.input if k in self.constants}
        opsets = [helper.make_opsetid("", version)]
        try:
            out = shape_inference.infer_node_outputs(schema, clean, types, constants, opset_imports=opsets)
        except Exception as exc:  # onnx.shape_inference.InferenceError and friends
            # PopART runs ONNX's inference non-strictly: an input type outside the op's constraints
            # (Max of int32 and float, And of floats...) still gives the output shapes.
            out = _infer_despite_types(schema, clean, types, constants, opsets)
            if out is None and node.op_type in _META_FALLBACK:
                out = self._meta(node)  # Resize with '' scales, float16 scales: PopART takes them
            if out is None:
                raise popart_exception(messages.SHAPE_INFERENCE_FAILED.format(node=node_label(node),
                                                                              exc=exc)) from None
        result = dict(out)
        if any(info_of(t) is None for t in result.values()) and registry.lookup("", node.op_type) is not None:
            # Data-dependent shapes (Reshape of a computed shape, ...): evaluate on meta tensors.
            try:
                result.update(self._meta(node))
            except popart_exception as error:
                if getattr(error, "op_refused", False):  # the op's own error (an unsupported attribute...)
                    raise
        return result

    def _meta(self, node):
        entry = registry.lookup(node.domain, node.op_type)
        if entry is None:
            raise popart_exception(messages.UNKNOWN_OPERATOR.format(
                node=node_label(node), op_type=node.op_type, domain=node.domain or registry.ONNX_DOMAIN))
        inputs = []
        for name in node.input:
            if not name:
                inputs.append(None)
                continue
            if name in self.constants:
                inputs.append(torch.from_numpy(external_data.to_array(self.constants[name]).copy()))
                continue
            info = info_of(self.types[name])
            if info is None:
                raise popart_exception(messages.INPUT_SHAPE_UNKNOWN.format(node=node_label(node), name=name))
            inputs.append(torch.empty(info.shape(), dtype=tensorinfo.torch_dtype(info.data_type()), device="meta"))
        from .ops import run_node  # late: ops import this module's helpers
        from .ops.control import free_variables
        for name in free_variables(node):  # enclosing-scope tensors of If/Loop/Scan bodies
            info = info_of(self.types[name]) if name in self.types else None
            if info is None:
                raise popart_exception(messages.BODY_READ_SHAPE_UNKNOWN.format(node=node_label(node), name=name))
            inputs.append(torch.empty(info.shape(), dtype=tensorinfo.torch_dtype(info.data_type()), device="meta"))
        version = self.opsets.get(registry._canon(node.domain), 1)
        try:
            outputs = run_node(node, inputs, version, training=False, graph=None)
        except popart_exception:
            raise
        except Exception as exc:
            raise popart_exception(messages.SHAPE_INFERENCE_FAILED.format(node=node_label(node), exc=exc)) from None
        result = {}
        for name, value in zip(node.output, outputs):
            if name and value is not None:
                result[name] = type_of(tensorinfo.popart_name(value.dtype), value.shape)
        return result


# Ops whose PopART form ONNX's inference refuses: their output shapes come from openpop's implementation.
_META_FALLBACK = ("Resize",)
# Ops whose output shape PopART computes differently from ONNX's inference: ask the implementation first
# (Resize: floor(size * scale) in float32, 10 * 0.7 -> 7, where ONNX's double arithmetic gives 6).
_META_FIRST = ("Resize", "Upsample")


def _infer_despite_types(schema, node, types: dict, constants: dict, opsets):
    """ONNX's output types and shapes for ``node`` with the inputs of each type constraint given one
    type: the first such input's if the constraint allows it, else the constraint's first allowed type
    (the outputs of that constraint then keep the first input's type). None if that does not help."""
    allowed = {c.type_param_str: list(c.allowed_type_strs) for c in schema.type_constraints}
    params = list(schema.inputs)
    targets = {}
    kept = {}  # constraint -> the first input's type, where the constraint does not allow it
    retyped = dict(types)
    for i, name in enumerate(node.input):
        if not name or name not in types or not params:
            continue
        param = params[min(i, len(params) - 1)]  # a variadic last input covers the rest
        choices = allowed.get(param.type_str)
        elem = types[name].tensor_type.elem_type
        if not choices or not elem:
            continue
        if param.type_str not in targets:
            current = f"tensor({_ONNX_TYPE_STR.get(elem, '')})"
            first = choices[0]
            if current in choices:
                targets[param.type_str] = elem
            elif first.startswith("tensor("):
                targets[param.type_str] = getattr(onnx.TensorProto, first[len("tensor("):-1].upper(), 0)
                kept[param.type_str] = elem
            else:
                return None
        target = targets[param.type_str]
        if elem != target:
            if not target:
                return None
            proto = onnx.TypeProto()
            proto.CopyFrom(types[name])
            proto.tensor_type.elem_type = target
            retyped[name] = proto
    if retyped == types:
        return None
    constants = {k: v for k, v in constants.items() if retyped[k] is types[k]}  # retyped: its data no longer fits
    try:
        out = dict(shape_inference.infer_node_outputs(schema, node, retyped, constants, opset_imports=opsets))
    except Exception:
        return None
    outputs = list(schema.outputs)
    for i, name in enumerate(node.output):
        if name in out and outputs and outputs[min(i, len(outputs) - 1)].type_str in kept:
            out[name].tensor_type.elem_type = kept[outputs[min(i, len(outputs) - 1)].type_str]
    return out


_ONNX_TYPE_STR = {onnx.TensorProto.FLOAT: "float", onnx.TensorProto.DOUBLE: "double",
                  onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.BFLOAT16: "bfloat16",
                  onnx.TensorProto.BOOL: "bool", onnx.TensorProto.STRING: "string",
                  **{getattr(onnx.TensorProto, n.upper()): n for n in
                     ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")}}


def _constant_value(node):
    for attr in node.attribute:
        if attr.name == "value":
            return numpy_helper.to_array(attr.t)
        if attr.name == "value_float":
            return np.array(attr.f, np.float32)
        if attr.name == "value_floats":
            return np.array(list(attr.floats), np.float32)
        if attr.name == "value_int":
            return np.array(attr.i, np.int64)
        if attr.name == "value_ints":
            return np.array(list(attr.ints), np.int64)
    return None
