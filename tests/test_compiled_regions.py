"""The compiled backend's unit "regions" (runtime/compiled/regions.py): the model's blocks
compiled one by one, the host call run by the eager backend. Which modules are regions, training
and inference against the eager backend and a hand-written loop, one compiled graph for identical
blocks, the user's model left as it was, compile() leaving no trace, the auto rule and bad input."""
import copy
import logging

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import poptorch
from openpop.runtime.compiled import compile_cost, fused_updates
from openpop.runtime.compiled import regions as regions_module
from openpop.runtime.compiled.fused_updates import FusedUpdate
from openpop.runtime.compiled.regions import distinct_share, find_regions

from helpers.logs import logged
from helpers.models import FourBlocks
from helpers.oracle import train_loop

DI, GA = 2, 2


class Layer(torch.nn.Module):
    """An encoder-like block: three equal projections (not blocks themselves), norm, dropout."""

    def __init__(self, width=16, dropout=0.0):
        super().__init__()
        # (k without a bias: its gradient is rounding noise - softmax ignores a shift of a row's
        # scores - which LAMB's normalised update would amplify into different weights)
        self.q, self.k, self.v = (torch.nn.Linear(width, width, bias=name != "k") for name in "qkv")
        self.norm = torch.nn.LayerNorm(width)
        self.dropout = dropout

    def forward(self, x):
        scores = torch.softmax(self.q(x) @ self.k(x).transpose(-2, -1), dim=-1)
        mixed = F.dropout(scores @ self.v(x), self.dropout, self.training)
        return self.norm(x + torch.tanh(mixed))


class Stack(torch.nn.Module):
    def __init__(self, layers=3, dropout=0.0):
        super().__init__()
        self.embed = torch.nn.Linear(8, 16)
        self.encoder = torch.nn.Sequential()  # (a container holding the repeats: visited)
        self.encoder.layers = torch.nn.ModuleList(Layer(dropout=dropout) for _ in range(layers))
        self.act = torch.nn.GELU()  # no parameters: never a region
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x, target=None):
        h = self.act(self.embed(x))
        for layer in self.encoder.layers:
            h = layer(h)
        out = self.head(h).squeeze(-1)
        return out if target is None else F.mse_loss(out, target)


def stack_loss(model, x, target):
    return model(x, target)


