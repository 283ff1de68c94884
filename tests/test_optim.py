"""openpop.optim (poptorch.optim): every optimizer against an independent oracle.

Two kinds of oracle:
* torch.optim's optimizer of the same name, for the default (torch-compatible) settings;
* update formulas written out below, one tensor at a time, for PopTorch's variants
  (LAMB, AdamW without bias correction, TensorFlow's RMSprop, ...).
Each run is 10 steps on a small model with fixed data; results must agree within 1e-5.
"""
import copy
import inspect
import io
import logging
import math
import pickle

import pytest
import torch
from torch import nn

from openpop import optim
from openpop.errors import Error
from openpop.log import logger

STEPS = 10
TOL = dict(rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- harness
def make_model():
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))


def make_data():
    g = torch.Generator().manual_seed(99)
    return torch.randn(16, 5, generator=g), torch.randn(16, 3, generator=g)


def loss_of(model, x, y):
    return nn.functional.mse_loss(model(x), y)


def train(model, optimizer, steps=STEPS, clip=None):
    """A plain loop: the gradients step() sees are the model's gradients."""
    x, y = make_data()
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_of(model, x, y)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        losses.append(loss.item())
    return losses


def groups_of(model, spec):
    """Param groups: ``spec`` None -> all parameters; else a list of per-group extra options
    for [weights, biases]."""
    if spec is None:
        return model.parameters()
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return [dict(params=weights, **spec[0]), dict(params=biases, **spec[1])]


def run(factory, spec=None, steps=STEPS, clip=None):
    model = make_model()
    opt = factory(groups_of(model, spec))
    losses = train(model, opt, steps, clip)
    return model, opt, losses


def assert_same_weights(a, b, **tol):
    tol = tol or TOL
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), msg=lambda m, name=name: f"{name}: {m}", **tol)


def hand_run(update, hyper_of, steps=STEPS, clip=None):
    """10 steps with a hand-written per-tensor ``update(p, g, state, hp, t)`` that returns
    the new value of p. ``hyper_of(name)`` gives the hyperparameters of a parameter."""
    model = make_model()
    x, y = make_data()
    states = {n: {} for n, _ in model.named_parameters()}
    for t in range(1, steps + 1):
        model.zero_grad()
        loss_of(model, x, y).backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        if clip is not None:
            total = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
            coef = min(1.0, clip / (total + 1e-6))
            grads = {n: g * coef for n, g in grads.items()}
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(update(p.detach().clone(), grads[n], states[n], hyper_of(n), t))
    return model


def per_group(spec, defaults):
    def hyper_of(name):
        hp = dict(defaults)
        if spec is not None:
            hp.update(spec[0] if name.endswith("weight") else spec[1])
        return hp
    return hyper_of


@pytest.fixture
def logs():
    """Messages logged by openpop's logger (it does not propagate to the root logger)."""
    records = []

    class _Keep(logging.Handler):
        def emit(self, record):
            records.append((record.levelno, record.getMessage()))

    handler = _Keep(level=1)
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(old_level)


# ------------------------------------------------------------------- hand-written updates
def sgd_update(p, g, st, hp, t):
    g = -g if hp.get("maximize") else g
    g = g + hp["weight_decay"] * p
    if hp["momentum"]:
        if "buf" not in st:
            st["buf"] = g.clone()
        else:
            st["buf"] = hp["momentum"] * st["buf"] + (1 - hp["dampening"]) * g
        g = g + hp["momentum"] * st["buf"] if hp["nesterov"] else st["buf"]
    return p - hp["lr"] * g


def adam_update(p, g, st, hp, t):
    """Adam (L2 weight decay) / AdamW (decoupled) with optional bias correction."""
    b1, b2 = hp["betas"]
    g = -g if hp.get("maximize") else g
    if hp["decoupled"]:
        p = p * (1 - hp["lr"] * hp["weight_decay"])
    else:
        g = g + hp["weight_decay"] * p
    st["m"] = b1 * st.get("m", torch.zeros_like(p)) + (1 - b1) * g
    st["v"] = b2 * st.get("v", torch.zeros_like(p)) + (1 - b2) * g * g
    m, v = st["m"], st["v"]
    if hp.get("bias_correction", True):
        m, v = m / (1 - b1 ** t), v / (1 - b2 ** t)
    return p - hp["lr"] * m / (v.sqrt() + hp["eps"])


def rmsprop_update(p, g, st, hp, t):
    """torch's RMSprop, or TensorFlow's (ms from ones, eps inside the sqrt, lr in momentum)."""
    a, eps, mom, lr, tf = hp["alpha"], hp["eps"], hp["momentum"], hp["lr"], hp["tf"]
    g = g + hp["weight_decay"] * p
    st["ms"] = a * st.get("ms", torch.ones_like(p) if tf else torch.zeros_like(p)) + (1 - a) * g * g
    ms = st["ms"]
    if hp["centered"]:
        st["mg"] = a * st.get("mg", torch.zeros_like(p)) + (1 - a) * g
        ms = ms - st["mg"] ** 2
    denom = (ms + eps).sqrt() if tf else ms.sqrt() + eps
    if mom > 0:
        if tf:
            st["buf"] = mom * st.get("buf", torch.zeros_like(p)) + lr * g / denom
            return p - st["buf"]
        st["buf"] = mom * st.get("buf", torch.zeros_like(p)) + g / denom
        return p - lr * st["buf"]
    return p - lr * g / denom


