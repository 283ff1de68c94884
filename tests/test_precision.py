"""Numeric precision: half/bf16 models, autocast, automatic loss scaling, stochastic rounding,
floating-point exceptions and the precision options' validation - against fp32 oracles."""
import copy
import json

import pytest
import torch
import torch.nn.functional as F

import poptorch
from openpop.runtime.loss_scaling import DynamicLossScaling
from openpop.runtime.precision import cuda_matmul_partials, stochastic_round

from helpers.oracle import train_loop


class Net(torch.nn.Module):
    def __init__(self, width=32, classes=4):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, width)
        self.norm = torch.nn.LayerNorm(width)
        self.fc2 = torch.nn.Linear(width, classes)

    def forward(self, x, y):
        out = self.fc2(F.gelu(self.norm(self.fc1(x))))
        return out, F.cross_entropy(out, y)


def net_loss(model, x, y):
    return model(x, y)[1]


def make_data(rows, seed=1, classes=4):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 16, generator=g)
    return x, (x[:, :classes].argmax(dim=1))  # learnable labels


def options(di=1, ga=1, r=1, mode=poptorch.OutputMode.All):
    opts = poptorch.Options().deviceIterations(di).replicationFactor(r).outputMode(mode)
    opts.Training.gradientAccumulation(ga)
    opts.showCompilationProgressBar(False)
    return opts


def assert_params_close(a, b, **tol):
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p.float(), q.float(), **tol)


# ------------------------------------------------------------------ half / bf16 models
@pytest.mark.parametrize("dtype, tol", [(torch.float16, 1e-2), (torch.bfloat16, 4e-2)])
def test_low_precision_model_trains_like_fp32_oracle(dtype, tol):
    base = Net()
    model = copy.deepcopy(base).to(dtype)
    reference = copy.deepcopy(base)
    x, y = make_data(10 * 8)
    pop = poptorch.trainingModel(model, options(di=10), poptorch.optim.SGD(model.parameters(), lr=0.05))
    out, losses = pop(x.to(dtype), y)
    assert out.dtype == dtype and losses.dtype == dtype
    assert all(p.dtype == dtype for p in model.parameters())
    ref_losses = train_loop(reference, torch.optim.SGD(reference.parameters(), lr=0.05), (x, y), net_loss, 10, 1, 1)
    torch.testing.assert_close(losses.float(), ref_losses, rtol=tol, atol=tol)
    assert_params_close(model, reference, rtol=tol, atol=tol)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("dtype, tol", [(torch.float16, 1e-2), (torch.bfloat16, 4e-2)])
def test_low_precision_inference_matches_fp32(dtype, tol):
    base = Net().eval()
    x, y = make_data(12)
    pop = poptorch.inferenceModel(copy.deepcopy(base).to(dtype), options(di=3))
    out, _loss = pop(x.to(dtype), y)
    assert out.dtype == dtype
    with torch.no_grad():
        ref = base(x, y)[0]
    torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol)


