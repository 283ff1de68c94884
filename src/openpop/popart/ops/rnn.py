"""ONNX's recurrent ops (LSTM gates i,o,f,c; GRU gates z,r,h; RNN) as explicit time loops, forward,
reverse or bidirectional; layouts [seq, batch, input] -> Y [seq, dirs, batch, hidden]. LSTM takes the
activations PopART's does (Sigmoid, Relu, Tanh, Gelu, Swish; f for the gates, g = h for cell and
output); GRU and RNN their defaults only; sequence_lens as ONNX defines them; no peepholes."""
import torch

from .. import messages
from .common import fail
from .registry import register

# The activations PopART's LSTM takes (lstmutil's fromString), by ONNX name.
_LSTM_ACTIVATIONS = {"Sigmoid": torch.sigmoid, "Relu": torch.relu, "Tanh": torch.tanh,
                     "Gelu": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
                     "Swish": lambda t: t * torch.sigmoid(t)}


def _lstm_activations(ctx, attrs):
    """(recurrent activation f of the i/o/f gates, activation g = h of the cell and output), as PopART
    reads ``activations`` (its errors for an unknown one, g != h, more than 3, alpha/beta)."""
    for name in ("activation_alpha", "activation_beta"):
        if name in attrs:
            fail(ctx, messages.LSTM_ACTIVATION_ATTRIBUTE.format(name=name))
    acts = list(attrs.get("activations") or [])
    for a in acts[:2]:
        if a not in _LSTM_ACTIVATIONS:
            fail(ctx, messages.LSTM_ACTIVATION_UNSUPPORTED.format(act=a))
    if len(acts) >= 3 and acts[1] != acts[2]:
        fail(ctx, messages.LSTM_ACTIVATIONS_DIFFER)
    if len(acts) > 3:
        fail(ctx, messages.LSTM_TOO_MANY_ACTIVATIONS.format(n=len(acts)))
    recurrent = _LSTM_ACTIVATIONS[acts[0]] if acts else torch.sigmoid
    return recurrent, _LSTM_ACTIVATIONS[acts[1]] if len(acts) > 1 else torch.tanh


def _check(ctx, inputs, attrs, defaults, seq_index=4):
    acts = attrs.get("activations")
    if defaults is not None and acts and \
            [a.lower() for a in acts[:len(defaults)]] != [d.lower() for d in defaults]:
        fail(ctx, messages.RNN_ACTIVATIONS_UNSUPPORTED.format(defaults=defaults, acts=acts))
    if attrs.get("clip") is not None:
        fail(ctx, messages.RNN_CLIP_UNSUPPORTED)
    if attrs.get("layout", 0):
        fail(ctx, messages.RNN_LAYOUT_UNSUPPORTED)


def _directions(attrs):
    direction = attrs.get("direction", "forward")
    return {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[direction]


def _run(x, reverse, step, state, lens=None):
    """The time loop. ``lens`` (sequence_lens, [batch]): as ONNX, a batch element's steps from its length
    on are skipped - its state is held, its outputs there are zero (reverse: it starts at lens - 1)."""
    steps = range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])
    ys = [None] * x.shape[0]
    for t in steps:
        new = step(x[t], state)
        if lens is None:
            state = new
            ys[t] = new[0]
        else:
            live = (t < lens).unsqueeze(-1)
            state = tuple(torch.where(live, n, o) for n, o in zip(new, state))
            ys[t] = torch.where(live, new[0], torch.zeros_like(new[0]))
    return torch.stack(ys), state


def _lens(inputs, index=4):
    lens = inputs[index] if len(inputs) > index else None
    return None if lens is None else lens.to(torch.int64)


def _initial(t, d, batch, hidden, like):
    if t is not None:
        return t[d]
    return torch.zeros(batch, hidden, dtype=like.dtype, device=like.device)


@register("LSTM", positional=("num_outputs",), non_differentiable_inputs=(4,))
def lstm(ctx, inputs, attrs):
    _check(ctx, inputs, attrs, None)
    f_act, g_act = _lstm_activations(ctx, attrs)
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
            i, o, f, g = f_act(i), f_act(o), f_act(f), g_act(g)
            c = f * c + i * g
            return (o * g_act(c), c)

        y, (h, c) = _run(x, reverse, step, (_initial(h0, d, batch, hidden, x), _initial(c0, d, batch, hidden, x)),
                         _lens(inputs))
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
        wb = b[d][:3 * hidden] if b is not None else torch.zeros(3 * hidden, dtype=x.dtype, device=x.device)
        rb = b[d][3 * hidden:] if b is not None else torch.zeros(3 * hidden, dtype=x.dtype, device=x.device)

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

        y, (h,) = _run(x, reverse, step, (_initial(h0, d, batch, hidden, x),), _lens(inputs))
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

        y, (h,) = _run(x, reverse, step, (_initial(h0, d, batch, hidden, x),), _lens(inputs))
        ys.append(y)
        hs.append(h)
    return [torch.stack(ys, 1), torch.stack(hs)]
