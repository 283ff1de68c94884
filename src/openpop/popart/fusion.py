"""Fused ops for the interpreter: fewer Python steps and autograd nodes, PopART's numbers.

PopART rewrites its IR with patterns before lowering (``popart.Patterns``); the interpreter
does the same for the two pairs every classifier has, when the intermediate tensor is used by
nothing else (not anchored, not a gradient anchor, not read by another node or segment):

* ``MatMul(a, w) -> Add(., b)``: ``torch.addmm(b, a, w)`` for 2-D ``a``/``w`` and a bias that
  broadcasts over rows (else the two ops as before);
* ``Softmax(x) -> Nll(., labels)`` (no ``ignoreIndex``, probabilities as input): one
  ``cross_entropy`` on the logits (log-softmax + NLL, as PopART's ``NlllWithSoftmaxGradDirect``
  pattern), for 2-D ``x`` with the softmax on its last axis (else the two ops as before).

A step is ``(input names, output names, fn, ctx, attrs)`` as ``graph.Segment`` runs them; a
segment has the steps of each mode (training or not), whose contexts say which: a fused step
runs its ops with their own contexts, of the same mode, and changes nothing (torch.compile
traces it).
"""
from collections import Counter

import torch
import torch.nn.functional as F

from .enums import ReductionType

_REDUCTION = {int(ReductionType.Sum): "sum", int(ReductionType.Mean): "mean", int(ReductionType.NoReduction): "none"}


def fuse(steps: list[tuple], nodes: list, keep: set) -> tuple[list[tuple], list[int]]:
    """``steps`` (one per node of ``nodes``) with fusable pairs merged, and the index in ``nodes``
    of each remaining step (a pair's second node); ``keep``: tensors that must stay visible."""
    uses = Counter(name for step in steps for name in step[0] if name)
    producer = {}
    for k, node in enumerate(nodes):
        for out in node.output:
            producer[out] = k
    fused = {}
    dropped = set()
    for k, node in enumerate(nodes):
        if node.op_type == "Add" and node.domain in ("", "ai.onnx") and len(node.input) == 2:
            for side in (0, 1):
                j = producer.get(node.input[side])
                if j is None or j in dropped or nodes[j].op_type != "MatMul" or nodes[j].domain not in ("", "ai.onnx"):
                    continue
                middle = node.input[side]
                if middle in keep or uses[middle] != 1 or _annotations(nodes[j]) != _annotations(node):
                    continue
                a, w = nodes[j].input
                bias = node.input[1 - side]
                fused[k] = ((a, w, bias), node.output, _matmul_add(steps[j], steps[k], side), steps[k][3], {})
                dropped.add(j)
                break
        elif node.op_type == "Nll" and node.domain == "ai.graphcore":
            attrs = steps[k][4]
            j = producer.get(node.input[0])
            if j is None or j in dropped or nodes[j].op_type != "Softmax" or attrs.get("inputIsLogProbability", 0) \
                    or attrs.get("ignoreIndex") is not None:
                continue
            middle = node.input[0]
            if middle in keep or uses[middle] != 1 or _annotations(nodes[j]) != _annotations(node):
                continue
            fused[k] = ((nodes[j].input[0], node.input[1]), node.output, _softmax_nll(steps[j], steps[k]),
                        steps[k][3], {})
            dropped.add(j)
    # A fused pair runs where its second op ran: its inputs are all available there.
    kept = [k for k in range(len(steps)) if k not in dropped]
    return [fused.get(k, steps[k]) for k in kept], kept


def _annotations(node) -> list:
    """PopART's ``__`` attributes (placement, recomputation): a fused pair must agree on them."""
    return sorted((a.name, a.SerializeToString()) for a in node.attribute if a.name.startswith("__"))


def _matmul_add(matmul_step, add_step, side):
    matmul_fn, matmul_ctx, matmul_attrs = matmul_step[2], matmul_step[3], matmul_step[4]
    add_fn, add_ctx, add_attrs = add_step[2], add_step[3], add_step[4]

    def matmul_add(ctx, inputs, attrs):
        a, w, bias = inputs
        if a.dim() == 2 and w.dim() == 2 and bias.dim() <= 2 and bias.dtype == a.dtype == w.dtype and \
                (bias.dim() < 2 or bias.shape[0] == 1) and bias.shape[-1:] in ((), (1,), w.shape[1:]):
            return torch.addmm(bias, a, w)
        product = matmul_fn(matmul_ctx, [a, w], matmul_attrs)
        pair = [product, bias] if side == 0 else [bias, product]
        return add_fn(add_ctx, pair, add_attrs)
    return matmul_add


def _softmax_nll(softmax_step, nll_step):
    softmax_fn, softmax_ctx, softmax_attrs = softmax_step[2], softmax_step[3], softmax_step[4]
    nll_fn, nll_ctx, nll_attrs = nll_step[2], nll_step[3], nll_step[4]
    reduction = _REDUCTION[int(nll_attrs.get("reduction", ReductionType.Mean))]
    default_axis = -1 if softmax_ctx.opset >= 13 else 1

    def softmax_nll(ctx, inputs, attrs):
        logits, labels = inputs
        if logits.dim() == 2 and labels.dim() == 1 and softmax_attrs.get("axis", default_axis) in (1, -1):
            return F.cross_entropy(logits, labels.long(), reduction=reduction)
        probs = softmax_fn(softmax_ctx, [logits], softmax_attrs)
        return nll_fn(nll_ctx, [probs, labels], nll_attrs)
    return softmax_nll