def data(steps=DI, ga=GA, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(steps * ga * 2, 4, 8, generator=generator), torch.randn(steps * ga * 2, 4, generator=generator)


def training(model, unit="regions", backend="compiled", ga=GA, optimizer=None):
    opts = poptorch.Options().deviceIterations(DI).openpopBackend(backend, unit=unit)
    opts.Training.gradientAccumulation(ga)
    optimizer = optimizer or poptorch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return poptorch.trainingModel(model, opts, optimizer)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------------------- which regions
def test_regions_are_the_repeated_blocks_and_the_rest_of_the_model():
    model = Stack()
    regions = find_regions(model)
    assert regions == [model.embed, *model.encoder.layers, model.head]
    share, graphs = distinct_share(model, regions)
    assert graphs == 3  # embed, one layer, head
    total = len(list(model.modules()))
    assert share == pytest.approx((total - 2 * len(list(model.encoder.layers[0].modules()))) / total)


def test_regions_without_repeats_are_the_children_and_containers_are_visited():
    model = FourBlocks()  # four Linear leaves in a ModuleList: no blocks repeat, the list has no forward
    assert find_regions(model) == list(model.layers)
    layer = Layer()
    assert find_regions(layer) == [layer.q, layer.k, layer.v, layer.norm]  # the model itself is never one


# ---------------------------------------------------------------------------- training
class Bypassed(torch.nn.Module):
    """Its ``forward`` is never called: the model calls ``body`` itself."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

    def forward(self, x):
        raise AssertionError("not called")


class CallsInside(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wrapper = Bypassed()

    def forward(self, x, target):
        return F.mse_loss(self.wrapper.body(x).squeeze(-1), target)


def test_a_region_the_model_does_not_call_gives_way_to_the_regions_under_it():
    model = CallsInside()
    assert find_regions(model) == [model.wrapper]
    pop = training(model)
    x, t = torch.randn(DI * GA * 2, 8), torch.randn(DI * GA * 2)
    pop.compile(x, t)
    assert pop._dispatch.compiled.regions.regions == [model.wrapper.body]
    graphs = counters["stats"]["unique_graphs"]
    pop(x, t)
    # compiled by compile()
    assert counters["stats"]["unique_graphs"] == graphs and pop._dispatch.compiled.last == "compiled"


class SharedInside(torch.nn.Module):
    """``lin`` belongs to the model and to ``wrapper``, whose own forward is never called."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.wrapper = torch.nn.Module()
        self.wrapper.lin, self.wrapper.other = self.lin, torch.nn.Linear(8, 1)

    def forward(self, x, target):
        return F.mse_loss(self.wrapper.other(self.lin(x)).squeeze(-1), target)


def test_a_module_found_twice_is_one_region_and_the_model_is_left_as_it_was():
    model = SharedInside()
    pop = training(model)
    x, t = torch.randn(DI * GA * 2, 8), torch.randn(DI * GA * 2)
    pop(x, t)
    assert pop._dispatch.compiled.regions.regions == [model.lin, model.wrapper.other]
    assert all("forward" not in m.__dict__ for m in model.modules())


class Bare(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(8))

    def forward(self, x, target):
        return F.mse_loss(x @ self.weight, target)


def test_a_model_without_regions_is_an_error_when_forced():
    pop = training(Bare())
    with pytest.raises(poptorch.Error, match="without regions to compile.*use unit='program'"):
        pop(torch.randn(DI * GA * 2, 8), torch.randn(DI * GA * 2))


def test_recomputation_wraps_the_compiled_forwards(monkeypatch):
    checkpoints = []
    checkpoint = torch.utils.checkpoint.checkpoint

    def counted(function, *args, **kwargs):
        checkpoints.append(function)
        return checkpoint(function, *args, **kwargs)

    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", counted)
    x, t = torch.randn(DI * 7 * 2, 8), torch.randn(DI * 7 * 2, 8)
    losses = {}
    for backend in ("eager", "compiled"):
        torch.manual_seed(0)
        model = FourBlocks("begin_block")  # four pipelined stages: PopTorch recomputes them
        opts = poptorch.Options().deviceIterations(DI).openpopBackend(backend, unit="regions")
        opts.Training.gradientAccumulation(7)
        opts.setExecutionStrategy(poptorch.PipelinedExecution())
        pop = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1))
        pop.compile(x, t)  # (the regions' compile runs a micro-batch through them)
        checkpoints.clear()
        losses[backend] = pop(x, t)
        losses[backend + " checkpoints"] = len(checkpoints)
        assert all("forward" not in m.__dict__ for m in model.modules())
    assert pop._dispatch.compiled.regions.regions == list(model.layers)
    assert losses["compiled checkpoints"] == losses["eager checkpoints"] > 0
    torch.testing.assert_close(losses["compiled"], losses["eager"], rtol=1e-5, atol=1e-6)