class Distances(torch.nn.Module):
    """Uses torch.cdist, which has no float16/bfloat16 CPU kernel in torch 2.13."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 8)
        self.centres = torch.nn.Parameter(torch.randn(4, 8))

    def forward(self, x, y):
        logits = -torch.cdist(self.proj(x), self.centres)
        return logits, F.cross_entropy(logits, y)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_ops_without_low_precision_kernel_are_upcast(dtype):
    with pytest.raises(RuntimeError, match="not implemented for"):
        torch.cdist(torch.ones(2, 3, dtype=dtype), torch.ones(2, 3, dtype=dtype))
    base = Distances()
    model = copy.deepcopy(base).to(dtype)
    reference = copy.deepcopy(base)
    x, y = make_data(4 * 8)
    pop = poptorch.trainingModel(model, options(di=4), poptorch.optim.SGD(model.parameters(), lr=0.05))
    out, losses = pop(x.to(dtype), y)
    assert out.dtype == dtype
    ref_losses = train_loop(reference, torch.optim.SGD(reference.parameters(), lr=0.05), (x, y), net_loss, 4, 1, 1)
    torch.testing.assert_close(losses.float(), ref_losses, rtol=4e-2, atol=4e-2)
    assert_params_close(model, reference, rtol=4e-2, atol=4e-2)
    infer = poptorch.inferenceModel(model, options(di=1))
    assert infer(x[:8].to(dtype), y[:8])[0].dtype == dtype


def test_half_model_with_poptorch_adam_keeps_fp32_state():
    base = Net()
    model = copy.deepcopy(base).half()
    reference = copy.deepcopy(base)
    x, y = make_data(5 * 8)
    opt = poptorch.optim.Adam(model.parameters(), lr=1e-2)
    pop = poptorch.trainingModel(model, options(di=5), opt)
    _, losses = pop(x.half(), y)
    ref_losses = train_loop(reference, torch.optim.Adam(reference.parameters(), lr=1e-2), (x, y), net_loss, 5, 1, 1)
    torch.testing.assert_close(losses.float(), ref_losses, rtol=1e-2, atol=1e-2)
    state = opt.state[model.fc1.weight]
    assert state["exp_avg"].dtype == torch.float32 and state["exp_avg_sq"].dtype == torch.float32
    assert_params_close(model, reference, rtol=2e-2, atol=2e-2)


# ------------------------------------------------------------------ autocast
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_training_reaches_fp32_loss(dtype):
    base = Net(width=64)
    x, y = make_data(40 * 16, seed=3)
    results = {}
    for name, enabled in (("fp32", False), ("mixed", True)):
        model = copy.deepcopy(base)
        opts = options(di=40)
        opts.Precision.autocast(enabled, dtype)
        pop = poptorch.trainingModel(model, opts, poptorch.optim.Adam(model.parameters(), lr=1e-2))
        out, losses = pop(x, y)
        results[name] = (model, out, losses)
        assert all(p.dtype == torch.float32 for p in model.parameters())  # fp32 weights
    fp32, mixed = results["fp32"], results["mixed"]
    assert fp32[1].dtype == torch.float32 and mixed[1].dtype == dtype  # the linear layer ran in low precision
    assert mixed[2].dtype == torch.float32  # cross_entropy runs in fp32 under autocast
    final32, final_mixed = fp32[2][-5:].mean(), mixed[2][-5:].mean()
    assert final32 < 0.5 * fp32[2][0]
    assert abs(final_mixed - final32) < 0.05 + 0.1 * final32
    assert_params_close(mixed[0], fp32[0], rtol=0.1, atol=0.05)


def test_autocast_inference():
    model = Net().eval()
    x, y = make_data(8)
    opts = options()
    opts.Precision.autocast()
    out, loss = poptorch.inferenceModel(model, opts)(x, y)
    assert out.dtype == torch.bfloat16 and loss.dtype == torch.float32
    with torch.no_grad():
        torch.testing.assert_close(out.float(), model(x, y)[0], rtol=5e-2, atol=5e-2)
    # Not applied outside the executor.
    assert model(x, y)[0].dtype == torch.float32


# ------------------------------------------------------------------ automatic loss scaling
def _state_copy(optimizer):
    return {id(p): {k: v.clone() if torch.is_tensor(v) else v for k, v in st.items()}
            for p, st in optimizer.state.items()}


def _assert_same_state(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].keys() == b[key].keys()
        for name in a[key]:
            assert torch.equal(torch.as_tensor(a[key][name]), torch.as_tensor(b[key][name])), name


def test_automatic_loss_scaling_grows_backs_off_and_skips():
    model = Net()
    opts = options(mode=poptorch.OutputMode.Final)
    opts.Training.setAutomaticLossScaling(True, growth_interval=2)
    opt = poptorch.optim.Adam(model.parameters(), lr=1e-2, loss_scaling=16.0)
    pop = poptorch.trainingModel(model, opts, opt)
    x, y = make_data(8)
    scales = []
    for _ in range(4):
        pop(x, y)
        scales.append(opt.loss_scaling)
    assert scales == [16.0, 32.0, 32.0, 64.0]
    weights = copy.deepcopy(model.state_dict())
    state = _state_copy(opt)
    bad = x.clone()
    bad[0, 0] = float("inf")
    pop(bad, y)  # non-finite gradients: skipped, scale halved
    assert opt.loss_scaling == 32.0
    for name, value in model.state_dict().items():
        assert torch.equal(value, weights[name]), name
    _assert_same_state(_state_copy(opt), state)
    assert all(p.grad is None for p in model.parameters())
    pop(x, y)  # the growth count restarted after the skip
    assert opt.loss_scaling == 32.0
    assert not torch.equal(model.fc1.weight, weights["fc1.weight"])
    pop(x, y)
    assert opt.loss_scaling == 64.0


def test_automatic_loss_scaling_backs_off_until_fp16_gradients_fit():
    """A float16 model whose scaled loss overflows: steps are skipped and the scale halves
    until the gradients fit, then training proceeds."""
    model = Net().half()
    opts = options(di=20)
    opts.Training.setAutomaticLossScaling(True)
    opt = poptorch.optim.SGD(model.parameters(), lr=0.05, loss_scaling=2.0 ** 24)
    pop = poptorch.trainingModel(model, opts, opt)
    before = copy.deepcopy(model)
    x, y = make_data(20 * 8)
    _, losses = pop(x.half(), y)
    assert opt.loss_scaling < 2.0 ** 16
    assert pop._precision.dynamic.skipped_steps >= 8
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert not torch.equal(before.fc1.weight, model.fc1.weight)
    assert losses[-1] < losses[0]


def test_dynamic_loss_scaling_rule():
    rule = DynamicLossScaling(growth_factor=3.0, backoff_factor=0.25, growth_interval=2)
    scale = 8.0
    trace = []
    for finite in (True, True, True, False, True, True):
        scale = rule.next_scale(scale, finite)
        trace.append(scale)
    assert trace == [8.0, 24.0, 24.0, 6.0, 6.0, 18.0]
    assert rule.skipped_steps == 1


def test_automatic_loss_scaling_with_torch_optimizer_and_settings_dict():
    opts = poptorch.Options()
    opts.Training.setAutomaticLossScaling(True)
    assert opts.Training.automaticLossScalingSettings == {"enabled": True}
    opts.Training.setAutomaticLossScaling(True, growth_factor=4, backoff_factor=0.5, growth_interval=1)
    assert opts.Training.automaticLossScalingSettings == {
        "enabled": True, "growth_factor": 4.0, "backoff_factor": 0.5, "growth_interval": 1}
    opts.showCompilationProgressBar(False)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    pop = poptorch.trainingModel(model, opts, opt)
    x, y = make_data(8)
    pop(x, y)
    pop(x, y)
    assert opt.loss_scaling == 16.0  # torch optimizers start from 1.0


def _parity_models(kind):
    base = Net()
    model, reference = copy.deepcopy(base), copy.deepcopy(base)
    if kind == "sgd":
        opt = poptorch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, loss_scaling=1024.0)
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    else:
        opt = poptorch.optim.LAMB(model.parameters(), lr=1e-2, loss_scaling=1024.0)
        ref_opt = poptorch.optim.LAMB(reference.parameters(), lr=1e-2)  # step() alone: no scaling
    return model, reference, opt, ref_opt


@pytest.mark.parametrize("kind", ["sgd", "lamb"])
@pytest.mark.parametrize("automatic", [False, True])
def test_loss_scaling_accumulation_replication_parity(kind, automatic):
    """10 steps through trainingModel (loss scaling, GA=2, 2 replicas) equal the plain loop."""
    di, ga, r = 5, 2, 2
    model, reference, opt, ref_opt = _parity_models(kind)
    opts = options(di, ga, r)
    if automatic:
        opts.Training.setAutomaticLossScaling(True, growth_interval=3)
    pop = poptorch.trainingModel(model, opts, opt)
    for call in range(2):
        x, y = make_data(di * ga * r * 4, seed=10 + call)
        _, losses = pop(x, y)
        ref_losses = train_loop(reference, ref_opt, (x, y), net_loss, di, ga, r)
        torch.testing.assert_close(losses.reshape(-1), ref_losses, rtol=1e-5, atol=1e-5)
    assert_params_close(model, reference, rtol=1e-5, atol=1e-5)
    assert opt.loss_scaling == (1024.0 * 2 ** 3 if automatic else 1024.0)


# ------------------------------------------------------------------ stochastic rounding
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_stochastic_round_is_unbiased_and_picks_neighbours(dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.rand(50_000) * 4 - 2
    rounded = stochastic_round(x, dtype, g)
    assert rounded.dtype == dtype
    nearest = x.to(dtype)
    up = torch.nextafter(nearest, torch.full_like(nearest, float("inf"))).float()
    down = torch.nextafter(nearest, torch.full_like(nearest, float("-inf"))).float()
    r = rounded.float()
    assert bool(((r == nearest.float()) | (r == up) | (r == down)).all())
    assert bool(((r - x).abs() <= (up - down).abs()).all())
    representable = nearest.float()
    assert torch.equal(stochastic_round(representable, dtype, g), nearest)
    # Unbiased: the mean rounding error vanishes, unlike round-to-nearest's for a fixed offset.
    ulp = (torch.nextafter(torch.tensor(1.0, dtype=dtype), torch.tensor(2.0, dtype=dtype)).float() - 1).item()
    value = torch.full((200_000,), 1.0 + 0.3 * ulp)
    mean = stochastic_round(value, dtype, g).float().mean().item()
    assert abs(mean - (1.0 + 0.3 * ulp)) < 0.02 * ulp
    assert value.to(dtype).float().mean().item() == 1.0
    special = torch.tensor([float("inf"), float("-inf"), 0.0])
    assert torch.equal(stochastic_round(special, dtype, g).float(), special)
    assert torch.isnan(stochastic_round(torch.tensor([float("nan")]), dtype, g)).all()


class Plane(torch.nn.Module):
    """loss = sum(w): every weight gets gradient 1, so SGD subtracts lr from each."""

    def __init__(self, n, dtype):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(n, dtype=dtype))

    def forward(self, x):
        return poptorch.identity_loss((self.w * x).sum(), reduction="sum")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("optimizer", ["poptorch", "torch"])
def test_stochastic_rounding_of_weight_updates(dtype, optimizer):
    """Updates far below half an ulp vanish with round-to-nearest; with stochastic rounding
    the mean of the rounded weights approaches the exact result."""
    n, steps = 100_000, 10
    ulp_below_one = 2.0 ** -11 if dtype == torch.float16 else 2.0 ** -8
    lr = ulp_below_one / 8
    finals = {}
    for rounding in (False, True):
        model = Plane(n, dtype)
        opts = options(di=steps)
        opts.Precision.enableStochasticRounding(rounding)
        cls = poptorch.optim.SGD if optimizer == "poptorch" else torch.optim.SGD
        pop = poptorch.trainingModel(model, opts, cls(model.parameters(), lr=lr))
        pop(torch.ones(steps, 1))
        assert model.w.dtype == dtype
        finals[rounding] = model.w.detach().float()
    assert torch.equal(finals[False], torch.ones(n))  # every update was rounded away
    exact = 1.0 - steps * lr
    mean = finals[True].mean().item()
    assert abs(mean - exact) < 0.02 * (1.0 - exact)
    assert finals[True].unique().numel() > 1


def test_stochastic_rounding_leaves_fp32_models_alone():
    base = Net()
    x, y = make_data(3 * 8)
    models = []
    for rounding in (False, True):
        model = copy.deepcopy(base)
        opts = options(di=3)
        opts.Precision.enableStochasticRounding(rounding)
        poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1))(x, y)
        models.append(model)
    assert_params_close(models[0], models[1], rtol=0, atol=0)


def test_stochastic_rounding_compiles_where_it_rounds_nothing():
    """The compiled backend runs a float32 model with stochastic rounding on (eager rounds no
    float32 weight) as eager does."""
    base = Net()
    x, y = make_data(3 * 8)
    models = []
    for backend in ("eager", "compiled"):
        model = copy.deepcopy(base)
        opts = options(di=3).openpopBackend(backend)
        opts.Precision.enableStochasticRounding(True)
        pop = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1))
        pop(x, y)
        assert pop._dispatch.compiled.last == backend
        models.append(model)
    assert_params_close(models[0], models[1], rtol=1e-5, atol=1e-6)


def rounded_half_run(base, backend, dtype, make_optimizer, di=3, rounding=True, compile_first=False, stepwise=None):
    """``base`` trained by two host calls (DI ``di`` x GA 2) with stochastic rounding: the model and
    openpop's rounding generators' states after them."""
    model = copy.deepcopy(base)
    opts = options(di=di, ga=2).openpopBackend(backend).randomSeed(7)
    opts.Precision.enableStochasticRounding(rounding)
    pop = poptorch.trainingModel(model, opts, make_optimizer(model.parameters()))
    for call in range(2):
        x, y = make_data(di * 2 * 4, seed=call)
        inputs = (x[:, :1].to(dtype),) if isinstance(base, Plane) else (x.to(dtype), y)
        if compile_first and call == 0:
            pop.compile(*inputs)  # a dry run: draws nothing
        pop(*inputs)
        assert pop._dispatch.compiled.last == backend
    if stepwise is not None:
        assert pop._dispatch.compiled._program.stepwise == stepwise
    return model, {device: g.get_state() for device, g in pop._precision.generators.items()}


@pytest.mark.parametrize("di", [3, 1])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_compiled_program_rounds_half_weights_as_eager(dtype, di):
    """The program rounds with numbers the host draws from openpop's generator in eager's order
    (step after step, weight after weight): with exact gradients the weights equal eager's bit for
    bit, and the generator ends where eager's does. Half weights trace under ``LowPrecisionOps``:
    at DI 3 the host loops over one-step programs, at DI 1 the program is the step."""
    base = Plane(1000, dtype)
    with torch.no_grad():
        base.w.mul_(torch.linspace(0.5, 2.0, 1000, dtype=dtype))

    def sgd(params):
        return poptorch.optim.SGD(params, lr=2.0 ** -13, momentum=0.9)

    eager, eager_generators = rounded_half_run(base, "eager", dtype, sgd, di=di)
    compiled, compiled_generators = rounded_half_run(base, "compiled", dtype, sgd, di=di, compile_first=True,
                                                     stepwise=di > 1)
    assert torch.equal(eager.w, compiled.w)
    assert eager_generators.keys() == compiled_generators.keys() and eager_generators
    for device, state in eager_generators.items():
        assert torch.equal(state, compiled_generators[device])
    nearest, _ = rounded_half_run(base, "eager", dtype, sgd, di=di, rounding=False)
    assert (nearest.w != compiled.w).sum() > 20  # the rounding was stochastic


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_compiled_program_rounds_a_half_network_as_eager(dtype):
    """A half network with AdamW: its float16 gradients differ from eager's by an ulp here and
    there (as without rounding), so the weights end within a step of eager's."""
    torch.manual_seed(0)
    base = Net().to(dtype)

    def adamw(params):
        return poptorch.optim.AdamW(params, lr=1e-3)

    eager, _ = rounded_half_run(base, "eager", dtype, adamw)
    compiled, _ = rounded_half_run(base, "compiled", dtype, adamw)
    ulp = 2.0 ** -10 if dtype == torch.float16 else 2.0 ** -7
    for p, q in zip(eager.parameters(), compiled.parameters()):
        torch.testing.assert_close(p.float(), q.float(), rtol=2 * ulp, atol=1e-4)  # (a tenth of a step)