def lamb_update(p, g, st, hp, t):
    b1, b2 = hp["betas"]
    st["m"] = b1 * st.get("m", torch.zeros_like(p)) + (1 - b1) * g
    st["v"] = b2 * st.get("v", torch.zeros_like(p)) + (1 - b2) * g * g
    m, v = st["m"], st["v"]
    if hp["bias_correction"]:
        m, v = m / (1 - b1 ** t), v / (1 - b2 ** t)
    u = m / (v.sqrt() + hp["eps"]) + hp["weight_decay"] * p
    r1 = min(float(p.norm()), hp["max_weight_norm"])
    r2 = float(u.norm())
    ratio = r1 / r2 if r1 > 0 and r2 > 0 else 1.0
    return p - hp["lr"] * ratio * u


SGD_DEFAULTS = dict(lr=0.05, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False)
ADAM_DEFAULTS = dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled=False)
RMS_DEFAULTS = dict(lr=0.01, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False, tf=False)
LAMB_DEFAULTS = dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, bias_correction=True,
                     max_weight_norm=65500.0)


# ----------------------------------------------------------------------- torch parity
SGD_CASES = [dict(), dict(momentum=0.9), dict(momentum=0.9, dampening=0.3), dict(momentum=0.9, nesterov=True),
             dict(momentum=0.5, weight_decay=0.1), dict(weight_decay=0.05, maximize=True)]


@pytest.mark.parametrize("kw", SGD_CASES)
def test_sgd_matches_torch_and_formula(kw):
    ours, _, _ = run(lambda p: optim.SGD(p, lr=0.05, **kw))
    theirs, _, _ = run(lambda p: torch.optim.SGD(p, lr=0.05, **kw))
    assert_same_weights(ours, theirs)
    assert_same_weights(ours, hand_run(sgd_update, per_group(None, {**SGD_DEFAULTS, **kw})))


ADAM_CASES = [dict(), dict(weight_decay=0.1), dict(betas=(0.8, 0.99), eps=1e-6), dict(maximize=True)]


@pytest.mark.parametrize("kw", ADAM_CASES)
def test_adam_matches_torch_and_formula(kw):
    ours, _, _ = run(lambda p: optim.Adam(p, lr=0.01, **kw))
    theirs, _, _ = run(lambda p: torch.optim.Adam(p, lr=0.01, **kw))
    assert_same_weights(ours, theirs)
    assert_same_weights(ours, hand_run(adam_update, per_group(None, {**ADAM_DEFAULTS, **kw})))


@pytest.mark.parametrize("kw", [dict(), dict(weight_decay=0.2), dict(betas=(0.7, 0.9), maximize=True)])
def test_adamw_matches_torch_and_formula(kw):
    ours, _, _ = run(lambda p: optim.AdamW(p, lr=0.01, **kw))
    theirs, _, _ = run(lambda p: torch.optim.AdamW(p, lr=0.01, **kw))
    assert_same_weights(ours, theirs)
    hp = {**ADAM_DEFAULTS, "weight_decay": 1e-2, "decoupled": True, **kw}
    assert_same_weights(ours, hand_run(adam_update, per_group(None, hp)))


def test_adam_decoupled_weight_decay_of_current_torch_is_adamw():
    ours, _, _ = run(lambda p: optim.Adam(p, lr=0.01, weight_decay=0.1, decoupled_weight_decay=True))
    theirs, _, _ = run(lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1))
    assert_same_weights(ours, theirs)


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_adamw_without_bias_correction(wd):
    ours, _, _ = run(lambda p: optim.AdamW(p, lr=0.01, weight_decay=wd, bias_correction=False))
    hp = {**ADAM_DEFAULTS, "weight_decay": wd, "decoupled": True, "bias_correction": False}
    assert_same_weights(ours, hand_run(adam_update, per_group(None, hp)))
    with_bias, _, _ = run(lambda p: optim.AdamW(p, lr=0.01, weight_decay=wd))
    assert not torch.allclose(ours[0].weight, with_bias[0].weight)


RMS_CASES = [dict(), dict(momentum=0.9), dict(centered=True), dict(centered=True, momentum=0.5, weight_decay=0.1),
             dict(alpha=0.9, eps=1e-4)]


@pytest.mark.parametrize("kw", RMS_CASES)
def test_rmsprop_matches_torch_and_formula(kw):
    ours, _, _ = run(lambda p: optim.RMSprop(p, lr=0.01, **kw))
    theirs, _, _ = run(lambda p: torch.optim.RMSprop(p, lr=0.01, **kw))
    assert_same_weights(ours, theirs)
    assert_same_weights(ours, hand_run(rmsprop_update, per_group(None, {**RMS_DEFAULTS, **kw})))


@pytest.mark.parametrize("kw", RMS_CASES)
def test_rmsprop_tensorflow_variant(kw):
    kw = {**kw, "eps": kw.get("eps", 1e-3)}  # large enough for its place to matter
    ours, _opt, _ = run(lambda p: optim.RMSprop(p, lr=0.01, use_tf_variant=True, **kw))
    assert_same_weights(ours, hand_run(rmsprop_update, per_group(None, {**RMS_DEFAULTS, **kw, "tf": True})))
    torch_like, _, _ = run(lambda p: optim.RMSprop(p, lr=0.01, **kw))
    assert not torch.allclose(ours[0].weight, torch_like[0].weight)


