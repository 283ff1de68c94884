"""The compiled backend (``Options.openpopBackend("compiled")``, runtime/compiled/) against
plain-PyTorch oracles, and its fallbacks. The suite's default backend stays ``auto``, which
never compiles within a test's few seconds of eager host calls (docs/guides/compiled-backend.md);
the tests here force it. All cases share one tiny model shape so Inductor's cache serves repeats."""
import contextlib
import copy
import inspect
import json
import re

import pytest
import torch

import poptorch
from openpop.runtime.compiled import backend as compiled_backend_module

from helpers.models import Regressor, make_data, regressor_loss
from helpers.oracle import train_loop


def compiled_options(di=1, ga=1, r=1, mode=poptorch.OutputMode.All, backend="compiled"):
    opts = poptorch.Options().deviceIterations(di).replicationFactor(r).openpopBackend(backend)
    opts.Training.gradientAccumulation(ga)
    opts.outputMode(mode, output_return_period=2 if mode == poptorch.OutputMode.EveryN else None)
    opts.showCompilationProgressBar(False)
    return opts


SGD_ARGS = dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01, nesterov=False)
CASES = {
    # name: (di, ga, r, optimizer factories (openpop, oracle), options tweak, reduction)
    "sgd_momentum_di3_ga2_r2": (3, 2, 2, lambda p: poptorch.optim.SGD(p, **SGD_ARGS),
                                lambda p: torch.optim.SGD(p, **SGD_ARGS), None, "mean"),
    "sgd_nesterov_velocity_scaling_loss_scaling_running_mean_di2_ga3": (
        2, 3, 1,
        lambda p: poptorch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True, use_combined_accum=True,
                                     velocity_scaling=4.0, loss_scaling=64.0),
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True),
        lambda o: o.Training.setMeanAccumulationAndReplicationReductionStrategy(
            poptorch.MeanReductionStrategy.Running), "mean"),
    "adam_sum_reduction_di1_ga2": (1, 2, 1, lambda p: poptorch.optim.Adam(p, lr=0.01, weight_decay=0.1),
                                   lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.1),
                                   lambda o: o.Training.accumulationAndReplicationReductionType(
                                       poptorch.ReductionType.Sum), "sum"),
    "adamw_clipped_di2_r2": (2, 1, 2, lambda p: poptorch.optim.AdamW(p, lr=0.02, max_grad_norm=0.05),
                             lambda p: torch.optim.AdamW(p, lr=0.02), None, "mean"),
    # LAMB has no torch counterpart: the oracle is openpop's eager LAMB.step() in the hand loop.
    "lamb_groups_di3_ga2": (3, 2, 1, lambda p: poptorch.optim.LAMB(lamb_groups(p), lr=0.02, weight_decay=0.1),
                            lambda p: poptorch.optim.LAMB(lamb_groups(p), lr=0.02, weight_decay=0.1), None, "mean"),
    "lamb_no_bias_correction_clipped_di2_r2": (
        2, 1, 2, lambda p: clipped(poptorch.optim.LAMB(p, lr=0.05, bias_correction=False, loss_scaling=8.0)),
        lambda p: poptorch.optim.LAMB(p, lr=0.05, bias_correction=False), None, "mean"),
    "rmsprop_centered_momentum_di2_ga2": (
        2, 2, 1, lambda p: poptorch.optim.RMSprop(p, lr=0.01, momentum=0.5, centered=True, weight_decay=0.1),
        lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, centered=True, weight_decay=0.1), None, "mean"),
    "rmsprop_tf_variant_momentum_di2": (
        2, 1, 1, lambda p: poptorch.optim.RMSprop(p, lr=0.01, momentum=0.5, use_tf_variant=True),
        lambda p: poptorch.optim.RMSprop(p, lr=0.01, momentum=0.5, use_tf_variant=True), None, "mean"),
}


def lamb_groups(params):
    """BERT's grouping: matrices decay, vectors get trust ratio 1 (max_weight_norm=0)."""
    params = list(params)
    return [{"params": [p for p in params if p.dim() > 1]},
            {"params": [p for p in params if p.dim() == 1], "weight_decay": 0.0, "max_weight_norm": 0.0}]