@pytest.mark.parametrize("di", [3, 1])
def test_compiled_program_rounds_as_eager_when_automatic_loss_scaling_skips_steps(di):
    """Eager draws no rounding numbers for a step automatic loss scaling skips: the program, whose
    numbers are drawn before each step runs, puts openpop's generators back after a skipped step.
    Weights, loss scale and generator end equal eager's bit for bit (DI 3: one-step programs in a
    host loop; DI 1: the program is the step)."""
    base = Plane(1000, torch.float16)
    with torch.no_grad():
        base.w.mul_(torch.linspace(0.5, 2.0, 1000, dtype=torch.float16))
    x = torch.full((3 * 2, 1), 2.0 ** -10, dtype=torch.float16)
    x[2:4] = float("inf")  # the second step's gradients: skipped, the scale halves
    runs = {}
    for backend in ("eager", "compiled"):
        model = copy.deepcopy(base)
        opts = options(di=di, ga=2).openpopBackend(backend).randomSeed(7)
        opts.Precision.enableStochasticRounding(True)
        opts.Training.setAutomaticLossScaling(True)
        optimizer = poptorch.optim.SGD(model.parameters(), lr=2.0 ** -3, loss_scaling=8.0)
        pop = poptorch.trainingModel(model, opts, optimizer)
        for rows in ([x] if di == 3 else [x[0:2], x[2:4], x[4:6]]):
            pop(rows)
            assert pop._dispatch.compiled.last == backend
        runs[backend] = (model.w.detach().clone(), optimizer.loss_scaling, pop._precision.dynamic.skipped_steps,
                         {device: g.get_state() for device, g in pop._precision.generators.items()})
    (w_e, scale_e, skipped_e, gen_e), (w_c, scale_c, skipped_c, gen_c) = runs["eager"], runs["compiled"]
    assert skipped_e == skipped_c == 1 and scale_e == scale_c == 4.0
    assert torch.equal(w_e, w_c)
    assert gen_e.keys() == gen_c.keys() and all(torch.equal(gen_e[d], gen_c[d]) for d in gen_e)
    assert not torch.equal(w_e, base.w)