def test_rmsprop_tensorflow_variant_starts_mean_square_at_one():
    model = make_model()
    opt = optim.RMSprop(model.parameters(), lr=0.01, alpha=0.5, use_tf_variant=True)
    train(model, opt, steps=1)
    p = model[0].weight
    g = p.grad
    torch.testing.assert_close(opt.state[p]["square_avg"], 0.5 + 0.5 * g * g)


# ------------------------------------------------------------------------------- LAMB
@pytest.mark.parametrize("kw", [dict(), dict(bias_correction=False), dict(weight_decay=0.0),
                                dict(max_weight_norm=0.5), dict(max_weight_norm=0.5, bias_correction=False),
                                dict(betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)])
def test_lamb_matches_formula(kw):
    ours, _, _ = run(lambda p: optim.LAMB(p, lr=0.01, **kw))
    assert_same_weights(ours, hand_run(lamb_update, per_group(None, {**LAMB_DEFAULTS, **kw})))


def test_lamb_max_weight_norm_clamp_is_active():
    clamped, _, _ = run(lambda p: optim.LAMB(p, lr=0.01, max_weight_norm=0.5))
    free, _, _ = run(lambda p: optim.LAMB(p, lr=0.01))
    assert not torch.allclose(clamped[0].weight, free[0].weight)


def test_lamb_defaults():
    opt = optim.LAMB(make_model().parameters())
    d = opt.defaults
    assert (d["lr"], d["betas"], d["eps"], d["weight_decay"], d["max_weight_norm"]) == \
        (1e-3, (0.9, 0.999), 1e-8, 1e-2, 65500.0)
    assert opt.bias_correction is True and opt.loss_scaling == 1.0
    assert isinstance(opt, torch.optim.Optimizer) and isinstance(opt, optim.Optimizer)


def test_lamb_group_with_zero_max_weight_norm_is_adam_like():
    """BERT's recipe: biases get max_weight_norm=0 -> trust ratio 1."""
    spec = [dict(), dict(max_weight_norm=0.0, weight_decay=0.0)]
    ours, _, _ = run(lambda p: optim.LAMB(p, lr=0.01), spec=spec)
    assert_same_weights(ours, hand_run(lamb_update, per_group(spec, LAMB_DEFAULTS)))


# -------------------------------------------------------------------- PopTorch extras
def test_loss_scaling_is_not_applied_by_step():
    """The executor scales the loss and unscales the gradients; step() sees true gradients."""
    for cls, kw in [(optim.SGD, dict(lr=0.05, momentum=0.9)), (optim.Adam, {}), (optim.AdamW, {}),
                    (optim.RMSprop, {}), (optim.LAMB, {})]:
        scaled, opt, _ = run(lambda p, cls=cls, kw=kw: cls(p, loss_scaling=1024.0, **kw))
        plain, _, _ = run(lambda p, cls=cls, kw=kw: cls(p, **kw))
        assert opt.loss_scaling == 1024.0 and optim.loss_scaling_of(opt) == 1024.0
        assert_same_weights(scaled, plain)


@pytest.mark.parametrize("nesterov", [False, True])
def test_velocity_scaling_is_numerically_neutral(nesterov):
    kw = dict(lr=0.05, momentum=0.9, nesterov=nesterov, weight_decay=0.01)
    scaled, opt, _ = run(lambda p: optim.SGD(p, velocity_scaling=128.0, use_combined_accum=True, **kw))
    theirs, topt, _ = run(lambda p: torch.optim.SGD(p, **kw))
    assert_same_weights(scaled, theirs)
    # The buffer really is stored scaled ...
    for p, q in zip(scaled.parameters(), theirs.parameters()):
        torch.testing.assert_close(opt.state[p]["momentum_buffer"], 128.0 * topt.state[q]["momentum_buffer"],
                                   rtol=1e-5, atol=1e-4)
    # ... and state_dict() presents it unscaled, in torch's format.
    sd = opt.state_dict()
    for i, q in enumerate(theirs.parameters()):
        assert set(sd["state"][i]) == {"momentum_buffer"}
        torch.testing.assert_close(sd["state"][i]["momentum_buffer"], topt.state[q]["momentum_buffer"], **TOL)


def test_velocity_scaling_change_keeps_the_velocity():
    model, opt, _ = run(lambda p: optim.SGD(p, lr=0.05, momentum=0.9, velocity_scaling=4.0, use_combined_accum=True),
                        steps=5)
    for g in opt.param_groups:
        g["velocity_scaling"] = 64.0
    train(model, opt, steps=5)
    theirs, _, _ = run(lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))
    assert_same_weights(model, theirs)


def test_velocity_scaling_ignored_with_separate_variant(logs):
    model = make_model()
    opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9, velocity_scaling=8.0)
    assert any(level == logging.WARNING and "velocity_scaling value ignored when using the separate variant "
               "(use_combined_accum=False)" in msg for level, msg in logs)
    train(model, opt)
    theirs, topt, _ = run(lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))
    assert_same_weights(model, theirs)
    p, q = model[0].weight, theirs[0].weight
    torch.testing.assert_close(opt.state[p]["momentum_buffer"], topt.state[q]["momentum_buffer"])


