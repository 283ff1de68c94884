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


class OperatorIdentifier:
    """``popart.OperatorIdentifier(domain, type, version)``: one version of one operator ("" is ai.onnx)."""

    def __init__(self, domain: str, type: str, version: int):
        self.domain = domain or registry.ONNX_DOMAIN
        self.type = type
        self.version = int(version)

    def _key(self):
        return (self.domain, self.type, self.version)

    def __eq__(self, other):
        return isinstance(other, OperatorIdentifier) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return f"{self.domain}.{self.type}:{self.version}"


# The ai.onnx opsets PopART's operator tables were generated for.
ONNX_OPSETS = range(6, 12)


def _onnx_versions(op_type: str, opset: int = ONNX_OPSETS[-1]) -> list[int]:
    """The versions (since_version) ONNX defines for ``op_type`` up to ``opset``."""
    import onnx.defs
    return sorted({s.since_version for s in onnx.defs.get_all_schemas_with_history()
                   if s.name == op_type and s.domain == "" and s.since_version <= opset})


def supported_operations(include_internal: bool = False) -> list:
    """``popart.getSupportedOperations``: an OperatorIdentifier for each version of each operator this
    implementation runs (ai.onnx: every version ONNX defines up to opset 11; ai.graphcore: 1)."""
    result = []
    for domain, op_type in sorted(registry.entries()):
        if domain == registry.ONNX_DOMAIN:
            result.extend(OperatorIdentifier(domain, op_type, v) for v in _onnx_versions(op_type) or [1])
        else:
            result.append(OperatorIdentifier(domain, op_type, 1))
    return result


def unsupported_operations(opset_version: int) -> list:
    """``popart.getUnsupportedOperations``: the operators of ai.onnx opset ``opset_version`` (each at
    the version that opset has) that this implementation does not run."""
    import onnx.defs
    if int(opset_version) not in ONNX_OPSETS:
        raise popart_exception(messages.UNKNOWN_OPSET.format(version=opset_version))
    supported = {op for domain, op in registry.entries() if domain == registry.ONNX_DOMAIN}
    result = []
    for name in sorted({s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain == ""}):
        versions = _onnx_versions(name, int(opset_version))
        if versions and name not in supported and not onnx.defs.get_schema(name, int(opset_version)).deprecated:
            result.append(OperatorIdentifier(registry.ONNX_DOMAIN, name, versions[-1]))
    return result
