"""ONNX's recurrent ops (LSTM gates i,o,f,c; GRU gates z,r,h; RNN) as explicit time loops, forward,
reverse or bidirectional; layouts [seq, batch, input] -> Y [seq, dirs, batch, hidden]. Default
activations only; per-sequence lengths must be the full length; no peepholes."""
import torch

from .. import messages
from .common import fail
from .registry import register


def _check(ctx, inputs, attrs, defaults, seq_index=4):
    acts = attrs.get("activations")
    if acts and [a.lower() for a in acts[:len(defaults)]] != [d.lower() for d in defaults]:
        fail(ctx, messages.RNN_ACTIVATIONS_UNSUPPORTED.format(defaults=defaults, acts=acts))
    if attrs.get("clip") is not None:
        fail(ctx, messages.RNN_CLIP_UNSUPPORTED)
    lens = inputs[seq_index] if len(inputs) > seq_index else None
    if lens is not None and lens.device.type != "meta" and bool((lens != inputs[0].shape[0]).any()):
        fail(ctx, messages.RNN_SEQUENCE_LENS_UNSUPPORTED)
    if attrs.get("layout", 0):
        fail(ctx, messages.RNN_LAYOUT_UNSUPPORTED)


def _directions(attrs):
    direction = attrs.get("direction", "forward")
    return {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[direction]


def _run(x, reverse, step, state):
    steps = range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])
    ys = [None] * x.shape[0]
    for t in steps:
        state = step(x[t], state)
        ys[t] = state[0]
    return torch.stack(ys), state


def _initial(t, d, batch, hidden, like):
    if t is not None:
        return t[d]
    return torch.zeros(batch, hidden, dtype=like.dtype, device=like.device)


@register("LSTM", positional=("num_outputs",), non_differentiable_inputs=(4,))
def lstm(ctx, inputs, attrs):
    _check(ctx, inputs, attrs, ["Sigmoid", "Tanh", "Tanh"])
    x, w, r = inputs[:3]
    b = inputs[3] if len(inputs) > 3 else None
    h0 = inputs[5] if len(inputs) > 5 else None
    c0 = inputs[6] if len(inputs) > 6 else None
    if len(inputs) > 7 and inputs[7] is not None:
        fail(ctx, messages.LSTM_PEEPHOLE_UNSUPPORTED)
    hidden = r.shape[-1]
    batch = x.shape[1]
    ys, hs, cs = [], [], []
    for d, reverse in enumerate(_directions(attrs)):
        wd, rd = w[d], r[d]
        bias = b[d][:4 * hidden] + b[d][4 * hidden:] if b is not None else 0

        def step(xt, state, wd=wd, rd=rd, bias=bias):
            h, c = state
            gates = xt @ wd.t() + h @ rd.t() + bias
            i, o, f, g = gates.chunk(4, dim=-1)
            i, o, f, g = torch.sigmoid(i), torch.sigmoid(o), torch.sigmoid(f), torch.tanh(g)
            c = f * c + i * g
            return (o * torch.tanh(c), c)

        y, (h, c) = _run(x, reverse, step, (_initial(h0, d, batch, hidden, x), _initial(c0, d, batch, hidden, x)))
        ys.append(y)
        hs.append(h)
        cs.append(c)
    return [torch.stack(ys, 1), torch.stack(hs), torch.stack(cs)]


@register("GRU", positional=("num_outputs",), non_differentiable_inputs=(4,))
def gru(ctx, inputs, attrs):
    _check(ctx, inputs, attrs, ["Sigmoid", "Tanh"])
    x, w, r = inputs[:3]
    b = inputs[3] if len(inputs) > 3 else None
    h0 = inputs[5] if len(inputs) > 5 else None
    hidden = r.shape[-1]
    batch = x.shape[1]
    before_reset = bool(attrs.get("linear_before_reset", 0))
    ys, hs = [], []
    for d, reverse in enumerate(_directions(attrs)):
        wd, rd = w[d], r[d]
        wb = b[d][:3 * hidden] if b is not None else torch.zeros(3 * hidden, dtype=x.dtype)
        rb = b[d][3 * hidden:] if b is not None else torch.zeros(3 * hidden, dtype=x.dtype)

        def step(xt, state, wd=wd, rd=rd, wb=wb, rb=rb):
            h = state[0]
            xw = xt @ wd.t() + wb
            xz, xr, xh = xw.chunk(3, dim=-1)
            rz, rr, rh = rd.chunk(3, dim=0)
            bz, br, bh = rb.chunk(3)
            z = torch.sigmoid(xz + h @ rz.t() + bz)
            rg = torch.sigmoid(xr + h @ rr.t() + br)
            if before_reset:
                hh = torch.tanh(xh + rg * (h @ rh.t() + bh))
            else:
                hh = torch.tanh(xh + (rg * h) @ rh.t() + bh)
            return ((1 - z) * hh + z * h,)

        y, (h,) = _run(x, reverse, step, (_initial(h0, d, batch, hidden, x),))
        ys.append(y)
        hs.append(h)
    return [torch.stack(ys, 1), torch.stack(hs)]


@register("RNN", positional=("num_outputs",), non_differentiable_inputs=(4,))
def rnn(ctx, inputs, attrs):
    _check(ctx, inputs, attrs, ["Tanh"])
    x, w, r = inputs[:3]
    b = inputs[3] if len(inputs) > 3 else None
    h0 = inputs[5] if len(inputs) > 5 else None
    hidden = r.shape[-1]
    batch = x.shape[1]
    ys, hs = [], []
    for d, reverse in enumerate(_directions(attrs)):
        wd, rd = w[d], r[d]
        bias = b[d][:hidden] + b[d][hidden:] if b is not None else 0

        def step(xt, state, wd=wd, rd=rd, bias=bias):
            return (torch.tanh(xt @ wd.t() + state[0] @ rd.t() + bias),)

        y, (h,) = _run(x, reverse, step, (_initial(h0, d, batch, hidden, x),))
        ys.append(y)
        hs.append(h)
    return [torch.stack(ys, 1), torch.stack(hs)]
