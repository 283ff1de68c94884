"""ONNX control flow: ``If``, ``Loop``, ``Scan`` (opset 9+ semantics), run eagerly by torch.

The body graphs (node attributes) may read tensors of the enclosing graphs by name (ONNX's
outer-scope rule; PopART's ``addInputTensorFromParentGraph``). The interpreter hands such tensors
to the node after its own inputs, in the order of ``free_variables(node)``, so autograd sees them:
gradients flow into weights used inside a branch or a loop body.

* ``If``: the branch chosen by the (one-element) condition runs; only it is differentiated.
* ``Loop(M, cond, v...)``: ``body(i, cond, v...) -> (cond, v..., scan...)`` while ``i < M`` (if
  given) and ``cond`` (if given); outputs the final ``v...`` and the per-iteration ``scan...``
  stacked on a new first axis.
* ``Scan(state..., x...)``: ``body(state..., x_t...) -> (state..., y_t...)`` over axis
  ``scan_input_axes`` of each ``x`` (reversed where ``scan_input_directions`` is 1); outputs the
  final states and the ``y_t`` stacked on ``scan_output_axes`` (reversed where
  ``scan_output_directions`` is 1).
"""

import onnx
import torch
from onnx import numpy_helper

from .. import messages
from ..errors import popart_exception
from .registry import register

_FREE: dict[int, list[str]] = {}