def clipped(optimizer, max_grad_norm=0.05):
    optimizer.max_grad_norm = max_grad_norm  # LAMB's constructor has no max_grad_norm; step() honours it
    return optimizer


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_training_matches_oracle(case):
    di, ga, r, make_opt, make_ref_opt, tweak, reduction = CASES[case]
    model = Regressor()
    reference = copy.deepcopy(model)
    opts = compiled_options(di, ga, r)
    if tweak is not None:
        tweak(opts)
    pop = poptorch.trainingModel(model, opts, make_opt(model.parameters()))
    ref_opt = make_ref_opt(reference.parameters())
    clip = "clipped" in case
    for call in range(2):
        x, t = make_data(di * ga * r * 3, seed=call)
        out, losses = pop(x, t)
        assert pop._dispatch.compiled.last == "compiled"
        ref_losses = train_loop(reference, ref_opt, (x, t), regressor_loss, di, ga, r, reduction,
                                max_grad_norm=0.05 if clip else None)
        torch.testing.assert_close(losses.reshape(-1), ref_losses, rtol=1e-5, atol=1e-6)
        assert out.shape == (di * ga * r * 3, 2)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    # The optimizer state is torch's, as eager leaves it (state_dict numbers parameters by group).
    state = pop._optimizer.state_dict()["state"]
    for index, q in enumerate(q for group in ref_opt.param_groups for q in group["params"]):
        for key, value in ref_opt.state[q].items():
            torch.testing.assert_close(torch.as_tensor(state[index][key]).float(), torch.as_tensor(value).float(),
                                       rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("mode", [poptorch.OutputMode.Final, poptorch.OutputMode.Sum,
                                  poptorch.OutputMode.EveryN])
def test_output_modes_and_lr_changes_match_eager(mode):
    """Output modes as eager returns them; setOptimizer / an LR scheduler between calls take
    effect without a recompile (lr is a program input)."""
    results = {}
    for backend in ("eager", "compiled"):
        torch.manual_seed(0)
        model = Regressor()
        opts = compiled_options(4, 1, 2, mode, backend)
        optimizer = poptorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
        pop = poptorch.trainingModel(model, opts, optimizer)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        outs = []
        for call in range(3):
            x, t = make_data(4 * 2 * 2, seed=call)
            outs.append(pop(x, t))
            optimizer.step()  # no gradients: only keeps the scheduler's order check quiet
            scheduler.step()
            pop.setOptimizer(optimizer)
        new = poptorch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
        pop.setOptimizer(new)
        outs.append(pop(*make_data(4 * 2 * 2, seed=9)))
        assert pop._dispatch.compiled.last == backend
        results[backend] = outs, [p.detach().clone() for p in model.parameters()]
    for eager, compiled in zip(results["eager"][0], results["compiled"][0]):
        for a, b in zip(eager, compiled):
            assert a.shape == b.shape and a.dtype == b.dtype
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(results["eager"][1], results["compiled"][1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_inference_matches_oracle_and_follows_host_weights():
    model = Regressor()
    pop = poptorch.inferenceModel(model, compiled_options(3, 1, 2))
    x, t = make_data(3 * 2 * 4)
    pop.compile(x, t)  # compiles the inference program without running it
    assert pop._dispatch.compiled._program.compiler.runs == 0
    out, loss = pop(x, t)
    assert pop._dispatch.compiled.last == "compiled" and pop._dispatch.compiled._program.compiler.runs == 1
    with torch.no_grad():
        torch.testing.assert_close(out, model(x, t)[0], rtol=1e-6, atol=1e-6)
        ref_losses = torch.stack([model(xm, tm)[1] for xm, tm in zip(x.split(4), t.split(4))])
    torch.testing.assert_close(loss, ref_losses, rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        model.fc2.bias.add_(1.0)
    pop.copyWeightsToDevice()  # the program reads the device copies, as eager does
    out2, _ = pop(x, t)
    torch.testing.assert_close(out2, out + 1.0, rtol=1e-6, atol=1e-6)


class CumulativeBatchNormed(Regressor):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(6, momentum=None)

    def forward(self, x, target):
        return super().forward(self.norm(x), target)


class Printing(Regressor):
    def forward(self, x, target):
        return super().forward(poptorch.ipu_print_tensor(x, "x"), target)


class Branching(Regressor):
    def forward(self, x, target):
        if x.sum() > 0:  # data-dependent Python control flow
            x = x * 2
        return super().forward(x, target)


class ClampsInput(Regressor):
    def forward(self, x, target):
        x.clamp_(-100.0, 100.0)  # in place on the caller's tensor (values unchanged)
        return super().forward(x, target)


class Hooked(Regressor):
    def __init__(self):
        super().__init__()
        self.rows = []
        self.fc1.register_full_backward_hook(lambda module, grad_in, grad_out: self.rows.append(grad_out[0].shape[0]))


class UnusedHead(Regressor):
    def __init__(self):
        super().__init__()
        self.unused = torch.nn.Linear(6, 2)  # trainable, in the optimizer, never called


@pytest.mark.parametrize("model_class,construct", [
    (CumulativeBatchNormed, "BatchNorm1d with momentum=None"),
    (Printing, "ipu_print_tensor"),
    (Branching, "torch.compile(fullgraph=True) rejects"),
    (ClampsInput, "input x changed in place"),
    (Hooked, "module hooks (backward_hooks on fc1"),
])
def test_unsupported_model_auto_logs_once_forced_raises(model_class, construct, warnings_logged):
    x, t = make_data(8)
    torch.manual_seed(0)
    forced = model_class()
    pop = poptorch.trainingModel(forced, compiled_options(2))
    state = copy.deepcopy(forced.state_dict())
    x_before = x.clone()
    with pytest.raises(poptorch.Error, match=construct.replace("(", r"\(").replace(")", r"\)")):
        pop(x, t)
    assert x._version == 0 and torch.equal(x, x_before)  # the probe ran on a copy of the inputs
    for key, value in forced.state_dict().items():  # raised before anything changed
        torch.testing.assert_close(value, state[key])

    torch.manual_seed(0)
    model, reference = model_class(), model_class()
    reference.load_state_dict(model.state_dict())
    auto = compiled_options(2, backend="auto")
    auto.openpopBackend("auto", compile_after=0.0)
    pop = poptorch.trainingModel(model, auto)
    eager = poptorch.trainingModel(reference, compiled_options(2, backend="eager"))
    for _ in range(2):
        _, loss = pop(x, t)
        _, ref_loss = eager(x, t)
        torch.testing.assert_close(loss, ref_loss)
    assert pop._dispatch.compiled.last == "eager"
    lines = [m for m in warnings_logged() if "compiled backend does not support" in m]
    assert len(lines) == 1 and construct in lines[0]


class ScopedAndCheckpointed(Regressor):
    """Forward hooks as Graphcore's applications register them: a name scope around every module
    (vision/cnns) and a recomputation checkpoint on a block's output (ViT, Swin, CLIP...)."""

    def __init__(self):
        super().__init__()
        for name, module in self.named_children():
            module.register_forward_pre_hook(lambda module, args, name=name: torch.ops.poptorch.push_name_scope(name))
            module.register_forward_hook(lambda module, args, out: torch.ops.poptorch.pop_name_scope())
        self.fc1.register_forward_hook(lambda module, args, out: poptorch.recomputationCheckpoint(out))


@pytest.mark.parametrize("device_iterations", [1, 4])
def test_forward_hooks_are_traced_into_the_program(device_iterations):
    """A model with forward and forward-pre hooks runs as one compiled program (the hooks traced,
    as PopTorch traced them) with eager's losses and weights."""
    results = {}
    for backend in ("eager", "compiled"):
        torch.manual_seed(0)
        model = ScopedAndCheckpointed()
        pop = poptorch.trainingModel(model, compiled_options(device_iterations, backend=backend),
                                     torch.optim.SGD(model.parameters(), lr=0.1))
        losses = [pop(*make_data(device_iterations * 4, seed=call))[1] for call in range(3)]
        assert pop._dispatch.compiled.last == backend
        results[backend] = losses, [p.detach().clone() for p in model.parameters()]
    for got, expected in zip(*(results[b][0] for b in ("compiled", "eager"))):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    for got, expected in zip(*(results[b][1] for b in ("compiled", "eager"))):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adamw"])  # (SGD: test_training.py, against the hand loop)
def test_frozen_parameters_are_constants_of_the_program(optimizer):
    """Parameters with requires_grad=False in the optimizer (fine-tuning with part of the model
    frozen): eager's step leaves them and their state untouched, and so does the program. Freezing
    or unfreezing one between calls builds another program; every call equals eager's."""
    def make(model):
        if optimizer == "sgd":
            return poptorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
        return poptorch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)

    results = {}
    for backend in ("eager", "compiled"):
        torch.manual_seed(0)
        model = Regressor()
        model.fc1.weight.requires_grad_(False)
        opt = make(model)
        pop = poptorch.trainingModel(model, compiled_options(2, backend=backend), opt)
        frozen = model.fc1.weight.detach().clone()
        losses = []
        for call in range(5):
            if call == 2:
                model.fc1.weight.requires_grad_(True)
                model.fc2.bias.requires_grad_(False)
            losses.append(pop(*make_data(2 * 3, seed=call))[1])
            if call < 2:
                assert torch.equal(model.fc1.weight, frozen) and model.fc1.weight not in opt.state
            assert pop._dispatch.compiled.last == backend
        results[backend] = losses, [p.detach().clone() for p in model.parameters()], \
            {name: {k: v.clone() for k, v in opt.state[p].items()} if p in opt.state else None
             for name, p in model.named_parameters()}
    (eager_losses, eager_params, eager_state), (losses, params, state) = results["eager"], results["compiled"]
    for got, expected in zip(losses + params, eager_losses + eager_params):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert state.keys() == eager_state.keys()
    for name, expected in eager_state.items():
        if expected is None:
            assert state[name] is None, name
        else:
            for key, value in expected.items():
                torch.testing.assert_close(torch.as_tensor(state[name][key]), torch.as_tensor(value), rtol=1e-5,
                                           atol=1e-6, msg=f"{name} {key}")


@pytest.mark.slow
def test_parameters_without_gradient_are_constants_of_the_program():
    """Parameters with requires_grad that the loss does not reach (an unused head): eager's step
    skips a parameter whose .grad is None - no momentum, no weight decay, no state - and the program
    takes them as constants. Every call equals eager's, the others trained as eager trains them."""
    results = {}
    for backend in ("eager", "compiled"):
        torch.manual_seed(0)
        model = UnusedHead()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
        pop = poptorch.trainingModel(model, compiled_options(2, ga=2, backend=backend), opt)
        unused = [p.detach().clone() for p in model.unused.parameters()]
        losses = [pop(*make_data(2 * 2 * 3, seed=call))[1] for call in range(3)]
        assert pop._dispatch.compiled.last == backend
        assert all(torch.equal(p, q) for p, q in zip(model.unused.parameters(), unused))
        assert not any(p in opt.state for p in model.unused.parameters())
        results[backend] = losses, [p.detach().clone() for p in model.parameters()], \
            [opt.state[p]["momentum_buffer"].clone() for p in model.parameters() if p in opt.state]
    (eager_losses, eager_params, eager_state), (losses, params, state) = results["eager"], results["compiled"]
    assert len(state) == len(eager_state) == 4
    for got, expected in zip(losses + params + state, eager_losses + eager_params + eager_state):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


class TwoHeads(Regressor):
    """Reads Python attributes that change between calls: ``use_b`` leaves head ``b`` out of the
    trace (eager skips its update: no gradient), ``scale`` only changes a constant."""

    def __init__(self):
        super().__init__()
        self.b = torch.nn.Linear(8, 2)
        self.use_b, self.scale = True, 1.0

    def forward(self, x, target):
        h = torch.tanh(self.fc1(x))
        out = self.fc2(h) * self.scale + (self.b(h) if self.use_b else 0.0)
        return out, torch.nn.functional.mse_loss(out, target)


def _two_heads_run(backend, changes):
    """Losses and weights of ``len(changes)`` calls of ``TwoHeads`` (DI 2, SGD with momentum and
    weight decay), ``changes[call]`` set on the model before each call."""
    torch.manual_seed(0)
    model = TwoHeads()
    opts = compiled_options(2, backend=backend)
    opts.openpopBackend(backend, compile_after=0.0)
    pop = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9,
                                                              weight_decay=0.01))
    losses = []
    for call, change in enumerate(changes):
        for name, value in change.items():
            setattr(model, name, value)
        losses.append(pop(*make_data(2 * 3, seed=call))[1])
    return losses, [p.detach().clone() for p in model.parameters()], (pop, model)


@pytest.mark.slow
def test_a_trace_that_leaves_a_parameter_out_is_not_run_by_the_old_program(monkeypatch):
    """A Python value the model reads changes and torch.compile traces it again: head ``b`` gets no
    gradient any more. The program built for the first trace would update it with a zero gradient
    (momentum, weight decay); eager leaves it. The new probe finds ``b`` without gradient and the
    program is built again with ``b`` as a constant; when ``b`` is back, again with ``b`` trained."""
    changes = [{}, {}, {"use_b": False}, {}, {"use_b": True}]
    eager_losses, eager_weights, _ = _two_heads_run("eager", changes)
    probes = []
    counted = compiled_backend_module.counted_probe
    monkeypatch.setattr(compiled_backend_module, "counted_probe", lambda *a, **k: probes.append(1) or counted(*a, **k))
    losses, weights, (pop, _) = _two_heads_run("auto", changes)
    for got, expected in zip(losses + weights, eager_losses + eager_weights):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert pop._dispatch.compiled.last == "compiled" and pop._dispatch.compiled._rebuilt == 2
    # auto's estimate and the first build probe once each; then one probe per re-trace, whose
    # program is built from it (it probed twice: to decide, then to build)
    assert len(probes) == 4


@pytest.mark.slow
def test_a_new_trace_with_what_the_program_holds_stays_in_it_until_the_recompile_limit(warnings_logged):
    """A constant the model reads changes: the probe finds what the program was built for, and the
    program takes the new trace (equal to eager); at torch's recompile limit the model runs eagerly
    from then on."""
    changes = [{"scale": 1.0}, {"scale": 0.5}]
    eager_losses, eager_weights, _ = _two_heads_run("eager", changes)
    with torch._dynamo.config.patch(recompile_limit=2):  # (torch's patch: see test_compiled_lightning.py)
        losses, weights, (pop, model) = _two_heads_run("compiled", changes[:1])
        first = pop._dispatch.compiled._program
        model.scale = 0.5
        losses.append(pop(*make_data(2 * 3, seed=1))[1])
        weights = [p.detach().clone() for p in model.parameters()]
        assert pop._dispatch.compiled.last == "compiled" and pop._dispatch.compiled._program is first
        model.scale = 0.25
        state = copy.deepcopy(model.state_dict())
        with pytest.raises(poptorch.Error, match="re-traced the program until its recompile limit"):
            pop(*make_data(2 * 3, seed=2))
    for got, expected in zip(losses + weights, eager_losses + eager_weights):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    for key, value in model.state_dict().items():  # refused before anything changed
        assert torch.equal(value, state[key])


def test_backward_hooks_added_after_compiling_are_noticed():
    """Eager runs a backward hook added between calls; the compiled program would not, so such a
    call is refused (auto: runs eagerly)."""
    model = Regressor()
    pop = poptorch.trainingModel(model, compiled_options(2))
    x, t = make_data(2 * 3)
    pop(x, t)
    state = copy.deepcopy(model.state_dict())
    handle = model.fc1.register_full_backward_hook(lambda module, grad_in, grad_out: None)
    with pytest.raises(poptorch.Error, match="backward_hooks on fc1"):
        pop(x, t)
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key])
    handle.remove()
    pop(x, t)
    assert pop._dispatch.compiled.last == "compiled"


