"""PopART's own ops (ai.graphcore): losses with ``reduction`` (Sum=0, Mean=1, NoReduction=2),
collectives, subgraph calls, printing."""
import torch

from .. import messages
from ..enums import ReductionType
from ..errors import popart_exception
from .common import fail, int_index
from .registry import GRAPHCORE_DOMAIN, register


def _info(t) -> str:
    """A tensor as PopART prints its TensorInfo: ``INT32   [2 5]``."""
    from ..tensorinfo import popart_name
    return f"{popart_name(t.dtype):<8}[{' '.join(map(str, t.shape))}]"


def _reduce(ctx, x, attrs, count=None):
    reduction = ReductionType(int(attrs.get("reduction", ReductionType.Mean)))
    if reduction == ReductionType.Sum:
        return x.sum()
    if reduction == ReductionType.Mean:
        return x.sum() / (count if count is not None else x.numel())
    return x


@register("IdentityLoss", GRAPHCORE_DOMAIN, positional=("reduction",))
def identity_loss(ctx, inputs, attrs):
    return _reduce(ctx, inputs[0], attrs)


@register("L1", GRAPHCORE_DOMAIN, positional=("lambda", "reduction"), method="l1loss")
def l1_loss(ctx, inputs, attrs):
    """``lambda * |x|``; Mean divides by the number of elements."""
    return _reduce(ctx, float(attrs.get("lambda", 1.0)) * inputs[0].abs(), attrs)


@register("Nll", GRAPHCORE_DOMAIN, positional=("reduction", "ignoreIndex", "inputIsLogProbability"),
          non_differentiable_inputs=(1,), method="nllloss")
def nll_loss(ctx, inputs, attrs):
    """Negative log-likelihood of ``probs`` [N, C] (or [N, C, d...] / [N, d..., C] as PopART: classes
    on the last axis) at ``labels``. With ``ignoreIndex``, Mean divides by the count of
    non-ignored labels."""
    probs, labels = inputs
    if list(labels.shape) != list(probs.shape[:-1]):
        raise popart_exception(messages.NLL_LABEL_SHAPE.format(
            labels=_info(labels), expected=" ".join(map(str, probs.shape[:-1])), probs=_info(probs)))
    labels = int_index(labels)
    flat = probs.reshape(-1, probs.shape[-1])
    flat_labels = labels.reshape(-1)
    ignore = attrs.get("ignoreIndex")
    if ignore is None:  # the common case, without the masking ops
        picked = flat.gather(1, flat_labels.unsqueeze(1)).squeeze(1)
        losses = -(picked if attrs.get("inputIsLogProbability", 0) else torch.log(picked))
        if int(attrs.get("reduction", ReductionType.Mean)) == ReductionType.NoReduction:
            return losses.reshape(labels.shape)
        return _reduce(ctx, losses, attrs)
    valid = flat_labels != int(ignore)
    safe = torch.where(valid, flat_labels, torch.zeros_like(flat_labels))
    picked = flat.gather(1, safe.unsqueeze(1)).squeeze(1)
    logp = picked if attrs.get("inputIsLogProbability", 0) else torch.log(picked)
    losses = torch.where(valid, -logp, torch.zeros_like(logp))
    reduction = ReductionType(int(attrs.get("reduction", ReductionType.Mean)))
    if reduction == ReductionType.NoReduction:
        return losses.reshape(labels.shape)
    count = valid.sum().clamp(min=1).to(losses.dtype) if ignore is not None else flat_labels.numel()
    return _reduce(ctx, losses, attrs, count)


@register("ReplicatedAllReduce", GRAPHCORE_DOMAIN, positional=("collectiveOperator", "commGroup"))
def replicated_all_reduce(ctx, inputs, attrs):
    """Inside one replica's graph the value is its own; openpop's replicas share weights, and
    their gradients are reduced by the runtime. A sum over replicas of an activation would need
    the other replicas' values at the same time, which serial local replicas do not have."""
    graph = ctx.graph
    replicas = getattr(graph, "replication_factor", 1) if graph is not None else 1
    if replicas > 1:
        fail(ctx, messages.ALLREDUCE_ACROSS_LOCAL_REPLICAS_UNSUPPORTED)
    return inputs[0]


@register("PrintTensor", GRAPHCORE_DOMAIN, positional=("print_gradient", "title"))
def print_tensor(ctx, inputs, attrs):
    x = inputs[0]
    if x.device.type != "meta":
        print(f"{attrs.get('title', ctx.node_name)}: {x.detach()}")
    return x


@register("Call", GRAPHCORE_DOMAIN, positional=("num_outputs", "callee"))
def call(ctx, inputs, attrs):
    from ..graph import run_subgraph  # the interpreter runs the callee graph
    return run_subgraph(ctx, attrs["callee"], inputs)
