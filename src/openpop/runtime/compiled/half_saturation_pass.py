"""The compiled program's float16 saturation: the clamps eager's ``SaturatingHalf`` applies, as
graph nodes (``runtime/half_saturation.py`` says why and which ops).

``SaturateHalf`` is an Inductor post-grad pass (``post_grad_custom_post_pass`` of programs whose
model computes in float16): after every node that computes float16 values it inserts
``clamp_min(-65504)`` and ``clamp_max(65504)`` and hands the clamped value to the node's users, in the graph and its
subgraphs (``while_loop`` bodies). Inductor fuses a clamp into the kernel computing its value (or
into its users', after an extern kernel such as a matrix product), so it costs no memory pass of
its own. Nodes of ops that mutate their operands are left alone (their values were clamped where
they were computed)."""
import operator
import sys

import torch

from ...torch_compat import OpOverload, get_hash_for_files
from .. import half_saturation
from .graph_pass import SourceKeyedPass

# (aten.clamp is decomposed before post-grad passes run: these two are what Inductor lowers)
_clamp_min, _clamp_max = torch.ops.aten.clamp_min.default, torch.ops.aten.clamp_max.default


class SaturateHalf(SourceKeyedPass):
    """Inductor post-grad pass: float16 results clamped to +-65504 (module docstring)."""

    def uuid(self):  # the op rules live in half_saturation.py: a change there misses the caches too
        return get_hash_for_files((__file__, sys.modules[half_saturation.__name__].__file__))

    def __call__(self, graph: torch.fx.Graph) -> None:
        root = graph.owning_module
        if root is None:
            _saturate(graph)
            return
        for module in [m for m in root.modules() if isinstance(m, torch.fx.GraphModule)]:
            if _saturate(module.graph) and module is not root:
                module.recompile()


def _computes_float16(node: torch.fx.Node) -> bool:
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.dtype != torch.float16 or not node.users:
        return False
    source = node.args[0] if node.target is operator.getitem else node  # (one result of a multi-result op)
    op = source.target
    if not isinstance(op, OpOverload) or op._schema.is_mutable:
        return False
    operands = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in source.args]
    return half_saturation.computes_values(op, operands, source.kwargs)


def _saturate(graph: torch.fx.Graph) -> bool:
    nodes = [node for node in graph.nodes if node.op == "call_function" and _computes_float16(node)]
    for node in nodes:
        with graph.inserting_after(node):
            low = graph.call_function(_clamp_min, (node, -half_saturation.FLOAT16_MAX))
        with graph.inserting_after(low):
            clamped = graph.call_function(_clamp_max, (low, half_saturation.FLOAT16_MAX))
        low.meta.update(node.meta)
        clamped.meta.update(node.meta)
        node.replace_all_uses_with(clamped, delete_user_cb=lambda user, c=low: user is not c)
    return bool(nodes)