def test_an_optimizer_with_every_parameter_frozen_stays_eager():
    model = Regressor()
    frozen = [model.fc1.weight, model.fc1.bias]
    for p in frozen:
        p.requires_grad_(False)
    pop = poptorch.trainingModel(model, compiled_options(2), torch.optim.SGD(frozen, lr=0.1))
    with pytest.raises(poptorch.Error, match="parameters all have requires_grad=False"):
        pop(*make_data(2 * 3))


def _doubled(module, args, out):
    return out * 2


@pytest.mark.parametrize("backend", ["compiled", "auto"])
def test_forward_hooks_added_or_removed_between_calls_are_traced_again(backend):
    """A forward hook added after the program was traced, removed again (also on the repeat fast
    path, where removing a hook creates no handle), registered twice: each call runs the hooks the
    model has then, as eager does."""
    results = {}
    for run_on in ("eager", backend):
        torch.manual_seed(0)
        model = ScopedAndCheckpointed()
        options = compiled_options(2, backend=run_on)
        if run_on == "auto":
            options.openpopBackend("auto", compile_after=0.0)
        pop = poptorch.trainingModel(model, options, torch.optim.SGD(model.parameters(), lr=0.1))
        x, t = make_data(2 * 4)
        losses = [pop(x, t)[1] for _ in range(3)]  # the third call takes the repeat path
        handle = model.fc2.register_forward_hook(_doubled)
        losses += [pop(x, t)[1] for _ in range(3)]
        handle.remove()  # (no handle created: only the hook dict shows it)
        losses += [pop(x, t)[1] for _ in range(3)]
        handles = [model.fc2.register_forward_hook(_doubled) for _ in range(2)]  # the same hook twice
        losses += [pop(x, t)[1] for _ in range(2)]
        for handle in handles:
            handle.remove()
        losses.append(pop(x, t)[1])
        assert pop._dispatch.compiled.last == ("eager" if run_on == "eager" else "compiled")
        results[run_on] = losses, [p.detach().clone() for p in model.parameters()]
    for got, expected in zip(results[backend][0], results["eager"][0]):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    for got, expected in zip(results[backend][1], results["eager"][1]):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_calls_inside_saved_tensors_hooks_run_eagerly(warnings_logged):
    """The hooks see eager's saved activations; the calls outside stay compiled (same weights)."""
    weights = {}
    for hooked in (False, True):
        torch.manual_seed(0)
        model = Regressor()
        pop = poptorch.trainingModel(model, compiled_options(2))
        saved, backends = [], []
        for call in range(3):
            x, t = make_data(2 * 3, seed=call)
            if hooked and call == 1:
                with torch.autograd.graph.saved_tensors_hooks(lambda s, kept=saved: kept.append(s) or s, lambda s: s):
                    pop(x, t)
            else:
                pop(x, t)
            backends.append(pop._dispatch.compiled.last)
        weights[hooked] = [p.detach().clone() for p in model.parameters()]
    assert backends == ["compiled", "eager", "compiled"] and saved
    assert sum("saved_tensors_hooks" in m for m in warnings_logged()) == 1
    for a, b in zip(weights[False], weights[True]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_auto_compiles_after_its_eager_budget(capfd, monkeypatch):
    """Ski rental: eager until the eager host calls have cost compile_after seconds; the call
    that compiles shows a progress bar of its own."""
    model = Regressor()
    opts = compiled_options(2, backend="auto").showCompilationProgressBar(True)
    opts.openpopBackend("auto", compile_after=3600.0)
    pop = poptorch.trainingModel(model, opts)
    x, t = make_data(2 * 3)
    pop(x, t)
    assert pop._dispatch.compiled.last == "eager"
    assert len(FINISHED_BAR.findall(capfd.readouterr().err)) == 1 and pop._dispatch.compiled.compile_seconds == 0
    pop._dispatch.compiled.selection.compile_after = 0.0  # as if an hour of eager calls had passed
    reference = copy.deepcopy(model)
    _, loss = pop(x, t)
    assert pop._dispatch.compiled.last == "compiled"
    assert len(FINISHED_BAR.findall(capfd.readouterr().err)) == 1 and pop._dispatch.compiled.compile_seconds > 0
    ref_losses = train_loop(reference, torch.optim.SGD(reference.parameters(), lr=0.01), (x, t),
                            regressor_loss, 2, 1, 1)
    torch.testing.assert_close(loss, ref_losses, rtol=1e-6, atol=1e-6)
    # the same program again (another executor): auto expects a cheap compile (compile_cost.py)
    monkeypatch.delenv("OPENPOP_COMPILE_AFTER", raising=False)
    again = poptorch.trainingModel(Regressor(), compiled_options(2, backend="auto"))
    again(x, t)
    assert again._dispatch.compiled.selection.cost.warm


FINISHED_BAR = re.compile(r"^Graph compilation: 100%", re.MULTILINE)


def test_compile_compiles_the_program_and_changes_nothing(capfd):
    """compile() builds and compiles the program under its progress bar without running it (no
    training step: weights, optimizer state and the RNG stream are unchanged); the first call
    then runs it once, without compiling. Without compile(), the first call compiles under one bar."""
    model = Regressor()
    reference = copy.deepcopy(model)
    optimizer = poptorch.optim.Adam(model.parameters(), lr=0.01)
    pop = poptorch.trainingModel(model, compiled_options(di=2).showCompilationProgressBar(True), optimizer)
    x, t = make_data(2 * 3)
    rng = torch.random.get_rng_state()
    pop.compile(x, t)
    program = pop._dispatch.compiled._program
    assert program is not None and program.compiled and not program.ran and program.compiler.runs == 0
    compile_seconds = pop._dispatch.compiled.compile_seconds
    assert compile_seconds > 0 and pop.compileSeconds() > compile_seconds
    assert len(FINISHED_BAR.findall(capfd.readouterr().err)) == 1
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p, q)
    assert not optimizer.state and torch.equal(torch.random.get_rng_state(), rng)
    _, losses = pop(x, t)
    assert pop._dispatch.compiled.last == "compiled" and pop._dispatch.compiled.compile_seconds == compile_seconds
    assert program.compiler.runs == 1
    assert "Graph compilation" not in capfd.readouterr().err
    ref_losses = train_loop(reference, torch.optim.Adam(reference.parameters(), lr=0.01), (x, t),
                            regressor_loss, 2, 1, 1)
    torch.testing.assert_close(losses, ref_losses, rtol=1e-5, atol=1e-6)

    lazy = poptorch.trainingModel(Regressor(), compiled_options(di=2).showCompilationProgressBar(True))
    lazy(x, t)
    assert lazy._dispatch.compiled.last == "compiled" and lazy._dispatch.compiled.compile_seconds > 0
    assert len(FINISHED_BAR.findall(capfd.readouterr().err)) == 1