# ------------------------------------------------------------------ floating-point exceptions
class Body(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.lin = torch.nn.Linear(16, 8)
        self.fn = fn

    def forward(self, x):
        return self.fn(self.lin(x))


class Wrapper(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.body = Body(fn)

    def forward(self, x):
        return poptorch.identity_loss(self.body(x).sum(), reduction="sum")


FORWARD_FAULTS = {
    "division by zero": (lambda h: 1.0 / (h * 0), "Tensor.__rdiv__", "inf"),
    "overflow": (lambda h: torch.exp(h * 0 + 3800), "torch.exp", "inf"),
    "sqrt(-1)": (lambda h: torch.sqrt(-(h.abs()) - 1), "torch.sqrt", "NaN"),
}


@pytest.mark.parametrize("fault", sorted(FORWARD_FAULTS))
@pytest.mark.parametrize("training", [True, False])
def test_floating_point_exceptions_in_forward(fault, training):
    fn, op, value = FORWARD_FAULTS[fault]
    model = Wrapper(fn)
    weights = copy.deepcopy(model.state_dict())
    opts = options()
    opts.Precision.enableFloatingPointExceptions(True)
    x = torch.randn(4, 16)
    pop = poptorch.trainingModel(model, opts) if training else poptorch.inferenceModel(model, opts)
    with pytest.raises(poptorch.Error, match="Floating point exception in the forward pass") as info:
        pop(x)
    assert op in str(info.value) and "module 'body' (Body)" in str(info.value)
    assert f"produced {value}" in str(info.value)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, weights[name])
    # Without the option the same model runs and returns the non-finite value.
    quiet = Wrapper(fn)
    opts = options()
    result = poptorch.trainingModel(quiet, opts)(x) if training else poptorch.inferenceModel(quiet, opts)(x)
    assert not torch.isfinite(result).all()


BACKWARD_FAULTS = {
    # forward finite (0), backward 1 / (2 * sqrt(0)) = inf
    "inf": (lambda h: torch.sqrt(torch.relu(h) * 0), "SqrtBackward0"),
    # forward finite (0), backward 0 * inf = NaN
    "NaN": (lambda h: torch.sqrt(torch.relu(h) * 0) * 0, "SqrtBackward0"),
}


@pytest.mark.parametrize("kind", sorted(BACKWARD_FAULTS))
def test_floating_point_exceptions_in_backward(kind):
    fn, node = BACKWARD_FAULTS[kind]
    model = Wrapper(fn)
    weights = copy.deepcopy(model.state_dict())
    opts = options()
    opts.Precision.enableFloatingPointExceptions(True)
    opt = poptorch.optim.Adam(model.parameters(), lr=0.1)
    pop = poptorch.trainingModel(model, opts, opt)
    with pytest.raises(poptorch.Error, match="Floating point exception in the backward pass") as info:
        pop(torch.randn(4, 16))
    text = str(info.value)
    assert node in text and "torch.sqrt in module 'body' (Body)" in text and f"produced {kind}" in text
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, weights[name])
    assert not opt.state


