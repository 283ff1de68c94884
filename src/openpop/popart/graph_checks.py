"""Checks PopART's IR makes on the model when a session is built, with its errors: a main graph with
nothing left to compute once what no anchor (or loss) needs is pruned, and manual recomputation
annotations together with automatic recomputation."""
from . import messages
from .builder import RECOMPUTE_ATTR
from .enums import RecomputationType, RecomputeType
from .errors import popart_exception

# Ops PopART's pruner keeps for their side effects.
_SIDE_EFFECTS = {"PrintTensor", "Abort", "CopyVarUpdate"}


def check(program, options, *, training: bool, anchors, loss) -> None:
    needed = set(anchors) | ({loss} if loss else set())
    kept = 0
    for node, inputs, outputs in reversed(list(zip(program.nodes, program.node_inputs, program.node_outputs))):
        if node.op_type in _SIDE_EFFECTS or any(o in needed for o in outputs):
            kept += 1
            needed.update(inputs)
    if kept == 0:
        raise popart_exception(messages.ALL_OPS_PRUNED)
    if training and RecomputationType(int(options.autoRecomputation)) != RecomputationType.NoRecompute \
            and int(options.executionPhaseSettings.phases) < 2:
        for node in program.nodes:
            for attr in node.attribute:
                if attr.name == RECOMPUTE_ATTR and attr.i == int(RecomputeType.Recompute):
                    raise popart_exception(messages.AUTO_AND_MANUAL_RECOMPUTATION)