def test_backend_option_and_environment(monkeypatch):
    assert poptorch.Options().openpop_backend == "auto"
    with pytest.raises(poptorch.Error, match="Unknown openpop backend 'fast'"):
        poptorch.Options().openpopBackend("fast")
    with pytest.raises(poptorch.Error, match="compile_after"):
        poptorch.Options().openpopBackend("auto", compile_after=-1)
    from openpop.runtime.compiled.selection import Selection
    monkeypatch.setenv("OPENPOP_BACKEND", "eager")
    assert Selection.from_options(poptorch.Options()).backend == "eager"
    assert Selection.from_options(poptorch.Options().openpopBackend("compiled")).backend == "compiled"
    assert "openpop_backend" in poptorch.Options().outputMode(poptorch.OutputMode.All).toDict()


def test_cuda_graph_helpers_are_off_on_cpu():
    from openpop.runtime.compiled import cuda_graphs
    cpu = torch.device("cpu")
    assert cuda_graphs.compile_options(cpu) == {}
    assert cuda_graphs.mark_step_begin([torch.zeros(1)]) is False
    assert cuda_graphs.compile_options(torch.device("cuda", 0)) == torch._inductor.list_mode_options("reduce-overhead")


def test_program_arguments_follow_replaced_parameters_and_submodules():
    """Parameters are resolved once per program; a replaced parameter or submodule is seen."""
    from openpop.runtime.compiled.arguments import ProgramArguments
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    arguments = ProgramArguments(model, ["0.weight", "1.bias"], ["0.bias"])
    trained, frozen = arguments.parameters()
    assert trained == [model[0].weight, model[1].bias] and frozen == [model[0].bias]
    model[0].weight = torch.nn.Parameter(torch.zeros(3, 2))
    assert arguments.parameters()[0][0] is model[0].weight
    model[1] = torch.nn.Linear(3, 1)
    assert arguments.parameters()[0][1] is model[1].bias
    assert arguments.parameters()[1][0] is model[0].bias
    x = torch.ones(8, 2)
    from openpop.runtime.args import BoundInputs
    inputs = BoundInputs(inspect.signature(lambda x: x), (x,), {})
    assert arguments.tensors(inputs)[0] is x