def _graphs(node) -> list[onnx.GraphProto]:
    found = []
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            found.append(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            found.extend(attr.graphs)
    return found


def _graph_free(graph: onnx.GraphProto) -> list[str]:
    defined = {v.name for v in graph.input} | {i.name for i in graph.initializer}
    free = []
    for node in graph.node:
        for name in list(node.input) + free_variables(node):
            if name and name not in defined and name not in free:
                free.append(name)
        defined.update(node.output)
    for value in graph.output:
        if value.name not in defined and value.name not in free:
            free.append(value.name)
    return free


def free_variables(node) -> list[str]:
    """Tensors of enclosing graphs that ``node``'s body graphs read, in a fixed order."""
    if not _graphs(node):
        return []
    key = id(node)
    cached = _FREE.get(key)
    if cached is not None and cached[0] is node:
        return cached[1]
    free = []
    for graph in _graphs(node):
        for name in _graph_free(graph):
            if name not in free:
                free.append(name)
    _FREE[key] = (node, free)
    return free


def run_graph(ctx, graph: onnx.GraphProto, inputs: list[torch.Tensor], outer: dict[str, torch.Tensor]):
    """The outputs of ``graph`` on ``inputs``, reading ``outer`` for enclosing-scope tensors."""
    from . import lookup, run_node, unsupported_message
    env = dict(outer)
    env.update((i.name, torch.from_numpy(numpy_helper.to_array(i).copy())) for i in graph.initializer)
    initializers = {i.name for i in graph.initializer}
    names = [v.name for v in graph.input if v.name not in initializers]
    if len(names) != len(inputs):
        raise popart_exception(messages.BODY_INPUT_COUNT.format(
            op_type=ctx.op_type, node_name=ctx.node_name, name=graph.name, n_names=len(names), n_inputs=len(inputs)))
    env.update(zip(names, inputs))
    opsets = getattr(ctx.graph, "opsets", None) or {"ai.onnx": ctx.opset, "ai.graphcore": 1}
    for node in graph.node:
        domain = "ai.onnx" if node.domain in ("", "ai.onnx") else node.domain
        opset = opsets.get(domain, 1)
        if lookup(node.domain, node.op_type) is None:
            raise popart_exception(unsupported_message(node, opset))
        values = [env[n] if n else None for n in node.input] + [env[n] for n in free_variables(node)]
        outputs = run_node(node, values, opset, training=ctx.training, graph=ctx.graph)
        env.update((n, v) for n, v in zip(node.output, outputs) if n)
    return [env[v.name] for v in graph.output]


def _split(ctx, inputs):
    explicit = len(ctx.node.input)
    return inputs[:explicit], dict(zip(free_variables(ctx.node), inputs[explicit:]))


def _truth(value: torch.Tensor) -> bool:
    if value.device.type == "meta":
        return True  # shape inference: the branches have the same output types
    return bool(value.reshape(-1)[0])


@register("If", non_differentiable_inputs=(0,))
def if_(ctx, inputs, attrs):
    (cond,), outer = _split(ctx, inputs)
    branch = attrs["then_branch"] if _truth(cond) else attrs["else_branch"]
    return run_graph(ctx, branch, [], outer)


@register("Loop", non_differentiable_inputs=(0, 1))
def loop(ctx, inputs, attrs):
    explicit, outer = _split(ctx, inputs)
    trip, cond, carried = explicit[0], explicit[1], list(explicit[2:])
    body = attrs["body"]
    # Shape inference (meta tensors) with an unknown trip count or condition: one iteration.
    meta = any(t is not None and t.device.type == "meta" for t in (trip, cond))
    limit = None if trip is None or trip.device.type == "meta" else int(trip.reshape(-1)[0])
    keep_going = True if cond is None else _truth(cond)
    scans: list[list[torch.Tensor]] = []
    i = 0
    while keep_going and (limit is None or i < limit):
        out = run_graph(ctx, body, [torch.tensor(i, dtype=torch.int64), torch.tensor(True)] + carried, outer)
        carried = out[1:1 + len(carried)]
        scans.append(out[1 + len(carried):])
        i += 1
        keep_going = not meta and _truth(out[0])
        if limit is None and i >= 1_000_000:
            raise popart_exception(messages.LOOP_DOES_NOT_END.format(node_name=ctx.node_name))
    n_scan = len(body.output) - 1 - len(carried)
    if not scans:
        if n_scan:
            raise popart_exception(messages.LOOP_RAN_NO_ITERATION.format(node_name=ctx.node_name))
        return carried
    return carried + [torch.stack([s[k] for s in scans]) for k in range(n_scan)]


@register("Scan", positional=("num_scan_inputs",), since=9)
def scan(ctx, inputs, attrs):
    if ctx.opset < 9:
        raise popart_exception(messages.SCAN_BEFORE_OPSET_9.format(node_name=ctx.node_name, opset=ctx.opset))
    explicit, outer = _split(ctx, inputs)
    body = attrs["body"]
    n_in = int(attrs["num_scan_inputs"])
    states, xs = list(explicit[:len(explicit) - n_in]), explicit[len(explicit) - n_in:]
    in_axes = list(attrs.get("scan_input_axes", [0] * n_in))
    in_dirs = list(attrs.get("scan_input_directions", [0] * n_in))
    n_out = len(body.output) - len(states)
    out_axes = list(attrs.get("scan_output_axes", [0] * n_out))
    out_dirs = list(attrs.get("scan_output_directions", [0] * n_out))
    xs = [x.movedim(axis % x.dim(), 0) for x, axis in zip(xs, in_axes)]
    xs = [x.flip(0) if d else x for x, d in zip(xs, in_dirs)]
    steps = xs[0].shape[0]
    if any(x.shape[0] != steps for x in xs):
        raise popart_exception(messages.SCAN_LENGTHS_DIFFER.format(
            node_name=ctx.node_name, xs=[x.shape[0] for x in xs]))
    ys: list[list[torch.Tensor]] = [[] for _ in range(n_out)]
    for t in range(steps):
        out = run_graph(ctx, body, states + [x[t] for x in xs], outer)
        states = out[:len(states)]
        for k, y in enumerate(out[len(states):]):
            ys[k].append(y)
    results = []
    for k in range(n_out):
        stacked = torch.stack(ys[k]) if ys[k] else torch.empty(0)
        if out_dirs[k]:
            stacked = stacked.flip(0)
        results.append(stacked.movedim(0, out_axes[k] % stacked.dim()))
    return states + results
