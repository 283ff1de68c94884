"""The micro-batches of one optimizer step (``gradientAccumulation x replicationFactor``) inside
a compiled program (``program.py``).

Looped (``looped``): a ``torch._higher_order_ops.while_loop`` over the micro-batch counter ``k``,
so the traced graph holds one forward + backward whatever GA x R (an unrolled loop holds GA x R
copies: compile time and the compiled call's memory grew with them). Inside a device-iteration
``while_loop`` it is the inner of two nested loops. Order and values as eager's: ``k = a x R + r``
(``[GA, R]``), so random numbers are drawn micro-batch after micro-batch as eager draws them. The
body computes the micro-batch's gradients with ``torch.func.grad`` (the program never
differentiates through a loop) and carries:

* the accumulated scaled gradients, from zeros: Sum and post-hoc Mean add; the running Mean
  multiplies the sum by ``k / (k + 1)`` and divides the new gradients by ``k + 1``, both float32
  tensors made from ``k``, each result rounded to the gradient's dtype as the unrolled loop's
  products with Python numbers round;
* the buffers the forward updates: one set, or per-replica sets stacked ``[R, ...]`` and indexed
  by ``r = k % R``;
* every micro-batch's output leaves, stacked ``[GA x R, ...]`` with ``index_copy``.

Each micro-batch reads its input rows by index: the step's inputs ``[GA, R_in, micro, ...]``
flattened to ``[GA x R_in, ...]``, row ``a x R_in + chunk(r)`` (``Layout.chunks``).

Unrolled (``unrolled``, a Python loop traced into the graph) where the loop cannot be used: one
micro-batch per step, and forwards under a torch function mode (``LowPrecisionOps``: pushing one
inside a ``while_loop`` body is a side effect ``torch.compile`` refuses, one pushed outside is not
applied to the body).
"""
import torch

from .flat_loop import flat_while_loop


def accumulate(grads, micro_grads, k: int, running: bool):
    """Add micro-batch ``k``'s gradients to ``grads`` (``None`` before the first)."""
    if grads is None:
        return list(micro_grads)
    if running:
        return [acc * (k / (k + 1)) + mg / (k + 1) for acc, mg in zip(grads, micro_grads)]
    return [acc + mg for acc, mg in zip(grads, micro_grads)]


def unrolled(program, step_inputs, params, sets, loss_scale):
    """Every micro-batch of the step as traced Python. Returns (scaled gradients or ``None``
    (inference), output leaves stacked ``[GA x R, ...]``, buffer sets)."""
    layout = program.layout
    g = layout.geometry
    outs, grads = [], None
    for a in range(g.gradient_accumulation):
        for r in range(g.replication_factor):
            micro = [x if x.dim() == 0 else x[a, layout.chunks[r]] for x in step_inputs]
            s = r if program.buffer_sets > 1 else 0
            micro_grads, flat, sets[s] = program.micro_batch(params, sets[s], micro, loss_scale)
            outs.append(flat)
            if layout.training:
                grads = accumulate(grads, micro_grads, a * g.replication_factor + r, layout.running)
    stacked = [torch.stack([flat[i] for flat in outs]) for i in range(len(outs[0]))]
    return grads, stacked, sets


def looped(program, step_inputs, params, sets, loss_scale):
    """``unrolled``'s result from a ``while_loop`` over the micro-batches (module docstring)."""
    layout = program.layout
    g = layout.geometry
    replicas, count = g.replication_factor, g.micro_batches_per_step
    training, running = layout.training, layout.running
    per_replica = program.buffer_sets > 1
    device = next((x.device for x in step_inputs if x.dim() > 0), torch.device("cpu"))
    rows = torch.tensor([a * g.input_replicas + layout.chunks[r]
                         for a in range(g.gradient_accumulation) for r in range(replicas)], device=device)
    flat_inputs = [x if x.dim() == 0 else x.flatten(0, 1) for x in step_inputs]
    buffers = [torch.stack(values) for values in zip(*sets)] if per_replica else list(sets[0])
    grads0 = [torch.zeros_like(params[name]) for name in program.trained_names] if training else []
    outs0 = [torch.zeros((count, *shape), dtype=dtype, device=device) for shape, dtype in layout.output_leaves]
    n_grads, n_buffers = len(grads0), len(buffers)

    def cond(k, *carried):
        return k < count

    def body(k, *carried):
        grads = list(carried[:n_grads])
        bufs = list(carried[n_grads:n_grads + n_buffers])
        outs = list(carried[n_grads + n_buffers:])
        index = k.reshape(1)
        row = rows.index_select(0, index)
        micro = [x if x.dim() == 0 else x.index_select(0, row)[0] for x in flat_inputs]
        replica = index % replicas
        own = [b.index_select(0, replica)[0] for b in bufs] if per_replica else bufs
        micro_grads, flat, own = program.micro_batch(params, own, micro, loss_scale)
        bufs = [b.index_copy(0, replica, o.unsqueeze(0)) for b, o in zip(bufs, own)] if per_replica else own
        outs = [o.index_copy(0, index, leaf.unsqueeze(0)) for o, leaf in zip(outs, flat)]
        if training and running:
            weight = k.to(torch.float32)
            kept, divisor = weight / (weight + 1), weight + 1
            grads = [(acc.float() * kept).to(acc.dtype) + (mg.float() / divisor).to(acc.dtype)
                     for acc, mg in zip(grads, micro_grads)]
        elif training:
            grads = [acc + mg for acc, mg in zip(grads, micro_grads)]
        return (k + 1, *grads, *bufs, *outs)

    result = flat_while_loop(cond, body, (torch.tensor(0, device=device), *grads0, *buffers, *outs0))
    grads = list(result[1:1 + n_grads]) if training else None
    buffers = list(result[1 + n_grads:1 + n_grads + n_buffers])
    stacked = list(result[1 + n_grads + n_buffers:])
    if per_replica:
        sets = [[b[s].clone() for b in buffers] for s in range(program.buffer_sets)]
    else:
        sets = [buffers]
    return grads, stacked, sets
