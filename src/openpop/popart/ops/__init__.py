"""ONNX node -> torch op table. One module per op family registers its ops in ``registry``."""
from typing import Optional

import torch
from onnx import helper

from .. import messages
from ..errors import popart_exception
from . import activations, control, elementwise, graphcore, graphcore_misc, linalg, nn, reductions, registry, rnn, shape
from .registry import OpContext, lookup


def node_attributes(node) -> dict:
    """ONNX attributes of ``node`` as Python values, PopART's ``__`` annotations left out."""
    attrs = {}
    for attr in node.attribute:
        if attr.name.startswith("__"):
            continue
        value = helper.get_attribute_value(attr)
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode() for v in value]
        attrs[attr.name] = value
    return attrs


def run_node(node, inputs: list[Optional[torch.Tensor]], opset: int, *, training: bool, graph,
             attrs: Optional[dict] = None) -> list[torch.Tensor]:
    entry = lookup(node.domain, node.op_type)
    if entry is None:
        raise popart_exception(unsupported_message(node, opset))
    ctx = OpContext(opset=opset, training=training, node_name=node.name or node.output[0], op_type=node.op_type,
                    graph=graph, node=node)
    result = entry.fn(ctx, inputs, node_attributes(node) if attrs is None else attrs)
    if isinstance(result, torch.Tensor):
        return [result]
    return list(result)


def unsupported_message(node, opset: int) -> str:
    domain = node.domain or registry.ONNX_DOMAIN
    return messages.UNSUPPORTED_OP.format(op_type=node.op_type, domain=domain, opset=opset,
                                          node_name=node.name or next(iter(node.output), ""),
                                          outputs=", ".join(node.output))


def supported_operations(include_internal: bool = False):
    """``{domain: [op types]}`` as ``popart.getSupportedOperations`` reports them."""
    table = {}
    for domain, op_type in registry.entries():
        table.setdefault(domain, []).append(op_type)
    return {domain: sorted(ops) for domain, ops in table.items()}