def test_training_matches_the_eager_backend_and_a_hand_written_loop():
    torch._dynamo.reset()  # the graph count below is this model's: no graph reused from an earlier test
    torch.manual_seed(0)
    model = Stack()
    eager_model, hand_model = copy.deepcopy(model), copy.deepcopy(model)
    compiled, eager = training(model), training(eager_model, backend="eager")
    hand_optimizer = torch.optim.SGD(hand_model.parameters(), lr=0.05, momentum=0.9)
    graphs = counters["stats"]["unique_graphs"]
    for seed in range(3):
        x, t = data(seed=seed)
        compiled_loss, eager_loss = compiled(x, t), eager(x, t)
        hand_losses = train_loop(hand_model, hand_optimizer, (x, t), stack_loss, DI, GA, 1)
        torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-5, atol=1e-6)
        assert torch.isfinite(hand_losses).all()
    assert compiled._dispatch.compiled.last == "compiled" and compiled._dispatch.compiled.selection.unit == "regions"
    # embed, one graph for the three identical layers, head: forward and backward compiled once each
    assert counters["stats"]["unique_graphs"] - graphs == 3
    for ours, theirs in zip(model.parameters(), hand_model.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert all("forward" not in m.__dict__ for m in model.modules())  # the user's model is as it was


def _scaled(module, args, out):
    return out * 0.5


def test_a_forward_hook_added_after_the_regions_compiled_is_run_eagerly():
    """torch.compile does not guard module hooks, so regions cannot trace a hook added after they
    compiled: 'compiled' refuses that call before anything changes, 'auto' runs the model eagerly
    from then on, as the eager backend does."""
    torch.manual_seed(0)
    model = Stack()
    forced_model, eager_model = copy.deepcopy(model), copy.deepcopy(model)
    forced = training(forced_model)
    forced(*data())
    forced_model.encoder.layers[1].v.register_forward_hook(_scaled)
    state = copy.deepcopy(forced_model.state_dict())
    with pytest.raises(poptorch.Error, match="forward hook added or removed after the regions were compiled"):
        forced(*data(seed=1))
    for key, value in forced_model.state_dict().items():
        assert torch.equal(value, state[key])
    auto = training(model, backend="auto")
    auto._dispatch.compiled.selection.compile_after = 0.0
    eager = training(eager_model, backend="eager")
    losses = {"auto": [], "eager": []}
    for seed in range(3):
        if seed == 1:
            for m in (model, eager_model):
                m.encoder.layers[1].v.register_forward_hook(_scaled)
        x, t = data(seed=seed)
        losses["auto"].append(auto(x, t))
        losses["eager"].append(eager(x, t))
        assert auto._dispatch.compiled.last == ("compiled" if seed == 0 else "eager")
    for got, expected in zip(losses["auto"], losses["eager"]):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_dropout_masks_equal_eager_and_compile_leaves_no_trace():
    torch.manual_seed(0)
    model = Stack(dropout=0.5)
    eager_model = copy.deepcopy(model)
    compiled, eager = training(model), training(eager_model, backend="eager")
    x, t = data()
    poptorch_state = copy.deepcopy(model.state_dict())
    rng = torch.random.get_rng_state()
    compiled.compile(x, t)
    assert compiled.compileSeconds() > 0
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert all(p.grad is None for p in model.parameters())
    for key, value in model.state_dict().items():
        assert torch.equal(value, poptorch_state[key])
    graphs = counters["stats"]["unique_graphs"]
    for seed in range(2):
        torch.manual_seed(seed)
        compiled_loss = compiled(x, t)
        torch.manual_seed(seed)
        eager_loss = eager(x, t)
        torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-5, atol=1e-6)  # same masks
    assert counters["stats"]["unique_graphs"] == graphs  # compile() compiled everything
    for ours, theirs in zip(model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_inference_matches_eager_and_keeps_a_forward_the_user_set():
    torch.manual_seed(0)
    model = Stack().eval()
    own = model.head.forward = torch.nn.Linear.forward.__get__(model.head)  # a forward of the user's own
    opts = poptorch.Options().deviceIterations(DI).openpopBackend("compiled", unit="regions")
    inference = poptorch.inferenceModel(model, opts)
    x, _ = data()
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(inference(x), expected, rtol=1e-5, atol=1e-6)
    assert inference._dispatch.compiled.last == "compiled"
    assert model.head.__dict__["forward"] is own
    assert all("forward" not in m.__dict__ for m in model.modules() if m is not model.head)


# ---------------------------------------------------------------------------- choosing the unit
@pytest.mark.parametrize("per_op, unit", [(0.0, "regions"), (float("inf"), "program")])
def test_auto_unit_follows_the_probes_flops_per_op(monkeypatch, per_op, unit):
    monkeypatch.setitem(regions_module.REGIONS_FLOPS_PER_OP, "cpu", per_op)
    model = Stack(layers=2)
    pop = training(model, unit="auto", backend="auto")  # no compile_after: auto estimates the compile
    x, t = data()
    with logged(logging.INFO) as messages:
        pop(x, t)  # eager: the probe chose the unit and estimated the compile
    assert pop._dispatch.compiled.last == "eager"
    assert pop._dispatch.compiled.selection.unit == unit
    assert any(f"unit {unit!r}" in m for m in messages())
    cost = pop._dispatch.compiled.selection.cost
    assert bool(cost.regions) == (unit == "regions")
    if unit == "regions":
        share, graphs = distinct_share(model, find_regions(model))
        assert (cost.ops, cost.regions) == (round(pop._dispatch.compiled._ops * share), graphs)
        assert cost.seconds == pytest.approx(compile_cost.FIXED_SECONDS + compile_cost.SECONDS_PER_OP * cost.ops
                                             + compile_cost.REGION_SECONDS * (graphs - 1))


def test_the_executable_cache_remembers_the_unit(monkeypatch, tmp_path):
    x, t = data()
    chosen = []
    for per_op in (0.0, float("inf")):  # (the second rule would choose the program)
        monkeypatch.setitem(regions_module.REGIONS_FLOPS_PER_OP, "cpu", per_op)
        model = Stack(layers=2)
        opts = poptorch.Options().deviceIterations(DI).openpopBackend("auto")  # (estimates, runs eagerly)
        opts.Training.gradientAccumulation(GA)
        opts.enableExecutableCaching(str(tmp_path))
        pop = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.05))
        with logged(logging.INFO) as messages:
            pop(x, t)
        chosen.append(pop._dispatch.compiled.selection.unit)
    assert chosen == ["regions", "regions"]
    assert any("chosen before for this model" in m for m in messages())


