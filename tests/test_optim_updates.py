"""One table of optimizer updates, run by every backend that computes them: the eager
optimizer's ``step()`` (``optim/updates.py`` with foreach ops), the compiled program's update
(``runtime/compiled/functional_optim.py``: the same functions with pure ops, here run untraced)
and the unit "regions"'s fused update (``runtime/compiled/fused_updates.py``, its kernel's body
here uncompiled; Adam, AdamW and LAMB), each against a hand-written torch oracle."""
import dataclasses
import math
from typing import Callable

import pytest
import torch

from openpop import optim
from openpop.optim import updates
from openpop.runtime.compiled import fused_updates
from openpop.runtime.compiled.functional_optim import FunctionalOptimizer
from openpop.runtime.compiled.loss_scaling import ScalingState
from openpop.runtime.loss_scaling import DynamicLossScaling

STEPS = 4


# --------------------------------------------------------------------------- oracles
def sgd_oracle(p, g, st, *, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False,
               **_):
    g = -g if maximize else g
    g = g + weight_decay * p
    if momentum:
        buf = st.get("buf")
        buf = g.clone() if buf is None else momentum * buf + (1 - dampening) * g
        st["buf"] = buf
        g = g + momentum * buf if nesterov else buf
    return p - lr * g


def adam_oracle(p, g, st, *, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled=False,
                bias_correction=True, maximize=False, **_):
    beta1, beta2 = betas
    g = -g if maximize else g
    if decoupled:
        p = p * (1 - lr * weight_decay)
    else:
        g = g + weight_decay * p
    t = st["t"] = st.get("t", 0) + 1
    m = st["m"] = beta1 * st.get("m", torch.zeros_like(p)) + (1 - beta1) * g
    v = st["v"] = beta2 * st.get("v", torch.zeros_like(p)) + (1 - beta2) * g * g
    if bias_correction:
        m, v = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
    return p - lr * m / (v.sqrt() + eps)


def lamb_oracle(p, g, st, *, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, bias_correction=True,
                max_weight_norm=65500.0, **_):
    beta1, beta2 = betas
    t = st["t"] = st.get("t", 0) + 1
    m = st["m"] = beta1 * st.get("m", torch.zeros_like(p)) + (1 - beta1) * g
    v = st["v"] = beta2 * st.get("v", torch.zeros_like(p)) + (1 - beta2) * g * g
    if bias_correction:
        m, v = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
    u = m / (v.sqrt() + eps) + weight_decay * p
    r1, r2 = min(p.norm().item(), max_weight_norm), u.norm().item()
    ratio = r1 / r2 if r1 > 0 and r2 > 0 else 1.0
    return p - lr * ratio * u


def rmsprop_oracle(p, g, st, *, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False,
                   use_tf_variant=False, **_):
    g = g + weight_decay * p
    sq = st["sq"] = alpha * st.get("sq", torch.full_like(p, 1.0 if use_tf_variant else 0.0)) + (1 - alpha) * g * g
    if centered:
        ga = st["ga"] = alpha * st.get("ga", torch.zeros_like(p)) + (1 - alpha) * g
        sq = sq - ga * ga
    denom = (sq + eps).sqrt() if use_tf_variant else sq.sqrt() + eps
    if not momentum:
        return p - lr * g / denom
    buf = st.get("buf", torch.zeros_like(p))
    if use_tf_variant:
        buf = st["buf"] = momentum * buf + lr * g / denom
        return p - buf
    buf = st["buf"] = momentum * buf + g / denom
    return p - lr * buf


# --------------------------------------------------------------------------- the table
@dataclasses.dataclass
class Case:
    optimizer: Callable
    kwargs: dict
    oracle: Callable
    body: str          # the function of optim/updates.py every backend runs
    oracle_kwargs: dict = dataclasses.field(default_factory=dict)

    @property
    def fused(self) -> bool:
        return self.body in ("adam", "lamb")


CASES = {
    "sgd": Case(optim.SGD, dict(lr=0.1, weight_decay=0.01), sgd_oracle, "sgd"),
    "sgd_momentum": Case(optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01), sgd_oracle, "sgd"),
    "sgd_nesterov": Case(optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, maximize=True), sgd_oracle, "sgd"),
    "sgd_velocity_scaling": Case(optim.SGD, dict(lr=0.1, momentum=0.9, use_combined_accum=True,
                                                 velocity_scaling=8.0), sgd_oracle, "sgd"),
    "adam": Case(optim.Adam, dict(lr=0.01, weight_decay=0.01), adam_oracle, "adam"),
    "adam_maximize": Case(optim.Adam, dict(lr=0.01, maximize=True), adam_oracle, "adam"),
    "adamw": Case(optim.AdamW, dict(lr=0.01, weight_decay=0.1), adam_oracle, "adam", dict(decoupled=True)),
    "adamw_no_bias": Case(optim.AdamW, dict(lr=0.01, weight_decay=0.1, bias_correction=False), adam_oracle,
                          "adam", dict(decoupled=True)),
    "lamb": Case(optim.LAMB, dict(lr=0.01, weight_decay=0.01), lamb_oracle, "lamb"),
    "lamb_no_bias": Case(optim.LAMB, dict(lr=0.01, bias_correction=False, max_weight_norm=1.5), lamb_oracle,
                         "lamb"),
    "rmsprop": Case(optim.RMSprop, dict(lr=0.01, weight_decay=0.01), rmsprop_oracle, "rmsprop"),
    "rmsprop_centered": Case(optim.RMSprop, dict(lr=0.01, momentum=0.9, centered=True), rmsprop_oracle,
                             "rmsprop"),
    "rmsprop_tf": Case(optim.RMSprop, dict(lr=0.01, momentum=0.9, use_tf_variant=True), rmsprop_oracle,
                       "rmsprop"),
    "rmsprop_tf_centered": Case(optim.RMSprop, dict(lr=0.01, centered=True, use_tf_variant=True),
                                rmsprop_oracle, "rmsprop"),
}