@pytest.mark.parametrize("make_ours, make_torch", [
    (lambda p: optim.SGD(p, lr=0.1, momentum=0.9, max_grad_norm=0.05),
     lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
    (lambda p: optim.Adam(p, lr=0.01, max_grad_norm=0.05), lambda p: torch.optim.Adam(p, lr=0.01)),
    (lambda p: optim.AdamW(p, lr=0.01, max_grad_norm=0.05), lambda p: torch.optim.AdamW(p, lr=0.01)),
])
def test_max_grad_norm_equals_clip_grad_norm(make_ours, make_torch):
    ours, _, _ = run(make_ours)
    theirs, _, _ = run(make_torch, clip=0.05)
    assert_same_weights(ours, theirs)
    unclipped, _, _ = run(make_torch)
    assert not torch.allclose(ours[0].weight, unclipped[0].weight)


def test_max_grad_norm_leaves_gradients_alone_and_matches_formula():
    model = make_model()
    opt = optim.SGD(model.parameters(), lr=0.1, max_grad_norm=0.05)
    x, y = make_data()
    loss_of(model, x, y).backward()
    before = [p.grad.clone() for p in model.parameters()]
    opt.step()
    for b, p in zip(before, model.parameters()):
        assert torch.equal(b, p.grad)
    model, _, _ = run(lambda p: optim.SGD(p, lr=0.1, momentum=0.9, max_grad_norm=0.05))
    hand = hand_run(sgd_update, per_group(None, {**SGD_DEFAULTS, "lr": 0.1, "momentum": 0.9}), clip=0.05)
    assert_same_weights(model, hand)
    assert optim.SGD(make_model().parameters(), lr=0.1).max_grad_norm == math.inf


def stored_in_float16(update, keys, scale=1.0):
    """``update`` whose state entries ``keys`` are rounded to float16 after every step (the
    update itself uses the unrounded values: compute in float32, store in float16)."""
    def rounded(p, g, st, hp, t):
        out = update(p, g, st, hp, t)
        for k in keys:
            st[k] = (st[k] * scale).half().float() / scale
        return out
    return rounded


FP16_CASES = [
    (lambda p: optim.Adam(p, lr=0.01, first_order_momentum_accum_type=torch.float16),
     {"exp_avg": torch.float16, "exp_avg_sq": torch.float32},
     stored_in_float16(adam_update, ["m"]), ADAM_DEFAULTS),
    (lambda p: optim.AdamW(p, lr=0.01, first_order_momentum_accum_type=torch.float16,
                           second_order_momentum_accum_type=torch.float16),
     {"exp_avg": torch.float16, "exp_avg_sq": torch.float16},
     stored_in_float16(adam_update, ["m", "v"]), {**ADAM_DEFAULTS, "weight_decay": 1e-2, "decoupled": True}),
    (lambda p: optim.LAMB(p, lr=0.01, second_order_momentum_accum_type=torch.float16),
     {"exp_avg": torch.float32, "exp_avg_sq": torch.float16},
     stored_in_float16(lamb_update, ["v"]), LAMB_DEFAULTS),
    (lambda p: optim.SGD(p, lr=0.05, momentum=0.9, velocity_accum_type=torch.float16),
     {"momentum_buffer": torch.float16},
     stored_in_float16(sgd_update, ["buf"]), {**SGD_DEFAULTS, "momentum": 0.9}),
    (lambda p: optim.SGD(p, lr=0.05, momentum=0.9, use_combined_accum=True, accum_type=torch.float16,
                         velocity_scaling=16.0),
     {"momentum_buffer": torch.float16},
     stored_in_float16(sgd_update, ["buf"], scale=16.0), {**SGD_DEFAULTS, "momentum": 0.9}),
    (lambda p: optim.RMSprop(p, lr=0.01, momentum=0.9, centered=True,
                             first_order_momentum_accum_type=torch.float16,
                             second_order_momentum_accum_type=torch.float16),
     {"square_avg": torch.float16, "grad_avg": torch.float16, "momentum_buffer": torch.float32},
     stored_in_float16(rmsprop_update, ["ms", "mg"]), {**RMS_DEFAULTS, "momentum": 0.9, "centered": True}),
]


@pytest.mark.parametrize("factory, keys, update, hyper", FP16_CASES)
def test_float16_accumulators_store_state_in_float16(factory, keys, update, hyper):
    model, opt, _ = run(factory)
    for p in model.parameters():
        assert p.dtype == torch.float32
        for key, dtype in keys.items():
            assert opt.state[p][key].dtype == dtype, key
    assert_same_weights(model, hand_run(update, per_group(None, hyper)))


def test_float16_parameters_get_float32_state():
    model = make_model().half()
    opt = optim.Adam(model.parameters(), lr=0.01)
    x, y = make_data()
    loss_of(model, x.half(), y.half()).backward()
    opt.step()
    st = opt.state[model[0].weight]
    assert st["exp_avg"].dtype == torch.float32 and model[0].weight.dtype == torch.float16


def test_accumulator_flags():
    params = make_model().parameters
    assert optim.uses_float16_accumulators(optim.Adam(params(), accum_type=torch.float16))
    assert not optim.uses_float16_accumulators(optim.Adam(params()))
    assert not optim.uses_float16_accumulators(
        optim.SGD(params(), lr=0.1, accum_type=torch.float16, use_combined_accum=True))
    assert optim.uses_float16_accumulators(optim.SGD(params(), lr=0.1, accum_type=torch.float16))
    assert not optim.uses_float16_accumulators(torch.optim.SGD(params(), lr=0.1))
    assert optim.loss_scaling_of(torch.optim.Adam(params())) == 1.0


@pytest.mark.parametrize("cls, kw", [
    (optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
    (optim.Adam, dict(lr=0.01, weight_decay=0.01)),
    (optim.AdamW, dict(lr=0.01)),
    (optim.RMSprop, dict(lr=0.01, momentum=0.5)),
])
def test_per_group_settings_match_torch(cls, kw):
    spec = [dict(lr=kw["lr"] * 2, weight_decay=0.05), dict(lr=kw["lr"] / 2, weight_decay=0.0)]
    if cls in (optim.Adam, optim.AdamW):
        spec[1]["betas"] = (0.5, 0.9)
    if cls is optim.RMSprop:
        spec[1]["alpha"] = 0.9
    ours, _, _ = run(lambda p: cls(p, **kw), spec=spec)
    theirs, _, _ = run(lambda p: getattr(torch.optim, cls.__name__)(p, **kw), spec=spec)
    assert_same_weights(ours, theirs)


def test_per_group_lamb_settings():
    spec = [dict(lr=0.02, betas=(0.8, 0.9), max_weight_norm=1.0), dict(lr=0.005, weight_decay=0.0, eps=1e-5)]
    ours, _, _ = run(lambda p: optim.LAMB(p, lr=0.01), spec=spec)
    assert_same_weights(ours, hand_run(lamb_update, per_group(spec, LAMB_DEFAULTS)))


def test_per_group_velocity_scaling():
    spec = [dict(velocity_scaling=2.0), dict(velocity_scaling=1024.0)]
    ours, opt, _ = run(lambda p: optim.SGD(p, lr=0.05, momentum=0.9, use_combined_accum=True), spec=spec)
    assert [g["velocity_scaling"] for g in opt.param_groups] == [2.0, 1024.0]
    theirs, _, _ = run(lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))
    assert_same_weights(ours, theirs)


# ------------------------------------------------------------------- variable / constant
def test_variable_attrs_follow_explicit_arguments():
    params = make_model().parameters
    opt = optim.SGD(params(), lr=0.1, momentum=0.9, loss_scaling=2.0)
    va = opt.variable_attrs
    assert isinstance(va, optim.VariableAttributes)
    assert not va.isConstant("lr") and not va.isConstant("momentum") and not va.isConstant("loss_scaling")
    assert va.isConstant("weight_decay") and va.isConstant("dampening") and va.isConstant("velocity_scaling")
    va.markAsConstant("momentum")
    assert va.isConstant("momentum")
    va.markAsVariable("weight_decay")
    assert not va.isConstant("weight_decay")
    with pytest.raises(AssertionError, match="Unknown attribute foo"):
        va.markAsVariable("foo")
    # lr is variable even when left to its default
    for opt in [optim.Adam(params()), optim.AdamW(params()), optim.RMSprop(params()), optim.LAMB(params())]:
        assert not opt.variable_attrs.isConstant("lr")
        assert opt.variable_attrs.isConstant("eps") and opt.variable_attrs.isConstant("loss_scaling")
    lamb = optim.LAMB(params(), weight_decay=0.0, max_weight_norm=None)
    assert not lamb.variable_attrs.isConstant("weight_decay") and lamb.variable_attrs.isConstant("max_weight_norm")
    lamb.variable_attrs.markAsConstant("weight_decay")  # what BERT's recipe does
    assert lamb.variable_attrs.isConstant("weight_decay")


def test_constant_attribute_change_is_reported():
    model = make_model()
    opt = optim.AdamW(model.parameters(), lr=0.01, eps=1e-6)
    snap = optim.snapshot(opt)
    opt.param_groups[0]["lr"] = 0.5              # variable
    opt.param_groups[0]["eps"] = 1e-3             # variable: passed explicitly
    assert optim.constant_attribute_changes(snap, opt) == []
    opt.param_groups[0]["weight_decay"] = 0.0     # constant
    opt.loss_scaling = 8.0                        # constant
    changes = optim.constant_attribute_changes(snap, opt)
    assert changes == ["loss_scaling (optimizer: 1.0 -> 8.0)", "weight_decay (param group 0: 0.01 -> 0.0)"]
    err = optim.constant_attribute_error(changes)
    assert isinstance(err, Error)
    text = str(err)
    for part in ["weight_decay", "loss_scaling", "markAsVariable", "explicitly", "destroy()"]:
        assert part in text
    # A fresh optimizer object is judged against what was compiled.
    fresh = optim.AdamW(model.parameters(), lr=0.01, eps=1e-6, weight_decay=0.0)
    assert optim.constant_attribute_changes(snap, fresh) == ["weight_decay (param group 0: 0.01 -> 0.0)"]


def test_constant_attributes_of_torch_optimizers():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=0.01)
    snap = optim.snapshot(opt)
    va = optim.variable_attributes_of(opt)
    assert va.isConstant("momentum") and not va.isConstant("weight_decay") and not va.isConstant("lr")
    opt.param_groups[0]["weight_decay"] = 0.5
    opt.param_groups[0]["lr"] = 0.01
    assert optim.constant_attribute_changes(snap, opt) == []
    opt.param_groups[0]["momentum"] = 0.9
    assert optim.constant_attribute_changes(snap, opt) == ["momentum (param group 0: 0.0 -> 0.9)"]
    # Automatic loss scaling forces loss_scaling variable.
    popt = optim.SGD(model.parameters(), lr=0.1)
    snap = optim.snapshot(popt, force_variable=["loss_scaling"])
    popt.loss_scaling = 64.0
    assert optim.constant_attribute_changes(snap, popt) == []


