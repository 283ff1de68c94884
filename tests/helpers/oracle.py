"""Plain-PyTorch oracles: the same model, data and optimizer in a hand-written loop."""
import torch


def micro_batches(tensor, di, ga, r):
    """Split a combined batch in PopART's order into ``[di][ga][r]`` micro-batches."""
    micro = tensor.shape[0] // (di * ga * r)
    view = tensor.reshape(di, ga, r, micro, *tensor.shape[1:])
    return [[[view[d, g, k] for k in range(r)] for g in range(ga)] for d in range(di)]


def train_loop(model, optimizer, inputs, loss_fn, di, ga, r, reduction="mean", max_grad_norm=None):
    """One optimizer step per device iteration over ga*r micro-batches (gradients clipped to
    ``max_grad_norm`` first, if given). Returns losses in ``[di, ga, r]`` order, computed before
    each step's update."""
    splits = [micro_batches(t, di, ga, r) for t in inputs]
    losses = []
    for d in range(di):
        optimizer.zero_grad(set_to_none=True)
        for g in range(ga):
            for k in range(r):
                loss = loss_fn(model, *[s[d][g][k] for s in splits])
                losses.append(loss.detach())
                scale = 1.0 / (ga * r) if reduction == "mean" else 1.0
                (loss * scale).backward()
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
    return torch.stack(losses)