def _initial():
    torch.manual_seed(0)
    return [torch.randn(4, 3), torch.randn(3), torch.randn(5)]


def _grads(step):
    torch.manual_seed(100 + step)
    return [torch.randn(4, 3), torch.randn(3), torch.randn(5)]


def _oracle(case):
    params = _initial()
    states = [{} for _ in params]
    kwargs = {**case.kwargs, **case.oracle_kwargs}
    for step in range(STEPS):
        params = [case.oracle(p, g, st, **kwargs) for p, g, st in zip(params, _grads(step), states)]
    return params


def _leaves():
    return [p.clone().requires_grad_() for p in _initial()]


def _eager(case):
    params = _leaves()
    optimizer = case.optimizer(params, **case.kwargs)
    for step in range(STEPS):
        for p, g in zip(params, _grads(step)):
            p.grad = g
        optimizer.step()
    return params


def _program(case):
    params = _leaves()
    optimizer = case.optimizer(params, **case.kwargs)
    functional = FunctionalOptimizer(optimizer)
    for step in range(STEPS):
        state = functional.state_in()
        with torch.no_grad():
            new_params, new_state = functional.update([p.detach() for p in params], _grads(step), state,
                                                      functional.unpack(functional.hyper()))
            for p, new in zip(params, new_params):
                p.copy_(new)
        functional.commit(new_state)
    return params


def _fused(case, monkeypatch):
    monkeypatch.setattr(fused_updates, "_compiled", lambda: fused_updates._in_place)  # the kernel's body
    params = _leaves()
    optimizer = case.optimizer(params, **case.kwargs)
    assert fused_updates.FusedUpdate.supports(optimizer)
    fused = fused_updates.FusedUpdate(optimizer)
    own = []
    monkeypatch.setattr(fused, "_own", lambda *args: own.append(args))
    with fused.installed():
        for step in range(STEPS):
            for p, g in zip(params, _grads(step)):
                p.grad = g
            optimizer.step()
    assert not own  # every parameter went through the kernel
    return params


BACKENDS = ("eager", "program", "fused")


@pytest.mark.parametrize(("name", "backend"), [(name, backend) for name, case in CASES.items()
                                                for backend in BACKENDS if backend != "fused" or case.fused])
def test_every_backend_matches_the_oracle(name, backend, monkeypatch):
    """(The fused update covers Adam, AdamW and LAMB; SGD and RMSprop keep their eager step.)"""
    case = CASES[name]
    calls = []
    body = getattr(updates, case.body)

    def spy(o, *args, **kwargs):
        calls.append(o)
        return body(o, *args, **kwargs)

    monkeypatch.setattr(updates, case.body, spy)
    if backend == "eager":
        got = _eager(case)
    elif backend == "program":
        got = _program(case)
    else:
        got = _fused(case, monkeypatch)
    expected = _oracle(case)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g.detach(), e, rtol=1e-5, atol=1e-6)
    # the one definition ran, with the ops of that backend
    assert calls and set(calls) == {updates.FOREACH if backend == "eager" else updates.PURE}


def test_backends_agree_with_each_other():
    """Eager and program from the same table, compared directly (no oracle in between)."""
    for case in CASES.values():
        for e, p in zip(_eager(case), _program(case)):
            torch.testing.assert_close(e.detach(), p.detach(), rtol=1e-5, atol=1e-6)


def test_pure_ops_write_nothing():
    """``PURE`` never writes its inputs (the program's inputs stay intact)."""
    params, grads = _initial(), _grads(0)
    m, v, steps = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params], \
        [torch.zeros(()) for _ in params]
    copies = [t.clone() for t in params + grads + m + v + steps]
    h = updates.hyperparameters("lamb", dict(lr=0.1, weight_decay=0.1, betas=(0.9, 0.99), eps=1e-8),
                                convert=torch.tensor)
    updates.lamb(updates.PURE, params, grads, m, v, steps, h)
    for before, after in zip(copies, params + grads + m + v + steps):
        assert torch.equal(before, after)
    assert math.isclose(updates.MAX_WEIGHT_NORM, 65500.0)


def test_loss_scaling_rule_is_the_same_eager_and_traced():
    """``scaling_rule`` on Python numbers (eager) and on tensors (the program's ``ScalingState``)."""
    flags = [True, True, False, True, True, True, False, False, True, True, True]
    eager = DynamicLossScaling(growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    program = ScalingState(DynamicLossScaling(growth_factor=2.0, backoff_factor=0.5, growth_interval=3), len(flags))
    scale = 1024.0
    scaling = program.inputs(torch.tensor(scale), DynamicLossScaling())
    old, new = [torch.zeros(1)], [torch.ones(1)]
    for i, finite in enumerate(flags):
        scale = eager.next_scale(scale, finite)
        grads = [torch.tensor([1.0 if finite else math.inf])]
        kept, scaling = program.apply(scaling, grads, old, new, torch.tensor([i]))
        assert scaling["scale"].item() == scale
        assert scaling["finite_steps"].item() == eager.finite_steps
        assert kept[0].item() == (1.0 if finite else 0.0)
    assert scaling["history"].tolist() == flags
