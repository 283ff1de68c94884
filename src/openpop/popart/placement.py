"""Virtual graphs and pipeline stages -> segments of the graph, with PopART's rules and texts.

* ``VirtualGraphMode.Off``: one segment, no blocks.
* ``Manual``: the ``__ipu_number`` of every node; a node without one takes the highest virtual
  graph of the nodes producing its inputs (else the next annotated node's) — PopART infers
  virtual graphs for such ops the same way for constants and reshapes of annotated tensors.
* ``Auto``: nodes split into contiguous parts, in topological order, in proportion to
  ``virtualGraphSplitRatios`` (or evenly) over the IPUs of one replica.
* Pipelining: stages from ``__pipeline_stage`` (or, when no node has one, the virtual graph id);
  consecutive stages on the same IPU merge (as PopART's ``mergeConsecutivePipelineStages``).
  Without pipelining, each maximal run of nodes on one virtual graph is a segment (sharding).
"""
from dataclasses import dataclass
from typing import Optional

from onnx import helper

from . import messages
from .builder import EXECUTION_PHASE_ATTR, PIPELINE_STAGE_ATTR, RECOMPUTE_ATTR, VIRTUAL_GRAPH_ATTR
from .enums import RecomputeType, VirtualGraphMode
from .errors import popart_exception

PIPELINE_NEEDS_VGRAPHS = "Pipelining requires the 'virtualGraphMode' session option to not be VirtualGraphMode::Off."
PIPELINE_NEEDS_IPUS = "Pipelining requires more than 1 IPU (currently {n}) based on the virtual graph ids of the ops."
STAGE_VGRAPH_MISMATCH = ("Ops {ops} have the same pipeline stage {stage}, but different virtual graph ids {ids}. "
                         "All ops with the same pipeline stage must also have the same virtual graph id")
DEPTH_ACCL = ("For pipelining, depth (gradient accumulation factor) must equal at least the number of pipeline "
              "stages ({stages})")
DEPTH_BPS = "For pipelining, depth (batchesPerStep) must equal at least the number of pipeline stages ({stages})"
STAGE_ORDER = ("Op '{op}' in pipeline stage {stage} consumes tensor '{tensor}' from pipeline stage {source}: a "
               "pipeline stage can only consume tensors of the same or earlier stages")
RECOMPUTE_ANNOTATION = ("When pipelining is enabled, user annotation for recomputation is not allowed "
                        "(op '{op}'); use autoRecomputation instead")


@dataclass
class PlannedSegment:
    nodes: list[int]
    ipu: Optional[int]    # virtual graph (None: no placement)
    stage: Optional[int]  # pipeline stage (None: not pipelined)


@dataclass
class Placement:
    segments: list[PlannedSegment]
    pipelined: bool
    ipus_per_replica: int
    pipeline_stages: int  # forward stages after merging


def _attr(node, name):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return None


def _fill(nodes, values, producer_index):
    """Give unannotated nodes the highest value of their producers, else the next annotated one's."""
    filled = list(values)
    for i, node in enumerate(nodes):
        if filled[i] is None:
            sources = [filled[producer_index[t]] for t in node.input if t in producer_index
                       and filled[producer_index[t]] is not None]
            if sources:
                filled[i] = max(sources)
    following = None
    for i in range(len(nodes) - 1, -1, -1):
        if filled[i] is None:
            filled[i] = following
        else:
            following = filled[i]
    return [0 if v is None else v for v in filled]


