"""PyTorch implementations of the PopART custom ops Graphcore's public applications call.

Each reads as its application calls it (inputs, attributes, outputs) and computes what the
op's C++ source computes; IPU-only details (tile layouts, grain sizes, gather strategies) are
accepted and have no effect.

=============================  ===============================================================
``ai.graphcore::RemapCE``      tensor re-layout for the IPU's tiles: a copy (GPT-2, Swin, MAE,
                               Conformer); gradient: identity
``ai.graphcore::CopyTensor``   a copy (YOLOv4); gradient: identity
``ai.graphcore::Ctc``          PopART's CTC loss (Conformer): the loss and its gradient
``ai.graphcore::Nms``          multi-class non-maximum suppression (YOLOv4 inference)
``com.acme::ExpMovAvg``        exponential moving average of a weight, in place (DINO's teacher)
``custom.ops::LeakyRelu``      the custom-op tutorial's leaky ReLU
=============================  ===============================================================
"""
import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from ..runtime import context
from . import messages
from .registry import register_custom_op

# --- layout-only ops ------------------------------------------------------------------

@register_custom_op("RemapCE", "ai.graphcore")
def remap_ce(x: torch.Tensor, **tile_layout) -> torch.Tensor:
    """A copy of ``x`` (on IPUs: re-mapped over the tiles; ``grain_size``, ``fwd_*``/``bwd_*``
    layout attributes and ``debug_str`` only steer that)."""
    return x.clone()


@register_custom_op("CopyTensor", "ai.graphcore")
def copy_tensor(x: torch.Tensor) -> torch.Tensor:
    """A copy of ``x``; its gradient is the output's gradient (PopART's IdentityGrad)."""
    return x.clone()


@register_custom_op("LeakyRelu", "custom.ops")
def leaky_relu(x: torch.Tensor, alpha: float = 0.01) -> torch.Tensor:
    """``alpha * x`` where ``x < 0``, else ``x`` (the tutorial's op; its default ``alpha``)."""
    return torch.where(x < 0, alpha * x, x)


# --- Ctc ------------------------------------------------------------------------------

_ONNX_FLOAT_TYPES = {1: torch.float32, 10: torch.float16, "FLOAT": torch.float32, "FLOAT16": torch.float16}


class _CtcLoss(torch.autograd.Function):
    """PopART's Ctc: the per-sample losses and their gradient with respect to ``log_probs``
    computed together in the forward pass; the backward pass scales that gradient by the
    reduction's."""

    @staticmethod
    def forward(ctx, log_probs, targets, input_lengths, target_lengths, blank, reduction, out_dtype):
        with torch.enable_grad():
            probs = log_probs.detach().float().requires_grad_()  # (torch's CPU CTC is float32-only)
            losses = F.ctc_loss(probs, targets.long(), input_lengths.long(), target_lengths.long(),
                                blank=blank, reduction="none")
            (gradient,) = torch.autograd.grad(losses.sum(), probs)
        if reduction == "Mean":  # PopART: each loss over its target length (at least 1), then the mean
            scale = 1.0 / (target_lengths.clamp(min=1).to(losses.dtype) * losses.numel())
        else:
            scale = torch.ones_like(losses)
        loss = losses if reduction == "None" else (losses * scale).sum()
        ctx.save_for_backward(gradient, scale)
        ctx.input_dtype = log_probs.dtype
        ctx.reduced = reduction != "None"
        gradient_out = gradient.to(out_dtype)
        ctx.mark_non_differentiable(gradient_out)
        return loss.to(out_dtype), gradient_out

    @staticmethod
    def backward(ctx, loss_gradient, _):
        gradient, scale = ctx.saved_tensors
        per_sample = scale * loss_gradient.float()  # [N]; a reduced loss's scalar gradient broadcasts
        grad = gradient * per_sample.reshape(1, -1, 1)
        return grad.to(ctx.input_dtype), None, None, None, None, None, None


@register_custom_op("Ctc", "ai.graphcore")
def ctc(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: torch.Tensor,
        target_lengths: torch.Tensor, reduction: str = "Mean", blank: int = 0,
        outDataType="UNDEFINED", enableReducedClassesInLabel=False):
    """PopART's CTC loss (``ai.graphcore::Ctc``), by ``torch.nn.functional.ctc_loss``.

    ``log_probs`` is ``[T, N, C]``, ``targets`` ``[N, S]`` (padded), the lengths ``[N]``.
    Outputs: the loss (``reduction`` "Sum", "Mean" - each sample's loss over its target length,
    then the batch mean, as torch's "mean" - or "None": ``[N]``), and, as a second output
    without gradient, the gradient of the per-sample losses with respect to ``log_probs``
    (``[T, N, C]``). ``outDataType`` ("FLOAT", "FLOAT16" or their ONNX codes) sets the outputs'
    dtype, anything else keeps ``log_probs``'s (``custom_op`` then casts to its examples');
    ``enableReducedClassesInLabel`` only tunes the IPU kernel.
    """
    if reduction not in ("Sum", "Mean", "None"):
        raise ValueError(messages.REDUCTION.format(value=reduction))
    if log_probs.dim() != 3:
        raise ValueError(messages.CTC_LOG_PROBS_SHAPE.format(shape=list(log_probs.shape)))
    out_dtype = _ONNX_FLOAT_TYPES.get(outDataType, log_probs.dtype)
    loss, gradient = _CtcLoss.apply(log_probs, targets, input_lengths, target_lengths, int(blank), reduction,
                                    out_dtype)
    return [loss, gradient]


# --- Nms ------------------------------------------------------------------------------