def test_looping_cpu_programs_use_the_cpp_wrapper():
    """A device-iteration while_loop runs in Inductor's C++ wrapper, not a Python loop, and so does
    a small program; every while_loop program is marked cacheable."""
    from openpop.runtime.compiled.program_options import compile_kwargs
    from openpop.runtime.geometry import BatchGeometry
    cpu = torch.device("cpu")
    cacheable = {"unsafe_marked_cacheable_functions": {"torch.ops.higher_order.while_loop": torch.__version__}}
    looping = BatchGeometry.from_options(poptorch.Options().deviceIterations(4))
    wrapper = {"cpp_wrapper": True, "cpp_wrapper_build_separate": True}  # C++ loop driver, built apart
    assert compile_kwargs(cpu, looping, False) == {"options": {**wrapper, **cacheable}}
    accumulating = poptorch.Options()
    accumulating.Training.gradientAccumulation(2)  # a while_loop over the micro-batches, one step
    assert compile_kwargs(cpu, BatchGeometry.from_options(accumulating), False) == {"options": cacheable}
    assert compile_kwargs(cpu, BatchGeometry.from_options(accumulating), False, loops=False) == {}  # stepwise
    assert compile_kwargs(cpu, BatchGeometry.from_options(poptorch.Options()), False) == {}
    # a small one-step program (aten ops per micro-batch as the probe counts them): C++ too
    one_step = BatchGeometry.from_options(poptorch.Options())
    assert compile_kwargs(cpu, one_step, False, ops=13) == {"options": wrapper}
    assert compile_kwargs(cpu, one_step, False, ops=122) == {}
    assert compile_kwargs(cpu, BatchGeometry.from_options(accumulating), False, ops=13) == {
        "options": {**wrapper, **cacheable}}
    assert compile_kwargs(cpu, BatchGeometry.from_options(accumulating), False, loops=False, ops=13) == {}
    assert compile_kwargs(torch.device("cuda", 0), looping, False) == {
        "options": {**torch._inductor.list_mode_options("reduce-overhead"), **cacheable}}
    # A model that draws random numbers keeps aten's random ops (program.py)
    assert compile_kwargs(cpu, looping, True) == {"options": {**wrapper, **cacheable, "fallback_random": True}}
    # CPU training programs: short attention's backward as tensor math (attention_backward.py)
    from openpop.runtime.compiled.attention_backward import ShortAttentionBackward
    trained = compile_kwargs(cpu, looping, False, training=True)["options"]
    assert isinstance(trained.pop("post_grad_custom_pre_pass"), ShortAttentionBackward)
    assert trained == {**wrapper, **cacheable}
    assert "post_grad_custom_pre_pass" not in compile_kwargs(torch.device("cuda", 0), looping, False,
                                                             training=True)["options"]


