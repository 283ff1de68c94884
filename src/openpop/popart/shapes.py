"""Shapes and data types of a graph's tensors: ONNX shape inference for ai.onnx nodes, the torch
implementation on meta tensors for ai.graphcore nodes (ONNX knows nothing of them). Errors
name the node, as PopART's do."""
from typing import Optional

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper, shape_inference

from . import messages, tensorinfo
from .errors import popart_exception
from .ops import registry

ANNOTATION_PREFIX = "__"


def node_label(node) -> str:
    outs = ", ".join(node.output)
    return f"{node.op_type} node '{node.name or outs}' (outputs: {outs})"


def strip_annotations(node):
    """``node`` without PopART's ``__`` annotation attributes (ONNX's schemas do not know them)."""
    if not any(a.name.startswith(ANNOTATION_PREFIX) for a in node.attribute):
        return node
    clean = onnx.NodeProto()
    clean.CopyFrom(node)
    del clean.attribute[:]
    clean.attribute.extend(a for a in node.attribute if not a.name.startswith(ANNOTATION_PREFIX))
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
        clean = strip_annotations(node)
        try:
            out = shape_inference.infer_node_outputs(
                schema, clean, {k: self.types[k] for k in node.input if k},
                {k: self.constants[k] for k in node.input if k in self.constants},
                opset_imports=[helper.make_opsetid("", version)])
        except Exception as exc:  # onnx.shape_inference.InferenceError and friends
            raise popart_exception(messages.SHAPE_INFERENCE_FAILED.format(node=node_label(node), exc=exc)) from None
        result = dict(out)
        if any(info_of(t) is None for t in result.values()) and registry.lookup("", node.op_type) is not None:
            # Data-dependent shapes (Reshape of a computed shape, ...): evaluate on meta tensors.
            try:
                result.update(self._meta(node))
            except popart_exception:
                pass
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
                inputs.append(torch.from_numpy(numpy_helper.to_array(self.constants[name]).copy()))
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
