"""Compiled regions' float32 GEMMs on oneDNN (runtime/compiled/onednn_matmuls.py): the choice (measured,
forced, a bad setting), the graph pass (large float32 CPU mm/addmm only), and a training run whose
regions use it against the eager backend and a hand-written loop."""
import copy

import pytest
import torch
import torch.nn.functional as F

import poptorch
from openpop.runtime.compiled import onednn_matmuls, regions
from openpop.runtime.compiled.onednn_matmuls import OneDnnMatmuls, gemm_choice, onednn_linear

from helpers.graph_passes import recorded
from helpers.oracle import train_loop

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch without oneDNN")


@pytest.fixture
def fresh_choice(monkeypatch):
    monkeypatch.delenv(onednn_matmuls.SETTING_ENV, raising=False)
    gemm_choice.cache_clear()
    yield monkeypatch
    gemm_choice.cache_clear()


@pytest.mark.parametrize("rates, choice", [((100.0, 250.0), "onednn"), ((100.0, 110.0), "aten"),
                                           ((250.0, 100.0), "aten")])
def test_auto_takes_onednn_only_well_ahead_of_aten(fresh_choice, rates, choice, caplog):
    fresh_choice.setattr(onednn_matmuls, "measure_rates", lambda: rates)
    with caplog.at_level("INFO"):
        assert gemm_choice() == choice
    assert f"-> {choice}" in caplog.text and "OPENPOP_CPU_GEMM" in caplog.text


@pytest.mark.parametrize("setting", ["onednn", "aten", " ATEN "])
def test_the_environment_forces_a_choice_without_measuring(fresh_choice, setting):
    fresh_choice.setenv("OPENPOP_CPU_GEMM", setting)
    fresh_choice.setattr(onednn_matmuls, "measure_rates", lambda: pytest.fail("measured"))
    assert gemm_choice() == setting.strip().lower()


def test_a_bad_setting_fails_when_the_executor_is_built(fresh_choice):
    fresh_choice.setenv("OPENPOP_CPU_GEMM", "mkl")
    model = torch.nn.Linear(4, 1)
    options = poptorch.Options()
    with pytest.raises(ValueError, match="OPENPOP_CPU_GEMM='mkl' is not valid: set it to auto, onednn or aten"):
        poptorch.trainingModel(model, options, torch.optim.SGD(model.parameters(), lr=0.1))
    assert not hasattr(model, "_poptorch_executor") and type(model) is torch.nn.Linear
    options.deviceIterations(2)  # (raised before the options froze)


def test_measured_rates_are_real_and_leave_the_generator_alone():
    state = torch.random.get_rng_state()
    aten, onednn = onednn_matmuls.measure_rates()
    assert aten > 1.0 and onednn > 1.0  # GFLOP/s of real products (a fake-tensor trace would give ~inf)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_onednn_linear_takes_any_strides_and_any_bias():
    generator = torch.Generator().manual_seed(0)
    a, b, bias = (torch.randn(*shape, generator=generator) for shape in ((64, 48), (40, 48), (40,)))
    torch.testing.assert_close(onednn_linear(a, b, bias), F.linear(a, b, bias))
    g = torch.randn(40, 64, generator=generator)  # a weight gradient's operands: both transposed
    torch.testing.assert_close(onednn_linear(g, a.t()), g @ a)
    # (oneDNN reads a bias as n contiguous values: a column, a broadcast scalar, a [1] bias)
    for odd in (torch.randn(40, 3, generator=generator)[:, 1], torch.randn(1, generator=generator).expand(40),
                torch.randn(1, generator=generator)):
        torch.testing.assert_close(onednn_linear(a, b, odd), F.linear(a, b, odd))


class Mlp(torch.nn.Module):
    def __init__(self, width=256):
        super().__init__()
        self.up, self.down = torch.nn.Linear(width, 2 * width), torch.nn.Linear(2 * width, width)
        self.tiny = torch.nn.Linear(width, 4)  # below MIN_MACS: stays aten's

    def forward(self, x):
        return self.tiny(x + self.down(F.gelu(self.up(x))))