@register_custom_op("Nms", "ai.graphcore")
def nms(scores: torch.Tensor, boxes: torch.Tensor, threshold: float = 0.5,
        scoreThreshold: float = -torch.finfo(torch.float32).max, numDetections: int = 100,
        sigma: float = 0.0, useGather: int = 0):
    """Multi-class non-maximum suppression (``ai.graphcore::Nms``, as YOLOv4 calls it).

    ``scores`` is ``[B, N, C]`` (each box's score per class), ``boxes`` ``[B, N, 4]`` as
    ``(x1, y1, x2, y2)``. Per image, up to ``numDetections`` times: the best remaining
    (box, class) pair is kept if its score is above ``scoreThreshold`` (else the image is done),
    then every box of that class whose intersection over union with it is above ``threshold``
    is suppressed (``sigma`` > 0: soft NMS, scores scaled by ``exp(-iou**2 / sigma)``).

    Returns ``[indices (int32, -1 past the end), scores (0), boxes (0), classes (int32,
    INT32_MAX), number of detections (int32, [B])]``, each ``[B, numDetections, ...]``.
    Each image stops on its own (the IPU kernel stopped every image of the batch at the
    first image's last detection); ties go to the lower box, then class, index.
    """
    if scores.dim() != 3 or boxes.dim() != 3 or boxes.shape[:2] != scores.shape[:2] or boxes.shape[2] != 4:
        raise ValueError(messages.NMS_SHAPES.format(scores=list(scores.shape), boxes=list(boxes.shape)))
    if isinstance(numDetections, bool) or not isinstance(numDetections, int) or numDetections < 1:
        raise ValueError(messages.NMS_DETECTIONS.format(value=numDetections))
    batch, count, classes = scores.shape
    detections = numDetections
    device = scores.device
    with torch.no_grad():
        work = scores.detach().float().reshape(batch, count * classes).clone()
        corners = boxes.detach().float()
        areas = (corners[..., 2] - corners[..., 0]) * (corners[..., 3] - corners[..., 1])  # [B, N]
        gone = torch.finfo(torch.float32).min
        rows = torch.arange(batch, device=device)
        top_indices = torch.full((batch, detections), -1, dtype=torch.int32, device=device)
        top_scores = torch.zeros((batch, detections), dtype=scores.dtype, device=device)
        top_boxes = torch.zeros((batch, detections, 4), dtype=boxes.dtype, device=device)
        top_classes = torch.full((batch, detections), torch.iinfo(torch.int32).max, dtype=torch.int32,
                                 device=device)
        lengths = torch.full((batch,), detections, dtype=torch.int32, device=device)
        alive = torch.ones(batch, dtype=torch.bool, device=device)
        for step in range(detections):
            best_score, best = work.max(dim=1)  # the first maximum: lowest box, then class
            keep = alive & (best_score > scoreThreshold)
            lengths = torch.where(alive & ~keep, torch.full_like(lengths, step), lengths)
            alive = keep
            if not bool(alive.any()):
                break
            box, cls = best // classes, best % classes
            best_box = corners[rows, box]  # [B, 4]
            top_indices[:, step] = torch.where(keep, box, -1).to(torch.int32)
            top_scores[:, step] = torch.where(keep, best_score, 0.0).to(scores.dtype)
            top_boxes[:, step] = torch.where(keep[:, None], best_box, 0.0).to(boxes.dtype)
            top_classes[:, step] = torch.where(keep, cls, torch.iinfo(torch.int32).max).to(torch.int32)
            work[rows, best] = gone
            # the chosen class's score of every box, against the chosen box
            column = cls[:, None] + classes * torch.arange(count, device=device)[None, :]  # [B, N]
            class_scores = work.gather(1, column)
            width = (torch.minimum(corners[..., 2], best_box[:, None, 2])
                     - torch.maximum(corners[..., 0], best_box[:, None, 0])).clamp(min=0)
            height = (torch.minimum(corners[..., 3], best_box[:, None, 3])
                      - torch.maximum(corners[..., 1], best_box[:, None, 1])).clamp(min=0)
            inter = width * height
            iou = inter / (areas + areas[rows, box][:, None] - inter)
            live = keep[:, None] & (class_scores > scoreThreshold)
            if sigma == 0.0:
                updated = torch.where(live & (iou > threshold), gone, class_scores)
            else:
                updated = torch.where(live, class_scores * torch.exp(-(iou * iou) / sigma), class_scores)
            work.scatter_(1, column, updated)
    return [top_indices, top_scores, top_boxes, top_classes, lengths]


# --- ExpMovAvg ------------------------------------------------------------------------

_averaged_at_step = WeakIdKeyDictionary()  # average tensor -> the executor step that last updated it


@register_custom_op("ExpMovAvg", "com.acme", eager_only=True)
def exp_mov_avg(weight: torch.Tensor, average: torch.Tensor, factor) -> torch.Tensor:
    """DINO's teacher update: ``average = factor * average + (1 - factor) * weight``, in place
    (PopART's MovingAverage accumulation); returns ``average``.

    PopART ran it once per optimizer step, after the gradient-accumulation loop, with the
    weights the step's forward passes saw. In an executor it runs at the step's first
    micro-batch (same weights: the optimizer has not stepped yet) and once per step however
    many micro-batches and replicas call it; nothing changes during the compile trace. A plain
    PyTorch call updates every time. ``factor``: a number or a tensor (its first element: DINO
    passes one factor per sample).
    """
    ctx = context.current()
    if ctx is not None:
        if ctx.tracing:
            return average.detach()
        step = context.step_number()
        if _averaged_at_step.get(average) == step:
            return average.detach()
        _averaged_at_step[average] = step
    with torch.no_grad():
        if isinstance(factor, torch.Tensor):
            factor = factor.detach().reshape(-1)[0].to(device=average.device, dtype=torch.float32)
        average.mul_(factor).add_(weight.detach().to(average.dtype) * (1 - factor))
    return average.detach()