# --------------------------------------------------------------------------- validation
def test_types_and_signatures():
    for name in ["SGD", "Adam", "AdamW", "RMSprop"]:
        cls = getattr(optim, name)
        assert issubclass(cls, getattr(torch.optim, name)) and issubclass(cls, optim.Optimizer)
    assert issubclass(optim.LAMB, torch.optim.Optimizer) and issubclass(optim.LAMB, optim.Optimizer)
    expected = {
        optim.SGD: "params lr momentum dampening weight_decay nesterov maximize foreach differentiable "
                   "loss_scaling velocity_scaling use_combined_accum accum_type velocity_accum_type max_grad_norm",
        optim.Adam: "params lr betas eps weight_decay amsgrad foreach maximize capturable differentiable fused "
                    "loss_scaling accum_type first_order_momentum_accum_type second_order_momentum_accum_type "
                    "max_grad_norm",
        optim.AdamW: "params lr betas eps weight_decay amsgrad maximize foreach capturable differentiable fused "
                     "loss_scaling bias_correction accum_type first_order_momentum_accum_type "
                     "second_order_momentum_accum_type max_grad_norm",
        optim.RMSprop: "params lr alpha eps weight_decay momentum centered foreach maximize differentiable "
                       "loss_scaling accum_type first_order_momentum_accum_type second_order_momentum_accum_type "
                       "use_tf_variant",
        optim.LAMB: "params lr betas eps weight_decay bias_correction loss_scaling max_weight_norm accum_type "
                    "first_order_momentum_accum_type second_order_momentum_accum_type",
    }
    for cls, names in expected.items():
        sig = inspect.signature(cls.__init__).parameters
        positional = [n for n, p in sig.items()
                      if n != "self" and p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD]
        assert positional == names.split(), cls
        assert all(p.default is None for n, p in sig.items() if n not in ("self", "params", "lr")), cls
    assert inspect.signature(optim.SGD.__init__).parameters["lr"].default is inspect.Parameter.empty
    assert optim.SGD._group_vars == ["lr", "momentum", "dampening", "weight_decay", "nesterov", "velocity_scaling"]
    assert optim.Adam._group_vars == ["lr", "betas", "eps", "weight_decay", "amsgrad"]
    assert optim.RMSprop._group_vars == ["lr", "momentum", "weight_decay", "alpha", "eps", "centered"]
    assert optim.LAMB._group_vars == ["lr", "weight_decay", "betas", "eps", "max_weight_norm"]


