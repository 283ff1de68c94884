"""Special ops with real implementations: CTC beam search decoding, farthest point sampling
(``fps``) and nearest-point clustering (``nearest``), the latter two as in ``torch_cluster``."""
import math
from typing import Optional, Union

import torch

from . import errors
from .errors import createPoptorchError

__all__ = ["ctc_beam_search_decoder", "fps", "nearest"]


# --- CTC beam search --------------------------------------------------------------

def _logsumexp(a: float, b: float) -> float:
    if a == -math.inf:
        return b
    if b == -math.inf:
        return a
    high, low = max(a, b), min(a, b)
    return high + math.log1p(math.exp(low - high))


def _extend_beam(grown, prefix, blank_lp=-math.inf, label_lp=-math.inf):
    """Add the two log-probabilities to ``grown[prefix]`` (log-sum-exp with what is there)."""
    old_blank, old_label = grown.get(prefix, (-math.inf, -math.inf))
    grown[prefix] = (_logsumexp(old_blank, blank_lp), _logsumexp(old_label, label_lp))


def _prefix_beam_search(log_probs: list[list[float]], blank: int, beam_width: int):
    """CTC prefix beam search over ``log_probs[t][c]``.

    Each beam is a label prefix (repeats and blanks collapsed) with two log-probabilities:
    of the alignments so far ending in a blank, and ending in the prefix's last label.
    Returns ``[(prefix, log_probability)]``, most probable first.
    """
    beams = {(): (0.0, -math.inf)}
    for step in log_probs:
        grown = {}
        for prefix, (blank_lp, label_lp) in beams.items():
            total = _logsumexp(blank_lp, label_lp)
            last = prefix[-1] if prefix else None
            for label, lp in enumerate(step):
                if label == blank:
                    _extend_beam(grown, prefix, blank_lp=total + lp)
                elif label == last:
                    _extend_beam(grown, prefix, label_lp=label_lp + lp)  # repeated label collapses
                    _extend_beam(grown, prefix + (label,), label_lp=blank_lp + lp)  # a blank separated them
                else:
                    _extend_beam(grown, prefix + (label,), label_lp=total + lp)
        ranked = sorted(grown.items(), key=lambda item: (-_logsumexp(*item[1]), item[0]))
        beams = dict(ranked[:beam_width])
    ranked = sorted(((p, _logsumexp(*lps)) for p, lps in beams.items()),
                    key=lambda item: (-item[1], item[0]))
    return ranked