# ---------------------------------------------------------------------------- bad input
def test_unknown_unit_is_an_error_naming_the_choices_before_anything_changes():
    opts = poptorch.Options()
    with pytest.raises(poptorch.Error, match="Unknown compiled unit 'layers': use one of auto, program, regions"):
        opts.openpopBackend("compiled", compile_after=5.0, unit="layers")
    assert not opts.explicitlySet("openpop_backend") and not opts.explicitlySet("compile_after")


def test_unknown_unit_from_the_environment_is_an_error(monkeypatch):
    monkeypatch.setenv("OPENPOP_COMPILED_UNIT", "whole")
    model = Stack(layers=2)
    opts = poptorch.Options().openpopBackend("compiled")
    with pytest.raises(poptorch.Error, match="OPENPOP_COMPILED_UNIT environment variable"):
        poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1))(*data(steps=1, ga=1))


def test_concurrent_stages_cannot_run_as_regions(monkeypatch):
    monkeypatch.setenv("OPENPOP_CONCURRENT_STAGES", "on")
    opts = poptorch.Options().deviceIterations(2).outputMode(poptorch.OutputMode.All)
    opts.openpopBackend("compiled", unit="regions")
    opts.Training.gradientAccumulation(7)
    opts.setExecutionStrategy(poptorch.PipelinedExecution())
    model = FourBlocks("begin_block")
    state = copy.deepcopy(model.state_dict())
    pop = poptorch.trainingModel(model, opts)
    with pytest.raises(poptorch.Error, match="run concurrently with the compiled unit 'regions'"):
        pop(torch.randn(2 * 7 * 2, 8), torch.randn(2 * 7 * 2, 8))
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key])


# ---------------------------------------------------------------------------- the fused update
def lamb_groups(params, max_weight_norm=None):
    return [{"params": params[:3], "weight_decay": 0.01},
            {"params": params[3:], "weight_decay": 0.0, "max_weight_norm": max_weight_norm}]


def adam_groups(params, **second):
    return [{"params": params[:3], "weight_decay": 0.01}, {"params": params[3:], "weight_decay": 0.0, **second}]