def test_current_torch_arguments_are_accepted():
    params = make_model().parameters
    optim.SGD(params(), lr=0.1, fused=False)
    optim.RMSprop(params(), capturable=False)
    optim.Adam(params(), decoupled_weight_decay=True)


def test_constructor_errors():
    params = make_model().parameters
    with pytest.raises(ValueError, match=r"^Only non-amsgrad Adam/AdamW optimizers are supported\.$"):
        optim.Adam(params(), amsgrad=True)
    with pytest.raises(ValueError, match="Only non-amsgrad"):
        optim.AdamW(params(), amsgrad=True)
    msg = r"^Accumulation types must be either torch.float32 or torch.float16$"
    for make in [lambda: optim.SGD(params(), lr=0.1, accum_type=torch.bfloat16),
                 lambda: optim.SGD(params(), lr=0.1, velocity_accum_type=torch.float64),
                 lambda: optim.Adam(params(), first_order_momentum_accum_type=torch.int32),
                 lambda: optim.AdamW(params(), second_order_momentum_accum_type=torch.bfloat16),
                 lambda: optim.RMSprop(params(), accum_type=torch.float64),
                 lambda: optim.LAMB(params(), accum_type=torch.bfloat16)]:
        with pytest.raises(AssertionError, match=msg):
            make()


