"""Recomputation outside pipelining: which nodes re-run in backward, and running them so.

Each node of a segment gets a *region*: ``None`` (its outputs are kept for backward as usual)
or a region number; consecutive nodes of one region run under ``torch.utils.checkpoint``, so
autograd keeps only the region's inputs and re-runs its nodes during backward (random ops draw
the same numbers again: checkpoint restores the generator state).

* user annotations win: ``recomputeOutputInBackwardPass(id, Recompute)`` puts a node in a
  region (consecutive annotated nodes share one), ``Checkpoint`` (``checkpointOutput``) keeps it;
* ``autoRecomputation``: ``RecomputeAll`` recomputes every other node (one region per run of
  non-checkpoint nodes); ``Standard`` cuts the segment into about ``sqrt(n)`` consecutive
  regions whose boundaries are what is kept (the classic sqrt(n) checkpointing); ``NormOnly``
  recomputes each normalisation node on its own; ``NoRecompute`` and ``Pipeline`` (pipelined
  models, recomputed by the runtime's schedule instead) nothing.

While a region re-runs, ``RunState.recomputing`` is set, so stateful ops (BatchNorm's running
statistics) do not update twice.
"""
import contextlib
import math
from typing import Optional

import torch
import torch.utils.checkpoint
from onnx import helper

from .builder import RECOMPUTE_ATTR
from .enums import RecomputationType, RecomputeType

NORMS = {"BatchNormalization", "GroupNormalization", "LayerNormalization", "InstanceNormalization",
         "LpNormalization", "LRN"}


def _annotation(node) -> int:
    for a in node.attribute:
        if a.name == RECOMPUTE_ATTR:
            return int(helper.get_attribute_value(a))
    return int(RecomputeType.Undefined)


def regions(nodes: list, mode: RecomputationType) -> list[Optional[int]]:
    """The region of each node (``None``: not recomputed), in order."""
    n = len(nodes)
    chunk = max(1, math.ceil(n / math.ceil(math.sqrt(n)))) if n else 1
    result: list[Optional[int]] = []
    for i, node in enumerate(nodes):
        mark = _annotation(node)
        if mark == RecomputeType.Checkpoint:
            region = None
        elif mark == RecomputeType.Recompute or mode == RecomputationType.RecomputeAll:
            region = -1  # one region per run of such nodes, numbered below
        elif mode == RecomputationType.Standard:
            region = i // chunk
        elif mode == RecomputationType.NormOnly and node.op_type in NORMS:
            region = -2 - i  # alone
        else:
            region = None
        result.append(region)
    numbered, last, counter = [], object(), 0
    for region in result:
        if region is None:
            numbered.append(None)
        else:
            if region != last:
                counter += 1
            numbered.append(counter)
        last = region
    return numbered


def run_checkpointed(state, function, inputs):
    """``function(*inputs)`` with its activations recomputed in backward."""
    def contexts():
        return contextlib.nullcontext(), _recomputing(state)
    return torch.utils.checkpoint.checkpoint(function, *inputs, use_reentrant=False, context_fn=contexts)


@contextlib.contextmanager
def _recomputing(state):
    previous = state.recomputing
    state.recomputing = True
    try:
        yield
    finally:
        state.recomputing = previous
