"""Adam/AdamW, LAMB and RMSprop updates of one parameter as pure tensor functions
(``functional_optim.py`` and ``fused_updates.py`` dispatch to them), numerically what
``optim/adam.py``, ``optim/lamb.py`` and ``optim/rmsprop.py`` (and torch's Adam, AdamW and
RMSprop) compute in ``step()``.

``h`` may hold ``one_minus_beta1``/``one_minus_beta2``, ``correction1``/``correction2`` (1 - beta
** step) and ``decay`` (1 - lr * weight_decay) computed on the host in double precision, as the
eager optimizers compute them (``fused_updates.py``); else they are computed here in float32.

Hyperparameters arrive as 0-d tensors (``h``); static choices (bias correction, momentum on,
centered, TensorFlow's variant, maximize) as Python values, part of the program's signature.
"""
import torch


def _moments(g, st, h):
    """``(step, m, v)``: the step counter and both moments after this gradient."""
    c1 = h["one_minus_beta1"] if "one_minus_beta1" in h else 1.0 - h["beta1"]
    c2 = h["one_minus_beta2"] if "one_minus_beta2" in h else 1.0 - h["beta2"]
    return st["step"] + 1.0, torch.lerp(st["exp_avg"], g, c1), st["exp_avg_sq"] * h["beta2"] + g * g * c2


def _corrections(h, step):
    if "correction1" in h:
        return h["correction1"], h["correction2"]
    return 1.0 - torch.pow(h["beta1"], step), 1.0 - torch.pow(h["beta2"], step)


def adam(p, g, st, h, maximize, decoupled, bias_correction):
    """Adam (weight decay added to the gradient) or, ``decoupled``, AdamW (the weights decayed
    first), torch's algorithm without amsgrad."""
    if decoupled:
        p = p * (h["decay"] if "decay" in h else 1.0 - h["lr"] * h["weight_decay"])
    if maximize:
        g = -g
    if not decoupled:
        g = g + h["weight_decay"] * p
    step, m, v = _moments(g, st, h)
    if bias_correction:
        correction1, correction2 = _corrections(h, step)
        denom = torch.sqrt(v) / torch.sqrt(correction2) + h["eps"]
        p = p - (h["lr"] / correction1) * m / denom
    else:
        p = p - h["lr"] * m / (torch.sqrt(v) + h["eps"])
    return p, {"step": step, "exp_avg": m, "exp_avg_sq": v}


def lamb(p, g, st, h, bias_correction):
    """LAMB (PopART's Lamb / LambNoBias): Adam's direction plus weight decay, scaled by the
    trust ratio ``min(||w||, max_weight_norm) / ||u||`` (1 when either norm is 0)."""
    step, m, v = _moments(g, st, h)
    if bias_correction:
        correction1, correction2 = _corrections(h, step)
        denom = torch.sqrt(v) / torch.sqrt(correction2) + h["eps"]
        update = m / correction1 / denom
    else:
        update = m / (torch.sqrt(v) + h["eps"])
    update = update + h["weight_decay"] * p
    r1 = torch.minimum(torch.linalg.vector_norm(p), h["max_weight_norm"])
    r2 = torch.linalg.vector_norm(update)
    ratio = torch.where((r1 > 0) & (r2 > 0), r1 / r2, torch.ones_like(r1))
    return p - h["lr"] * (update * ratio), {"step": step, "exp_avg": m, "exp_avg_sq": v}


def lamb_state(st, p, fill=torch.full_like):
    """``fill(p, value, memory_format=...)`` makes the state not created yet (``state_in``)."""
    return {"step": _step_of(st, p), "exp_avg": _or_fill(st.get("exp_avg"), p, 0.0, fill),
            "exp_avg_sq": _or_fill(st.get("exp_avg_sq"), p, 0.0, fill)}


def rmsprop(p, g, st, h, momentum_on, centered, tf_variant, maximize):
    """RMSprop: torch's (``eps`` outside the square root), or TensorFlow's (``eps`` inside, the
    learning rate folded into the momentum buffer)."""
    if maximize:
        g = -g
    g = g + h["weight_decay"] * p
    new = {"step": st["step"] + 1.0}
    square = st["square_avg"] * h["alpha"] + g * g * (1.0 - h["alpha"])
    new["square_avg"] = square
    if centered:
        new["grad_avg"] = torch.lerp(st["grad_avg"], g, 1.0 - h["alpha"])
        square = square - new["grad_avg"] * new["grad_avg"]
    avg = torch.sqrt(square + h["eps"]) if tf_variant else torch.sqrt(square) + h["eps"]
    if not momentum_on:
        return p - h["lr"] * (g / avg), new
    if tf_variant:
        new["momentum_buffer"] = st["momentum_buffer"] * h["momentum"] + h["lr"] * (g / avg)
        return p - new["momentum_buffer"], new
    new["momentum_buffer"] = st["momentum_buffer"] * h["momentum"] + g / avg
    return p - h["lr"] * new["momentum_buffer"], new


def rmsprop_state(st, p, momentum_on, centered, tf_variant, fill=torch.full_like):
    state = {"step": _step_of(st, p),
             "square_avg": _or_fill(st.get("square_avg"), p, 1.0 if tf_variant else 0.0, fill)}
    if centered:  # keys in the order rmsprop() returns them (the program carries them flattened)
        state["grad_avg"] = _or_fill(st.get("grad_avg"), p, 0.0, fill)
    if momentum_on:
        state["momentum_buffer"] = _or_fill(st.get("momentum_buffer"), p, 0.0, fill)
    return state


def _step_of(st, p):
    step = st.get("step")
    if step is None:
        return torch.zeros((), device=p.device)
    return torch.as_tensor(step, dtype=torch.float32).to(p.device).reshape(())


def _or_fill(tensor, param, value=0.0, fill=torch.full_like):
    if tensor is None:
        return fill(param, value, memory_format=torch.preserve_format)
    return tensor.to(torch.float32)