OPTIMIZERS = {  # name: (make(params), transposed first parameter)
    "lamb": (lambda ps: poptorch.optim.LAMB(lamb_groups(ps), lr=0.01, bias_correction=False), False),
    "lamb_bias_max_norm": (lambda ps: poptorch.optim.LAMB(lamb_groups(ps, 0.5), lr=0.01), False),
    "lamb_max_norm_0": (lambda ps: poptorch.optim.LAMB(lamb_groups(ps, 0.0), lr=0.01, bias_correction=False), False),
    "lamb_transposed": (lambda ps: poptorch.optim.LAMB(lamb_groups(ps), lr=0.01), True),
    # (1 - beta2 in float32 would be 0.14 % off)
    "lamb_beta2_0.99999": (lambda ps: poptorch.optim.LAMB(lamb_groups(ps), lr=0.01, betas=(0.9, 0.99999)), False),
    "adam_l2": (lambda ps: poptorch.optim.Adam(adam_groups(ps), lr=0.01), False),
    "adam_maximize_decoupled": (lambda ps: poptorch.optim.Adam(adam_groups(ps, maximize=True), lr=0.01,
                                                               decoupled_weight_decay=True), False),
    "adamw": (lambda ps: poptorch.optim.AdamW(adam_groups(ps), lr=0.01, betas=(0.9, 0.99999)), True),
    "adamw_no_bias": (lambda ps: poptorch.optim.AdamW(adam_groups(ps), lr=0.01, bias_correction=False), False),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_fused_update_is_the_optimizers(name):
    make, transposed = OPTIMIZERS[name]
    shapes = [(16, 8), (8,), (1,), (2,), (2, 3), (30, 7)]
    ours = [torch.nn.Parameter(torch.randn(shape)) for shape in shapes]
    if transposed:  # a non-contiguous parameter: the optimizer's own update takes it
        ours[0] = torch.nn.Parameter(torch.randn(8, 16).t())
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    fused_optimizer, optimizer = make(ours), make(theirs)
    assert FusedUpdate.supports(fused_optimizer)
    fused = FusedUpdate(fused_optimizer)
    for _ in range(3):
        for p, q in zip(ours, theirs):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        with fused.installed():
            fused_optimizer.step()
        optimizer.step()
        assert "_update" not in vars(fused_optimizer)
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
        ours_state, theirs_state = fused_optimizer.state[p], optimizer.state[q]
        assert torch.equal(ours_state["step"], theirs_state["step"])
        torch.testing.assert_close(ours_state["exp_avg"], theirs_state["exp_avg"], rtol=1e-5, atol=1e-8)
        torch.testing.assert_close(ours_state["exp_avg_sq"], theirs_state["exp_avg_sq"], rtol=1e-6, atol=1e-12)


def test_fused_update_is_for_openpops_lamb_adam_and_adamw_with_float32_moments():
    params = [torch.nn.Parameter(torch.randn(4))]
    assert not FusedUpdate.supports(poptorch.optim.LAMB(params, first_order_momentum_accum_type=torch.float16))
    assert not FusedUpdate.supports(poptorch.optim.AdamW(params, second_order_momentum_accum_type=torch.float16))
    assert not FusedUpdate.supports(poptorch.optim.SGD(params, lr=0.1))
    assert not FusedUpdate.supports(torch.optim.Adam(params))

    class Own(poptorch.optim.Adam):
        def _update(self, group, params, grads):
            return super()._update(group, params, grads)

    assert not FusedUpdate.supports(Own(params))


def test_regions_train_with_the_fused_update_as_eager(monkeypatch):
    kernel_calls = []
    compiled = fused_updates._compiled

    def counted():
        kernel = compiled()

        def run(*args):
            kernel_calls.append(args[0].numel())
            return kernel(*args)
        return run

    monkeypatch.setattr(fused_updates, "_compiled", counted)
    torch.manual_seed(0)
    model = Stack(layers=2)
    eager_model = copy.deepcopy(model)
    pops = [training(m, backend=backend, optimizer=poptorch.optim.LAMB(m.parameters(), lr=0.01, weight_decay=0.01))
            for m, backend in ((model, "compiled"), (eager_model, "eager"))]
    pops[0].compile(*data())
    warm_up = len(kernel_calls)  # compile() compiles the kernel on scratch tensors, one per shape class
    assert warm_up >= 2
    for seed in range(2):
        x, t = data(seed=seed)
        torch.testing.assert_close(pops[0](x, t), pops[1](x, t), rtol=1e-5, atol=1e-6)
    assert len(kernel_calls) - warm_up == 2 * DI * len(list(model.parameters()))  # every parameter, every step
    for ours, theirs in zip(model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert "_update" not in vars(pops[0]._optimizer)