@pytest.mark.gpu
def test_cuda_graphs_training_matches_eager():
    results = []
    for backend in ("eager", "compiled"):
        torch.manual_seed(0)
        model = Regressor().cuda()
        opts = compiled_options(4, backend=backend).deviceMap(["cuda:0"])
        pop = poptorch.trainingModel(model, opts, poptorch.optim.Adam(model.parameters(), lr=0.01))
        x, t = make_data(4 * 3)
        for _ in range(3):
            losses = pop(x.cuda(), t.cuda())[1]
        results.append((losses.cpu(), [p.detach().cpu() for p in model.parameters()]))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-5, atol=1e-6)


def test_optimizers_without_a_functional_update_are_named():
    from openpop.runtime.compiled.optimizer_support import unsupported_reason
    params = list(Regressor().parameters())

    class OwnStep(torch.optim.SGD):
        def step(self, closure=None):
            return None

    hooked = torch.optim.SGD(params, lr=0.1)
    hooked.register_step_post_hook(lambda *args: None)  # as Lightning's per-step work does
    assert unsupported_reason(poptorch.optim.AdamW(params)) is None
    assert unsupported_reason(torch.optim.SGD(params, lr=0.1, momentum=0.9)) is None
    assert unsupported_reason(poptorch.optim.LAMB(params)) is None
    assert unsupported_reason(torch.optim.RMSprop(params)) is None
    assert "LBFGS" in unsupported_reason(torch.optim.LBFGS(params))
    assert "OwnStep.step overridden" in unsupported_reason(OwnStep(params, lr=0.1))
    assert "step hooks" in unsupported_reason(hooked)
    assert unsupported_reason(poptorch.optim.SGD(params, lr=0.1, accum_type=torch.float16)) is None
    half = [torch.nn.Parameter(torch.zeros(2, dtype=torch.float16))]
    assert unsupported_reason(poptorch.optim.SGD(half, lr=0.1)) is None
    assert "torch.float16 parameter" in unsupported_reason(torch.optim.SGD(half, lr=0.1))  # computes in half
    own = torch.optim.SGD(params, lr=0.1)
    own.step = lambda closure=None: None
    assert "step function set on the optimizer instance" in unsupported_reason(own)
    scheduled = torch.optim.SGD(params, lr=0.1)
    torch.optim.lr_scheduler.StepLR(scheduled, step_size=1)  # wraps scheduled.step: still torch's update
    assert unsupported_reason(scheduled) is None


