"""Loss discovery, as PopTorch does it for training models.

Every torch loss (``F.*_loss`` and the ``nn.*Loss`` modules that call them) and every
``identity_loss`` computed in ``forward`` marks a loss. Losses that feed another loss fold away;
exactly one independent loss must remain. It is found once, on the compile pass; later calls
just read it from the same output position (or, if it is not returned as-is, keep tracking).
"""
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .. import errors
from . import context

_REDUCTIONS = {"sum": 0, "mean": 1, "none": 2}

_TORCH_LOSS_FUNCTIONS = frozenset(getattr(F, name) for name in (
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "cosine_embedding_loss", "cross_entropy",
    "ctc_loss", "gaussian_nll_loss", "hinge_embedding_loss", "huber_loss", "kl_div", "l1_loss",
    "margin_ranking_loss", "mse_loss", "multi_margin_loss", "multilabel_margin_loss",
    "multilabel_soft_margin_loss", "nll_loss", "poisson_nll_loss", "smooth_l1_loss", "soft_margin_loss",
    "triplet_margin_loss", "triplet_margin_with_distance_loss") if hasattr(F, name))


def identity_loss(x: torch.Tensor, reduction: str) -> torch.Tensor:
    """Mark ``x`` (reduced by ``"sum"``, ``"mean"`` or ``"none"``) as the model's final loss."""
    if reduction not in _REDUCTIONS:
        raise AssertionError(errors.UNSUPPORTED_REDUCTION)
    if reduction == "sum":
        loss = x.sum()
    elif reduction == "mean":
        loss = x.mean()
    else:
        loss = x.clone()
    tracker = getattr(context.current(), "loss_tracker", None)
    if tracker is not None:
        tracker.record(loss)
    return loss


class LossTracker(TorchFunctionMode):
    """Records the losses computed while active (torch loss functions and ``identity_loss``)."""

    def __init__(self):
        super().__init__()
        self.losses = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func in _TORCH_LOSS_FUNCTIONS and isinstance(result, torch.Tensor):
            self.record(result)
        return result

    def record(self, loss: torch.Tensor) -> None:
        self.losses.append(loss)

    def final_loss(self) -> torch.Tensor:
        """The one loss no other loss depends on; PopTorch's errors if there is none or several."""
        independent = _independent_losses(self.losses)
        if not independent:
            raise errors.createPoptorchError(errors.with_fix(errors.NO_LOSS, errors.NO_LOSS_FIX))
        if len(independent) > 1:
            raise errors.createPoptorchError(errors.MULTIPLE_LOSSES)
        return independent[0]


def _independent_losses(losses):
    """Drop every loss that is an autograd ancestor of another recorded loss.

    Losses computed without autograd (on detached tensors, e.g. a metric) cannot be trained and
    do not count when a differentiable loss exists."""
    if any(loss.grad_fn is not None for loss in losses):
        losses = [loss for loss in losses if loss.grad_fn is not None]
    nodes = {loss.grad_fn: loss for loss in losses if loss.grad_fn is not None}
    feeding = set()
    for loss in losses:
        if loss.grad_fn is None:
            continue
        stack = [n for n, _ in loss.grad_fn.next_functions if n is not None]
        seen = set()
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            if node in nodes:
                feeding.add(node)
            stack.extend(n for n, _ in node.next_functions if n is not None)
    unique = []
    for loss in losses:
        if loss.grad_fn is not None and loss.grad_fn in feeding:
            continue
        if any(loss is u for u in unique):
            continue
        unique.append(loss)
    return unique


def as_scalar(loss: torch.Tensor) -> torch.Tensor:
    """The scalar whose gradient is ``backward``'s gradient of ones from ``loss`` (any shape)."""
    return loss if loss.dim() == 0 else loss.sum()


def backward(loss: torch.Tensor, scale: float) -> None:
    """Back-propagate ``scale`` times a gradient of ones from ``loss`` (any shape)."""
    if scale != 1.0:
        loss = loss * scale
    if loss.dim() == 0:
        loss.backward()
    else:
        loss.backward(torch.ones_like(loss))