def plan(program, options, *, training: bool, batches_per_step: int, accumulation: int,
         ipus_available: Optional[int]) -> Placement:
    nodes = program.nodes
    mode = VirtualGraphMode(int(options.virtualGraphMode))
    pipelining = bool(options.enablePipelining)
    if pipelining and mode == VirtualGraphMode.Off:
        raise popart_exception(PIPELINE_NEEDS_VGRAPHS)
    if not nodes or mode == VirtualGraphMode.Off:
        return Placement([PlannedSegment(list(range(len(nodes))), None, None)], False, 1, 1)
    producer_index = {out: i for i, node in enumerate(nodes) for out in node.output if out}
    if mode == VirtualGraphMode.Auto:
        ipus = _auto_ipus(options, ipus_available)
        vgraph = _auto_split(program, ipus, options.virtualGraphSplitRatios)
    elif mode == VirtualGraphMode.ExecutionPhases:
        phases = [_attr(n, EXECUTION_PHASE_ATTR) for n in nodes]
        phases = _fill(nodes, phases, producer_index)
        vgraph = [p % 2 for p in phases]  # PopART's two-IPU phase layout: even phases on IPU 0
    else:
        vgraph = _fill(nodes, [_attr(n, VIRTUAL_GRAPH_ATTR) for n in nodes], producer_index)
    ipus_per_replica = max(vgraph) + 1
    if not pipelining:
        segments = []
        for i, ipu in enumerate(vgraph):
            if segments and segments[-1].ipu == ipu:
                segments[-1].nodes.append(i)
            else:
                segments.append(PlannedSegment([i], ipu, None))
        return Placement(segments, False, ipus_per_replica, len(segments))

    for node in nodes:
        if _attr(node, RECOMPUTE_ATTR) == int(RecomputeType.Recompute):
            raise popart_exception(RECOMPUTE_ANNOTATION.format(op=node.name or node.output[0]))
    raw_stages = [_attr(n, PIPELINE_STAGE_ATTR) for n in nodes]
    if all(s is None for s in raw_stages):
        stages = list(vgraph)
    else:
        stages = _fill(nodes, raw_stages, producer_index)
    by_stage = {}
    for i, stage in enumerate(stages):
        by_stage.setdefault(stage, []).append(i)
    for stage, members in sorted(by_stage.items()):
        ids = sorted({vgraph[i] for i in members})
        if len(ids) > 1:
            ops = [nodes[i].name or nodes[i].output[0] for i in members]
            raise popart_exception(STAGE_VGRAPH_MISMATCH.format(ops=ops, stage=stage, ids=ids))
    for i, node in enumerate(nodes):
        for tensor in node.input:
            j = producer_index.get(tensor)
            if j is not None and stages[j] > stages[i]:
                raise popart_exception(STAGE_ORDER.format(op=node.name or node.output[0], stage=stages[i],
                                                          tensor=tensor, source=stages[j]))
    if len({vgraph[i] for i in range(len(nodes))}) < 2:
        raise popart_exception(PIPELINE_NEEDS_IPUS.format(n=ipus_per_replica))
    segments: list[PlannedSegment] = []
    for stage in sorted(by_stage):
        ipu = vgraph[by_stage[stage][0]]
        if segments and segments[-1].ipu == ipu:  # consecutive stages on one IPU merge
            segments[-1].nodes.extend(by_stage[stage])
            segments[-1].nodes.sort()
        else:
            segments.append(PlannedSegment(list(by_stage[stage]), ipu, len(segments)))
    forward_stages = len(segments)
    total = 2 * forward_stages - 1 if training else forward_stages
    if accumulation > 1 or (training and options.enableGradientAccumulation):
        if accumulation < total:
            raise popart_exception(DEPTH_ACCL.format(stages=total))
    elif batches_per_step < total:
        raise popart_exception(DEPTH_BPS.format(stages=total))
    return Placement(segments, True, ipus_per_replica, forward_stages)


def _auto_ipus(options, ipus_available) -> int:
    ratios = list(options.virtualGraphSplitRatios or [])
    if ratios:
        return len(ratios)
    replicas = options.local_replicas()
    if ipus_available is None:
        return 1
    return max(1, ipus_available // replicas)


def _auto_split(program, ipus: int, ratios) -> list[int]:
    nodes = program.nodes
    ratios = list(ratios) if ratios else [1.0] * ipus
    if len(ratios) != ipus:
        raise popart_exception(messages.SPLIT_RATIOS_COUNT_MISMATCH.format(
            n_ratios=len(ratios), ipus=ipus))
    total = float(sum(ratios))
    bounds, acc = [], 0.0
    for r in ratios:
        acc += r / total
        bounds.append(acc * len(nodes))
    vgraph = []
    ipu = 0
    for i in range(len(nodes)):
        while ipu < ipus - 1 and i >= bounds[ipu]:
            ipu += 1
        vgraph.append(ipu)
    return vgraph