def test_floating_point_exceptions_allow_infinite_masks_and_nan_checks():
    """-inf attention masks and isnan() are legitimate; an ordered comparison with NaN is not."""
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = layer

        def forward(self, x, mask):
            return poptorch.identity_loss(self.layer(x, src_key_padding_mask=mask).pow(2).mean(), "none")

    opts = options()
    opts.Precision.enableFloatingPointExceptions(True)
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[:, -2:] = True
    pop = poptorch.trainingModel(Encoder(), opts)
    assert torch.isfinite(pop(torch.randn(2, 5, 16), mask))

    class Compare(torch.nn.Module):
        def forward(self, x):
            return torch.isnan(x).sum(), (x > 0).sum()

    opts = options()
    opts.Precision.enableFloatingPointExceptions(True)
    with pytest.raises(poptorch.Error, match="Tensor.gt in the top-level module .Compare. compared with NaN"):
        poptorch.inferenceModel(Compare(), opts)(torch.tensor([[1.0, float("nan")]]))


def test_floating_point_exceptions_catch_inplace_ops():
    class InPlace(torch.nn.Module):
        def forward(self, x):
            return x.clone().mul_(1e30).mul_(1e30)

    opts = options()
    opts.Precision.enableFloatingPointExceptions(True)
    with pytest.raises(poptorch.Error, match="Tensor.mul_ in the top-level module .InPlace. produced inf"):
        poptorch.inferenceModel(InPlace(), opts)(torch.ones(1, 3))