def ctc_beam_search_decoder(probs: torch.Tensor, lengths: torch.Tensor, blank: int = 0,
                            beam_width: int = 100,
                            top_paths: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decode CTC log-probabilities ``probs`` [input_length, batch, classes] by beam search.

    ``lengths`` [batch] gives the number of valid time steps of each sequence. Returns, as
    documented by PopTorch, three tensors: the paths' log-probabilities [batch, top_paths],
    the paths' lengths [batch, top_paths] and the decoded label paths
    [batch, top_paths, input_length] (zero-padded). When fewer than ``top_paths`` distinct
    paths exist, the missing ones have log-probability -inf and length 0.
    """
    if not isinstance(probs, torch.Tensor):
        raise createPoptorchError(errors.CTC_PROBS_TYPE.format(probs_type=type(probs)))
    if not isinstance(lengths, torch.Tensor):
        raise createPoptorchError(errors.CTC_LENGTHS_TYPE.format(lengths_type=type(lengths)))
    if probs.dim() != 3:
        raise createPoptorchError(errors.CTC_PROBS_SHAPE.format(shape=list(probs.shape)))
    input_length, batch_size, num_classes = probs.shape
    if lengths.shape != (batch_size,):
        raise createPoptorchError(errors.CTC_LENGTHS_SHAPE.format(batch_size=batch_size, shape=list(lengths.shape)))
    if not 0 <= blank < num_classes:
        raise createPoptorchError(errors.CTC_BLANK_INDEX.format(blank=blank, num_classes=num_classes))
    if beam_width < 1 or top_paths < 1 or top_paths > beam_width:
        raise createPoptorchError(errors.CTC_TOP_PATHS.format(top_paths=top_paths, beam_width=beam_width))

    host_probs = probs.detach().to("cpu", torch.float64)
    out_probs = torch.full((batch_size, top_paths), -math.inf, dtype=torch.float64)
    out_lengths = torch.zeros((batch_size, top_paths), dtype=torch.int32)
    out_paths = torch.zeros((batch_size, top_paths, input_length), dtype=torch.int32)
    for b in range(batch_size):
        steps = min(max(int(lengths[b]), 0), input_length)
        ranked = _prefix_beam_search(host_probs[:steps, b].tolist(), blank, beam_width)
        for k, (path, log_prob) in enumerate(ranked[:top_paths]):
            out_probs[b, k] = log_prob
            out_lengths[b, k] = len(path)
            out_paths[b, k, :len(path)] = torch.tensor(path, dtype=torch.int32)
    return (out_probs.to(probs.device, probs.dtype), out_lengths.to(probs.device),
            out_paths.to(probs.device))


# --- point cloud ops --------------------------------------------------------------

def fps(src: torch.Tensor, ptr: list[int], ratio: float = 0.5,
        random_start: bool = False) -> torch.Tensor:
    """Farthest point sampling (PointNet++), per example ``src[ptr[i]:ptr[i+1]]``.

    Samples ``ceil(ratio * n)`` points of each example: the first (or a random) point,
    then repeatedly the point farthest from all points chosen so far. Returns the chosen
    rows' indices into ``src``.
    """
    if not isinstance(src, torch.Tensor):
        raise createPoptorchError(errors.FPS_SRC_TYPE.format(src_type=type(src)))
    if not isinstance(ptr, list) or not all(isinstance(p, int) for p in ptr):
        raise createPoptorchError(errors.FPS_PTR_TYPE)
    if len(ptr) < 2:
        raise createPoptorchError(errors.FPS_PTR_TOO_SHORT)
    if not isinstance(ratio, float):
        raise createPoptorchError(errors.FPS_RATIO_TYPE.format(ratio_type=type(ratio)))
    if not isinstance(random_start, bool):
        raise createPoptorchError(errors.FPS_RANDOM_START_TYPE.format(random_start_type=type(random_start)))
    if not 0.0 < ratio <= 1.0:
        raise createPoptorchError(errors.FPS_RATIO_RANGE.format(ratio=ratio))
    if ptr[0] < 0 or ptr[-1] > src.shape[0] or any(a > b for a, b in zip(ptr, ptr[1:])):
        raise createPoptorchError(errors.FPS_PTR_OFFSETS.format(shape=src.shape[0], ptr=ptr))
    points = src.detach().reshape(src.shape[0], -1)
    chosen = []
    for begin, end in zip(ptr, ptr[1:]):
        n = end - begin
        if n == 0:
            continue
        segment = points[begin:end]
        first = int(torch.randint(n, ())) if random_start else 0
        picks = [first]
        distance = (segment - segment[first]).pow(2).sum(-1)
        for _ in range(math.ceil(ratio * n) - 1):
            nxt = int(distance.argmax())
            picks.append(nxt)
            distance = torch.minimum(distance, (segment - segment[nxt]).pow(2).sum(-1))
        chosen.extend(begin + p for p in picks)
    return torch.tensor(chosen, dtype=torch.long, device=src.device)


def _batch_vector(batch, n: int, device, name: str) -> torch.Tensor:
    if batch is None or (isinstance(batch, list) and not batch):
        return torch.zeros(n, dtype=torch.long, device=device)
    if isinstance(batch, list):
        batch = torch.tensor(batch, dtype=torch.long)
    if not isinstance(batch, torch.Tensor):
        raise createPoptorchError(errors.NEAREST_BATCH_TYPE.format(name=name, batch_type=type(batch)))
    if batch.shape != (n,):
        raise createPoptorchError(errors.NEAREST_BATCH_SHAPE.format(name=name, n=n, shape=list(batch.shape)))
    return batch.to(device=device, dtype=torch.long)


def nearest(x: torch.Tensor, y: torch.Tensor,
            batch_x: Optional[Union[list[int], torch.Tensor]] = None,
            batch_y: Optional[Union[list[int], torch.Tensor]] = None) -> torch.Tensor:
    """For each point of ``x``, the index of the nearest point of ``y`` in the same example.

    ``batch_x`` / ``batch_y`` assign each point to an example (default: all in example 0).
    """
    if not isinstance(x, torch.Tensor):
        raise createPoptorchError(errors.NEAREST_X_TYPE.format(x_type=type(x)))
    if not isinstance(y, torch.Tensor):
        raise createPoptorchError(errors.NEAREST_Y_TYPE.format(y_type=type(y)))
    x2 = x.detach().reshape(x.shape[0], -1)
    if not x2.is_floating_point():
        x2 = x2.float()
    y2 = y.detach().reshape(y.shape[0], -1).to(x2)
    bx = _batch_vector(batch_x, x2.shape[0], x2.device, "batch_x")
    by = _batch_vector(batch_y, y2.shape[0], x2.device, "batch_y")
    same_example = bx[:, None] == by[None, :]
    if not bool(same_example.any(dim=1).all()):
        raise createPoptorchError(errors.NEAREST_EMPTY_EXAMPLE)
    distance = torch.cdist(x2, y2).masked_fill(~same_example, math.inf)
    return distance.argmin(dim=1)