def test_validate_accepts_supported_and_rejects_others(logs):
    params = make_model().parameters
    for opt in [torch.optim.SGD(params(), lr=0.1), torch.optim.Adam(params()), torch.optim.AdamW(params()),
                torch.optim.RMSprop(params()), optim.SGD(params(), lr=0.1), optim.Adam(params()),
                optim.AdamW(params()), optim.RMSprop(params()), optim.LAMB(params())]:
        optim.validate_optimizer(opt, False)
    assert not [m for level, m in logs if level >= logging.WARNING]
    with pytest.raises(AssertionError, match=r"^Unsupported optimizer type\. Types supported .*torch\.optim\.SGD"
                                             r".*poptorch\.optim\.LAMB.*LBFGS"):
        optim.validate_optimizer(torch.optim.LBFGS(params()), False)
    optim.validate_optimizer(torch.optim.Adagrad(params()), True)  # beyond PopTorch: runs its own step()
    with pytest.raises(AssertionError, match="Unsupported optimizer type"):
        optim.validate_optimizer(object(), True)
    amsgrad = torch.optim.Adam(params(), amsgrad=True)
    with pytest.raises(ValueError, match="Only non-amsgrad Adam/AdamW optimizers are supported."):
        optim.validate_optimizer(amsgrad, False)
    odd = torch.optim.SGD(params(), lr=0.1)
    odd.accum_type = torch.bfloat16
    with pytest.raises(ValueError, match="accum_type must be set to either torch.float16 or torch.float32"):
        optim.validate_optimizer(odd, False)


def test_validate_warns_about_subclasses_and_unknown_attributes(logs):
    class MySGD(torch.optim.SGD):
        pass

    params = make_model().parameters
    optim.validate_optimizer(MySGD(params(), lr=0.1), False)
    assert any("Optimizer `MySGD` subclassed from classes in poptorch.optim or torch.optim are unlikely to "
               "behave as intended." in m for _, m in logs)

    opt = optim.Adam(params())
    opt.loss_scale = 128.0  # typo for loss_scaling
    opt.param_groups[0]["momentum"] = 0.9
    opt._private = 1
    optim.validate_optimizer(opt, False)
    warned = [m for level, m in logs if level == logging.WARNING]
    assert "Ignoring unexpected optimizer attribute in ADAM optimizer: ['loss_scale']" in warned
    assert "Ignoring unexpected group 0 attribute in ADAM optimizer: ['momentum']" in warned
    optim.validate_optimizer(opt, False)  # once per optimizer and message
    assert len([m for level, m in logs if level == logging.WARNING]) == len(warned)

    relaxed = optim.AdamW(params(), bias_correction=False)
    relaxed.foo = 1
    optim.validate_optimizer(relaxed, True)
    assert (logging.DEBUG, "Ignoring unexpected optimizer attribute in ADAMW_NO_BIAS optimizer: ['foo']") in logs

    # A torch optimizer may carry the attributes the executor reads, not the others.
    topt = torch.optim.SGD(params(), lr=0.1)
    topt.loss_scaling, topt.accum_type, topt.max_grad_norm = 16.0, torch.float16, 1.0
    optim.validate_optimizer(topt, False)
    assert "Ignoring unexpected optimizer attribute in SGD2 optimizer: ['max_grad_norm']" in \
        [m for _, m in logs]
    assert optim.loss_scaling_of(topt) == 16.0 and optim.uses_float16_accumulators(topt)

    # An LR scheduler's additions are expected.
    sgd = optim.SGD(params(), lr=0.1)
    torch.optim.lr_scheduler.StepLR(sgd, 2)
    before = len(logs)
    optim.validate_optimizer(sgd, False)
    assert len(logs) == before


def test_optimizer_kind():
    params = make_model().parameters
    assert optim.optimizer_kind(optim.SGD(params(), lr=0.1)) == "SGD2"
    assert optim.optimizer_kind(optim.SGD(params(), lr=0.1, use_combined_accum=True)) == "SGD1"
    assert optim.optimizer_kind(torch.optim.AdamW(params())) == "ADAMW"
    assert optim.optimizer_kind(torch.optim.Adam(params())) == "ADAM"
    assert optim.optimizer_kind(optim.RMSprop(params(), centered=True)) == "RMSPROP_CENTERED"
    assert optim.optimizer_kind(optim.LAMB(params(), bias_correction=False)) == "LAMB_NO_BIAS"


def test_amsgrad_group_rejected_at_step():
    model = make_model()
    opt = optim.Adam(model.parameters())
    opt.param_groups[0]["amsgrad"] = True
    loss_of(model, *make_data()).backward()
    with pytest.raises(ValueError, match="Only non-amsgrad"):
        opt.step()