def test_floating_point_exceptions_with_pipelined_recomputation_train_like_oracle():
    """The checker's finiteness tests must not enter autograd: a recomputed block (pipelined
    training recomputes by default, without the checker) has to save what its forward saved.
    Found by Graphcore's frozen_in_time, whose configs enable both."""
    class Piped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = poptorch.BeginBlock(torch.nn.Linear(16, 32), ipu_id=0)
            self.b = poptorch.BeginBlock(torch.nn.Linear(32, 4), ipu_id=1)

        def forward(self, x, y):
            return poptorch.identity_loss(F.cross_entropy(self.b(F.gelu(self.a(x))), y), "mean")

    torch.manual_seed(0)
    model = Piped()
    ref = copy.deepcopy(model)
    opts = options(ga=4, mode=poptorch.OutputMode.All)
    opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.SameAsIpu))
    opts.Precision.enableFloatingPointExceptions(True)
    pop = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = make_data(16)
    losses = pop(x, y)
    expected = train_loop(ref, torch.optim.SGD(ref.parameters(), lr=0.1), (x, y),
                          lambda m, a, b: m(a, b), di=1, ga=4, r=1)
    torch.testing.assert_close(losses.reshape(-1), expected)
    pop.copyWeightsToHost()
    assert_params_close(model, ref)