@pytest.mark.slow
def test_traced_calls_run_eagerly_and_training_is_unchanged(tmp_path):
    """A host call inside a trace window runs on the eager backend, so its stages are traced; the
    calls around it stay compiled, and the weights equal those of an untraced compiled run."""
    weights = {}
    for traced in (False, True):
        torch.manual_seed(0)
        model = Regressor()
        optimizer = poptorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
        pop = poptorch.trainingModel(model, compiled_options(di=2), optimizer)
        window = poptorch.profiling.TraceSession(tmp_path, calls=range(1, 2)) if traced else contextlib.nullcontext()
        backends = []
        with window:
            for call in range(3):
                pop(*make_data(4, seed=call))
                backends.append(pop._dispatch.compiled.last)
        weights[traced] = [p.detach().clone() for p in model.parameters()]
    assert backends == ["compiled", "eager", "compiled"]
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert any(e["name"] == "openpop:host_call:1" for e in events)
    assert any(e.get("cat") == "openpop_stage" for e in events)
    for a, b in zip(weights[False], weights[True]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_probe_that_fails_declines_in_auto_and_raises_when_forced(monkeypatch, warnings_logged):
    """The program's probe runs the first micro-batch its own way (counted, gradients by
    ``autograd.grad``): an error there that is not ``Ineligible`` declines the model like any other
    reason - the eager backend then runs the call - and is a poptorch.Error with the backend forced;
    ``compile()`` (compile ahead) is no exception."""
    from openpop.runtime.compiled import eligibility

    def failing_probe(*args, **kwargs):
        raise RuntimeError("no gradient to take")

    monkeypatch.setattr(eligibility, "probe", failing_probe)
    x, t = make_data(8)
    forced = Regressor()
    pop = poptorch.trainingModel(forced, compiled_options(2), torch.optim.SGD(forced.parameters(), lr=0.1))
    with pytest.raises(poptorch.Error, match="probe micro-batch fails .*no gradient to take"):
        pop.compile(x, t)
    torch.manual_seed(0)
    model, reference = Regressor(), Regressor()
    reference.load_state_dict(model.state_dict())
    auto = compiled_options(2, backend="auto")
    auto.openpopBackend("auto", compile_after=0.0)
    pop = poptorch.trainingModel(model, auto, torch.optim.SGD(model.parameters(), lr=0.1))
    pop.compile(x, t)
    pop(x, t)
    assert pop._dispatch.ran is pop._dispatch.eager
    assert sum("probe micro-batch fails" in line for line in warnings_logged()) == 1
    eager = poptorch.trainingModel(reference, compiled_options(2, backend="eager"),
                                   torch.optim.SGD(reference.parameters(), lr=0.1))
    eager(x, t)
    for a, b in zip(model.parameters(), reference.parameters()):
        assert torch.equal(a, b)


class TiedLinears(torch.nn.Module):
    """The output layer's weight is the input layer's (one tensor at two slots, as BERT's tied
    embeddings); no module under two names."""

    def __init__(self):
        super().__init__()
        self.inp, self.out = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.out.weight = self.inp.weight

    def forward(self, x, target):
        out = self.out(torch.tanh(self.inp(x)))
        return out, torch.nn.functional.mse_loss(out, target)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_tied_weights_are_given_at_every_slot(tied):
    """A program passes ``functional_call`` the tensors untied when no tensor has two names (no
    walk over the model's tensors to tie, at each trace); a tied weight still reaches both slots."""
    torch.manual_seed(0)
    model = TiedLinears()
    if not tied:
        model.out.weight = torch.nn.Parameter(model.inp.weight.detach().clone())
    reference = copy.deepcopy(model)
    pop = poptorch.trainingModel(model, compiled_options(2, 2), torch.optim.SGD(model.parameters(), lr=0.1))
    g = torch.Generator().manual_seed(0)
    x, t = torch.randn(12, 8, generator=g), torch.randn(12, 8, generator=g)
    _, losses = pop(x, t)
    program = pop._dispatch.compiled._program
    assert pop._dispatch.compiled.last == "compiled" and program.untied is not tied
    ref_losses = train_loop(reference, torch.optim.SGD(reference.parameters(), lr=0.1), (x, t),
                            lambda m, xs, ts: m(xs, ts)[1], 2, 2, 1, "mean")
    torch.testing.assert_close(losses.reshape(-1), ref_losses, rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