def test_pass_rewrites_large_float32_products_only():
    graphs = []

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Mlp()
    reference = copy.deepcopy(model)
    x = torch.randn(64, 256)
    compiled = torch.compile(model, options={"post_grad_custom_post_pass": recorded(OneDnnMatmuls, graphs)})
    for run in (compiled, reference):
        run(x).square().mean().backward()
    torch.testing.assert_close(compiled(x), reference(x))
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad)
    forward, backward = graphs

    def count(graph, target):
        return len(graph.find_nodes(op="call_function", target=target))

    onednn, mm, addmm = torch.ops.openpop.onednn_linear.default, torch.ops.aten.mm.default, torch.ops.aten.addmm.default
    assert (count(forward, onednn), count(forward, addmm)) == (2, 1)  # up, down; tiny's addmm
    # up and down: input and weight gradients; tiny's two (and no input gradient for x)
    assert (count(backward, onednn), count(backward, mm)) == (3, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # half products: not float32
        torch._dynamo.reset()
        graphs.clear()
        torch.compile(model, options={"post_grad_custom_post_pass": recorded(OneDnnMatmuls, graphs)})(x)
    assert count(graphs[0], onednn) == 0

    def odd_biases(a, b, column, one):  # a strided and a [1] bias: left to aten's addmm
        return torch.addmm(column, a, b) + torch.addmm(one, a, b)

    torch._dynamo.reset()
    graphs.clear()
    operands = torch.randn(256, 256), torch.randn(256, 256), torch.randn(256, 2)[:, 0], torch.randn(1)
    options = {"post_grad_custom_post_pass": recorded(OneDnnMatmuls, graphs)}
    result = torch.compile(odd_biases, options=options)(*operands)
    torch.testing.assert_close(result, odd_biases(*operands))
    assert (count(graphs[0], onednn), count(graphs[0], addmm)) == (0, 2)


def test_regions_install_the_pass_by_the_choice(monkeypatch):
    cpu = torch.device("cpu")
    for choice, installed in (("onednn", True), ("aten", False)):
        monkeypatch.setattr(onednn_matmuls, "gemm_choice", lambda choice=choice: choice)
        for training in (True, False):
            passes = regions.compile_options(cpu, training).get("post_grad_custom_post_pass")
            assert (passes is not None and OneDnnMatmuls in [type(p) for p in passes]) == installed
    assert "post_grad_custom_post_pass" not in regions.compile_options(torch.device("meta"), True)


class MlpLoss(Mlp):
    def forward(self, x, target):
        return F.mse_loss(super().forward(x), target)


def test_training_with_onednn_regions_matches_eager_and_a_hand_loop(monkeypatch):
    monkeypatch.setattr(onednn_matmuls, "gemm_choice", lambda: "onednn")
    torch.manual_seed(0)
    model = MlpLoss()
    eager_model, hand_model = copy.deepcopy(model), copy.deepcopy(model)
    x, t = torch.randn(8 * 32, 256), torch.randn(8 * 32, 4)
    executors = []
    for module, backend in ((model, "compiled"), (eager_model, "eager")):
        opts = poptorch.Options().deviceIterations(2).openpopBackend(backend, unit="regions")
        opts.Training.gradientAccumulation(2)
        executors.append(poptorch.trainingModel(module, opts, poptorch.optim.SGD(module.parameters(), lr=0.01)))
    executors[0].compile(x, t)
    with torch.profiler.profile() as profile:
        compiled_losses = executors[0](x, t)
    assert executors[0]._dispatch.compiled.last == "compiled"
    calls = {e.key: e.count for e in profile.key_averages()}
    assert calls.get("openpop::onednn_linear", 0) == 2 * 2 * (2 + 3)  # DI x GA x (forward 2, backward 3)
    eager_losses = executors[1](x, t)
    hand_losses = train_loop(hand_model, torch.optim.SGD(hand_model.parameters(), lr=0.01), (x, t),
                             lambda m, x, t: m(x, t), 2, 2, 1)
    torch.testing.assert_close(compiled_losses, eager_losses)
    torch.testing.assert_close(compiled_losses.flatten(), hand_losses.flatten()[-1:])  # (OutputMode.Final)
    for ours, eager, theirs in zip(model.parameters(), eager_model.parameters(), hand_model.parameters()):
        torch.testing.assert_close(ours, eager)
        torch.testing.assert_close(ours, theirs)