# ------------------------------------------------------------------ partials
def test_half_partials_on_cpu_keep_fp32_accumulation():
    base = Net().half().eval()
    x, y = make_data(8)
    outs = []
    for dtype in (torch.float, torch.half):
        opts = options()
        opts.Precision.setPartialsType(dtype)
        outs.append(poptorch.inferenceModel(copy.deepcopy(base), opts)(x.half(), y)[0])
    assert torch.equal(outs[0], outs[1])


def test_cuda_partials_switches_are_set_and_restored():
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_fp16_reduced_precision_reduction
    with cuda_matmul_partials(half=False):
        assert matmul.allow_fp16_reduced_precision_reduction is False
        assert matmul.allow_bf16_reduced_precision_reduction is False
    with cuda_matmul_partials(half=True):
        assert matmul.allow_fp16_reduced_precision_reduction is True
    assert matmul.allow_fp16_reduced_precision_reduction == before


# ------------------------------------------------------------------ options and bad input
def test_autocast_option_is_stored_and_serialised():
    opts = options()
    assert opts.Precision.autocast_enabled is False and opts.Precision.autocast_dtype == torch.bfloat16
    assert opts.Precision.autocast() is opts.Precision
    assert opts.Precision.autocast_enabled is True
    opts.Precision.autocast(True, torch.float16)
    d = opts.toDict()
    assert d["autocast_enabled"] is True and d["autocast_dtype"] == torch.float16
    assert opts.clone().Precision.autocast_dtype == torch.float16
    via_json = poptorch.Options().from_json(json.dumps({"Precision.autocast": [True, "bf16"]}))
    assert via_json.Precision.autocast_enabled and via_json.Precision.autocast_dtype == torch.bfloat16