# ------------------------------------------------------------------------- state dicts
FACTORIES = {
    "sgd": lambda p: optim.SGD(p, lr=0.05, momentum=0.9),
    "sgd_vs": lambda p: optim.SGD(p, lr=0.05, momentum=0.9, use_combined_accum=True, velocity_scaling=32.0),
    "sgd_fp16": lambda p: optim.SGD(p, lr=0.05, momentum=0.9, velocity_accum_type=torch.float16),
    "adam": lambda p: optim.Adam(p, lr=0.01, weight_decay=0.01),
    "adamw": lambda p: optim.AdamW(p, lr=0.01),
    "adamw_nobias_fp16": lambda p: optim.AdamW(p, lr=0.01, bias_correction=False,
                                               first_order_momentum_accum_type=torch.float16),
    "rmsprop": lambda p: optim.RMSprop(p, lr=0.01, momentum=0.5, centered=True),
    "rmsprop_tf": lambda p: optim.RMSprop(p, lr=0.01, momentum=0.5, use_tf_variant=True),
    "lamb": lambda p: optim.LAMB(p, lr=0.01),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_state_dict_round_trip_through_torch_save(name):
    factory = FACTORIES[name]
    straight, _, _ = run(factory)

    model, opt, _ = run(factory, steps=4)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    resumed = make_model()
    resumed.load_state_dict(saved["model"])
    opt2 = factory(resumed.parameters())
    opt2.load_state_dict(saved["optim"])
    train(resumed, opt2, steps=STEPS - 4)
    assert_same_weights(resumed, straight)
    # The state keeps its configured dtypes after loading.
    for p in resumed.parameters():
        for key, value in opt2.state[p].items():
            if torch.is_tensor(value) and key != "step":
                assert value.dtype == opt.state[next(iter(model.parameters()))][key].dtype


def test_loaded_and_copied_optimizers_have_the_groups_of_a_new_one():
    """torch's Optimizer.__setstate__ adds a "differentiable" default that LAMB was built without;
    it must not reach LAMB's groups (a resumed BERT run's checkpoint differed from an uninterrupted
    run's, and PopTorch warned of the unexpected group attribute on every resume)."""
    for name, factory in sorted(FACTORIES.items()):
        opt = factory(make_model().parameters())
        keys = [set(group) for group in opt.param_groups]
        loaded = factory(make_model().parameters())
        loaded.load_state_dict(opt.state_dict())
        assert [set(group) for group in loaded.param_groups] == keys, name
        assert [set(group) for group in copy.deepcopy(opt).param_groups] == keys, name
        assert set(loaded.defaults) == set(opt.defaults), name


@pytest.mark.parametrize("ours, theirs", [
    (lambda p: optim.SGD(p, lr=0.05, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
    (lambda p: optim.SGD(p, lr=0.05, momentum=0.9, use_combined_accum=True, velocity_scaling=16.0),
     lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
    (lambda p: optim.Adam(p, lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
    (lambda p: optim.AdamW(p, lr=0.01, weight_decay=0.1), lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1)),
    (lambda p: optim.RMSprop(p, lr=0.01, momentum=0.5, centered=True),
     lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, centered=True)),
])
def test_torch_state_loads_into_openpop_and_back(ours, theirs):
    straight, _, _ = run(theirs)
    # torch -> openpop
    model, topt, _ = run(theirs, steps=4)
    opt = ours(model.parameters())
    opt.load_state_dict(copy.deepcopy(topt.state_dict()))
    train(model, opt, steps=STEPS - 4)
    assert_same_weights(model, straight)
    # openpop -> torch
    model, opt, _ = run(ours, steps=4)
    topt = theirs(model.parameters())
    topt.load_state_dict(copy.deepcopy(opt.state_dict()))
    train(model, topt, steps=STEPS - 4)
    assert_same_weights(model, straight)


def test_state_keys_match_torch():
    for ours, theirs in [(lambda p: optim.Adam(p), lambda p: torch.optim.Adam(p)),
                         (lambda p: optim.AdamW(p), lambda p: torch.optim.AdamW(p)),
                         (lambda p: optim.SGD(p, lr=0.1, momentum=0.9),
                          lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
                         (lambda p: optim.RMSprop(p, momentum=0.9, centered=True),
                          lambda p: torch.optim.RMSprop(p, momentum=0.9, centered=True))]:
        a = run(ours, steps=2)[1].state_dict()
        b = run(theirs, steps=2)[1].state_dict()
        assert {k: set(v) for k, v in a["state"].items()} == {k: set(v) for k, v in b["state"].items()}


def test_pickle_and_deepcopy_keep_poptorch_attributes():
    _model, opt, _ = run(lambda p: optim.AdamW(p, lr=0.01, loss_scaling=64.0, bias_correction=False,
                                              accum_type=torch.float16, max_grad_norm=1.0), steps=2)
    opt.variable_attrs.markAsVariable("weight_decay")
    for clone in [copy.deepcopy(opt), pickle.loads(pickle.dumps(opt))]:
        assert clone.loss_scaling == 64.0 and clone.bias_correction is False
        assert clone.accum_type == torch.float16 and clone.max_grad_norm == 1.0
        assert not clone.variable_attrs.isConstant("weight_decay")
        assert len(clone.state) == len(opt.state)


def test_lr_scheduler_drives_openpop_optimizers():
    ours, opt, _ = run(lambda p: optim.AdamW(p, lr=0.01), steps=0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    theirs, topt, _ = run(lambda p: torch.optim.AdamW(p, lr=0.01), steps=0)
    tsched = torch.optim.lr_scheduler.StepLR(topt, step_size=3, gamma=0.5)
    for _ in range(STEPS):
        train(ours, opt, steps=1)
        sched.step()
        train(theirs, topt, steps=1)
        tsched.step()
    assert opt.param_groups[0]["lr"] == topt.param_groups[0]["lr"] < 0.01
    assert_same_weights(ours, theirs)


def test_closure_and_params_without_grad():
    model = make_model()
    model[2].bias.requires_grad_(False)
    opt = optim.LAMB(model.parameters(), lr=0.01)
    x, y = make_data()

    def closure():
        opt.zero_grad()
        loss = loss_of(model, x, y)
        loss.backward()
        return loss

    before = model[2].bias.clone()
    loss = opt.step(closure)
    assert torch.is_tensor(loss)
    assert torch.equal(before, model[2].bias) and model[2].bias not in opt.state