@pytest.mark.parametrize("call, error, text", [
    (lambda p: p.autocast(1), ValueError, r"Precision.autocast\(enabled=...\) needs a bool"),
    (lambda p: p.autocast(True, torch.float32), ValueError, "must be torch.bfloat16 or torch.float16"),
    (lambda p: p.autocast(True, "fp8"), ValueError, "must be torch.bfloat16 or torch.float16"),
    (lambda p: p.autocast(True, 16), ValueError, "must be torch.bfloat16 or torch.float16"),
    (lambda p: p.enableStochasticRounding("yes"), AssertionError,
     "^enableStochasticRounding needs to be set to a bool$"),
    (lambda p: p.enableFloatingPointExceptions(None), AssertionError, "needs to be set to a bool"),
    (lambda p: p.setPartialsType("half"), ValueError, "should be eithertorch.float or torch.half"),
])
def test_precision_setters_reject_wrong_types(call, error, text):
    opts = poptorch.Options()
    with pytest.raises(error, match=text):
        call(opts.Precision)
    assert opts.Precision.autocast_enabled is False and opts.Precision.stochastic_rounding is False


@pytest.mark.parametrize("kwargs, text", [
    ({"enabled": 1}, "^setAutomaticLossScaling needs to be set to a bool$"),
    ({"enabled": True, "growth_factor": 1.0}, "growth_factor must be a number > 1"),
    ({"enabled": True, "growth_factor": "2"}, "growth_factor must be a number > 1"),
    ({"enabled": True, "backoff_factor": 1.5}, "backoff_factor must be a number between 0 and 1"),
    ({"enabled": True, "growth_interval": 0}, "growth_interval must be a positive int"),
    ({"enabled": True, "growth_interval": 2.5}, "growth_interval must be a positive int"),
])
def test_automatic_loss_scaling_rejects_bad_input(kwargs, text):
    training = poptorch.Options().Training
    with pytest.raises((AssertionError, ValueError), match=text):
        training.setAutomaticLossScaling(**kwargs)
    assert training.automaticLossScalingSettings == {"enabled": False}


def test_saved_programs_tell_rounding_from_rounding_to_nearest(tmp_path):
    """The executable cache keys a program by whether it rounds stochastically: the same half
    model without rounding does not load the rounding program (nor the other way round)."""
    base = Plane(100, torch.float16)
    finals, sources = {}, []
    for rounding in (True, False, True):
        for backend in ("eager", "compiled"):
            model = copy.deepcopy(base)
            opts = options(ga=2).openpopBackend(backend).randomSeed(7).enableExecutableCaching(str(tmp_path))
            opts.Precision.enableStochasticRounding(rounding)
            pop = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=2.0 ** -13))
            for call in range(2):
                pop(make_data(8, seed=call)[0][:, :1].half())
            finals[backend] = model.w.detach().clone()
        assert torch.equal(finals["eager"], finals["compiled"]), rounding
        sources.append(pop._dispatch.compiled._program.saved.source)
    assert sources == ["saved", "saved", "loaded"]  # (not "traced": a program of the other kind, not run)
