"""Block annotations, the execution plan, devices and pipelined execution (issue: model parallelism)."""
import copy
import logging
import weakref

import pytest
import torch
import torch.nn.functional as F

import poptorch

from helpers.models import FourBlocks, loss_of, strategy_options
from helpers.oracle import train_loop


@pytest.mark.parametrize("style", ["begin_block", "block", "block_function"])
@pytest.mark.parametrize("strategy", [None, "sharded", "pipelined"])
def test_strategies_match_plain_accumulation(style, strategy):
    torch.manual_seed(0)
    model = FourBlocks(style)
    reference = FourBlocks()
    reference.load_state_dict(model.state_dict())
    chosen = {None: None, "sharded": poptorch.ShardedExecution(), "pipelined": poptorch.PipelinedExecution()}[strategy]
    opts = strategy_options(chosen)
    x, t = torch.randn(2 * 8 * 2, 8), torch.randn(2 * 8 * 2, 8)
    pop = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        _, losses = pop(x, t)
        ref_losses = train_loop(reference, ref_opt, (x, t), loss_of, 2, 8, 1)
        torch.testing.assert_close(losses, ref_losses, rtol=1e-6, atol=1e-6)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)
    plan = pop._executable.plan
    assert [b.ipu for b in plan.blocks] == [0, 1, 2, 3]
    assert plan.pipeline_stages == 4
    assert plan.pipelined == (strategy in (None, "pipelined"))


class SeedBeginBlock(torch.nn.Module):
    """The Lightning IPU guide's first annotation example, as a plain module."""

    def __init__(self):
        super().__init__()
        self.layer1 = poptorch.BeginBlock(torch.nn.Linear(5, 10), ipu_id=0)
        self.layer2 = poptorch.BeginBlock(torch.nn.Linear(10, 5), ipu_id=1)
        self.layer3 = torch.nn.Linear(5, 5)
        self.layer4 = poptorch.BeginBlock(torch.nn.Linear(5, 5), ipu_id=2)
        self.softmax = poptorch.BeginBlock(torch.nn.Softmax(dim=1), ipu_id=3)

    def forward(self, x):
        return self.softmax(self.layer4(self.layer3(self.layer2(self.layer1(x)))))


class SeedBlockContext(torch.nn.Module):
    """The guide's second example: ``with poptorch.Block`` inside forward."""

    def __init__(self):
        super().__init__()
        self.layer1 = torch.nn.Linear(5, 10)
        self.layer2 = torch.nn.Linear(10, 5)
        self.layer3 = torch.nn.Linear(5, 5)
        self.layer4 = torch.nn.Linear(5, 5)
        self.act = torch.nn.ReLU()
        self.softmax = torch.nn.Softmax(dim=1)

    def forward(self, x):
        with poptorch.Block(ipu_id=0):
            x = self.act(self.layer1(x))
        with poptorch.Block(ipu_id=1):
            x = self.act(self.layer2(x))
        with poptorch.Block(ipu_id=2):
            x = self.act(self.layer3(x))
            x = self.act(self.layer4(x))
        with poptorch.Block(ipu_id=3):
            x = self.softmax(x)
        return x


def _allocation(pop):
    return {m: b.ipu for b in pop._executable.plan.blocks for m in b.modules}


def test_seed_begin_block_example_allocation(caplog):
    pop = poptorch.inferenceModel(SeedBeginBlock(), poptorch.Options().deviceIterations(4))
    poptorch.setLogLevel("INFO")
    poptorch.logger.propagate = True
    try:
        with caplog.at_level(logging.INFO, logger="poptorch::python"):
            out = pop(torch.randn(8, 5))
    finally:
        poptorch.logger.propagate = False
        poptorch.setLogLevel("WARN")
    assert out.shape == (8, 5)
    allocation = _allocation(pop)
    assert allocation == {"layer1": 0, "layer2": 1, "layer3": 1, "layer4": 2, "softmax": 3}
    table = "\n".join(r.getMessage() for r in caplog.records)
    assert "Device Allocation" in table
    assert "layer2, layer3 --> IPU 1 (cpu)" in table


def test_seed_block_context_example_allocation():
    pop = poptorch.inferenceModel(SeedBlockContext(), poptorch.Options().deviceIterations(4))
    pop(torch.randn(8, 5))
    allocation = _allocation(pop)
    assert allocation["layer1"] == 0 and allocation["layer2"] == 1
    assert allocation["layer3"] == 2 and allocation["layer4"] == 2 and allocation["softmax"] == 3


# --------------------------------------------------------------------------- plan errors
def test_pipelined_training_needs_enough_gradient_accumulation():
    model = FourBlocks("begin_block")
    before = copy.deepcopy(model.state_dict())
    pop = poptorch.trainingModel(model, strategy_options(None, ga=6))
    with pytest.raises(poptorch.Error) as info:
        pop(torch.randn(2 * 6, 8), torch.randn(2 * 6, 8))
    assert ("poptorch.Options().Training.gradientAccumulation must be greater than or equal to the number of "
            "pipeline stages (7) when using poptorch.PipelinedExecution. Please note that a model with 4 "
            "pipeline stages in PopTorch will have an additional 3 stages when training.") in str(info.value)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
    # Sharded execution has no such rule.
    pop.destroy()
    poptorch.trainingModel(model, strategy_options(poptorch.ShardedExecution(), ga=1))(torch.randn(2, 8),
                                                                                       torch.randn(2, 8))


def test_pipelined_inference_needs_enough_device_iterations():
    pop = poptorch.inferenceModel(SeedBeginBlock(), poptorch.Options().deviceIterations(2))
    with pytest.raises(poptorch.Error, match=r"poptorch.Options\(\).deviceIterations must be greater than or "
                                             r"equal to the number of pipeline stages \(4\)"):
        pop(torch.randn(4, 5))


class ThreeIpus(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = poptorch.BeginBlock(torch.nn.Linear(2, 2), ipu_id=0)
        self.b = poptorch.BeginBlock(torch.nn.Linear(2, 2), ipu_id=1)
        self.c = poptorch.BeginBlock(torch.nn.Linear(2, 2), ipu_id=2)

    def forward(self, x):
        return self.c(self.b(self.a(x)))


def test_ipu_count_must_be_a_power_of_two_unless_auto_rounded():
    opts = poptorch.Options().deviceIterations(4).setExecutionStrategy(poptorch.ShardedExecution())
    with pytest.raises(poptorch.Error, match="The model specifies the use of 3 IPUs, however PopTorch must reserve "
                                             "a minimum of 4"):
        poptorch.inferenceModel(ThreeIpus(), opts)(torch.randn(4, 2))
    opts = poptorch.Options().deviceIterations(4).autoRoundNumIPUs(True)
    assert poptorch.inferenceModel(ThreeIpus(), opts)(torch.randn(4, 2)).shape == (4, 2)
    opts = poptorch.Options().deviceIterations(4).replicationFactor(32)
    with pytest.raises(poptorch.Error, match=r"Too many IPUs requested \(128\)"):
        poptorch.inferenceModel(FourBlocks("begin_block"), opts)(torch.randn(4 * 32, 8), torch.randn(4 * 32, 8))


def test_same_as_ipu_needs_ipu_ids_and_unknown_blocks_are_rejected():
    class NoIpu(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = poptorch.BeginBlock(torch.nn.Linear(2, 2), user_id="a")

        def forward(self, x):
            return self.a(x)

    with pytest.raises(poptorch.Error, match="AutoStage.SameAsIpu was selected but no IPU was specified for block a"):
        poptorch.inferenceModel(NoIpu())(torch.randn(1, 2))
    opts = poptorch.Options().setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))
    assert poptorch.inferenceModel(NoIpu(), opts)(torch.randn(1, 2)).shape == (1, 2)
    opts = poptorch.Options().setExecutionStrategy(poptorch.ShardedExecution(poptorch.Stage("other")))
    with pytest.raises(AssertionError, match="Unknown Block 'a'"):
        poptorch.inferenceModel(NoIpu(), opts)(torch.randn(1, 2))


def test_explicit_stages_place_blocks_on_their_ipus():
    opts = poptorch.Options().deviceIterations(2)
    opts.setExecutionStrategy(poptorch.ShardedExecution(poptorch.Stage("b0", "b1").ipu(1),
                                                        poptorch.Stage("b2", "b3").ipu(0)))
    pop = poptorch.inferenceModel(FourBlocks("begin_block"), opts)
    pop(torch.randn(2, 8), torch.randn(2, 8))
    assert [b.ipu for b in pop._executable.plan.blocks] == [1, 1, 0, 0]


def test_no_active_block_between_blocks():
    class Gap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(2, 2)
            self.b = torch.nn.Linear(2, 2)

        def forward(self, x):
            with poptorch.Block(ipu_id=0):
                x = self.a(x)
            x = self.b(x)  # belongs to no block
            with poptorch.Block(ipu_id=1):
                x = x * 2
            return x

    with pytest.raises(poptorch.Error, match="No active Block, all the ops must belong to a Block"):
        poptorch.inferenceModel(Gap(), poptorch.Options().deviceIterations(2))(torch.randn(2, 2))
    assert Gap()(torch.randn(1, 2)).shape == (1, 2)  # outside a PopTorch model: no-op


def test_phased_strategy_runs_phases_in_order():
    torch.manual_seed(0)
    model = FourBlocks("begin_block")
    reference = copy.deepcopy(model)
    poptorch.removeBlocks(reference)
    opts = strategy_options(poptorch.SerialPhasedExecution(poptorch.Phase("b0", "b1"), poptorch.Phase("b2", "b3")),
                            ga=2, di=1)
    x, t = torch.randn(4, 8), torch.randn(4, 8)
    pop = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    pop(x, t)
    train_loop(reference, torch.optim.SGD(reference.parameters(), lr=0.1), (x, t), loss_of, 1, 2, 1)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- devices
def test_device_map_option_env_and_errors(monkeypatch):
    opts = strategy_options(None).deviceMap(["cpu", "cpu", "cpu", "cpu"])
    pop = poptorch.trainingModel(FourBlocks("begin_block"), opts)
    pop(torch.randn(32, 8), torch.randn(32, 8))
    assert [str(d) for d in pop._executable.plan.device_map.devices] == ["cpu"] * 4

    monkeypatch.setenv("OPENPOP_DEVICE_MAP", "cpu,cuda:7")
    pop = poptorch.inferenceModel(torch.nn.Linear(2, 2))
    with pytest.raises(poptorch.Error, match="OPENPOP_DEVICE_MAP names 'cuda:7'"):
        pop(torch.randn(1, 2))
    monkeypatch.setenv("OPENPOP_DEVICE_MAP", "tpu-ish")
    with pytest.raises(poptorch.Error, match="is not a torch device"):
        poptorch.inferenceModel(torch.nn.Linear(2, 2))(torch.randn(1, 2))
    monkeypatch.delenv("OPENPOP_DEVICE_MAP")
    opts = poptorch.Options().deviceMap(["meta"])
    with pytest.raises(poptorch.Error, match="runs virtual IPUs on 'cpu' and 'cuda' devices only"):
        poptorch.inferenceModel(torch.nn.Linear(2, 2), opts)(torch.randn(1, 2))


def test_device_map_round_robin_logic():
    from openpop.runtime.devices import DeviceMap
    devices = DeviceMap(["cuda:0", "cuda:1", "cuda:2"], ipus_per_replica=2, replicas=2)
    assert [str(devices.device(i, r)) for r in range(2) for i in range(2)] == ["cuda:0", "cuda:1", "cuda:2", "cuda:0"]
    assert [str(d) for d in devices.distinct_devices(1)] == ["cuda:2", "cuda:0"]


def test_concurrent_micro_batches_on_cpu_match_serial(monkeypatch):
    """The several-device schedule (threads, bounded in-flight micro-batches) run on the CPU."""
    monkeypatch.setenv("OPENPOP_CONCURRENT_STAGES", "on")
    torch.manual_seed(0)
    model = FourBlocks("begin_block")
    reference = FourBlocks()
    reference.load_state_dict(model.state_dict())
    x, t = torch.randn(2 * 8 * 2, 8), torch.randn(2 * 8 * 2, 8)
    opts = strategy_options(None)
    opts._Popart.set("autoRecomputation", 0)  # with recomputation: tests/test_device_replicas.py
    pop = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    _, losses = pop(x, t)
    assert pop._executable.concurrent
    ref_losses = train_loop(reference, torch.optim.SGD(reference.parameters(), lr=0.1), (x, t), loss_of, 2, 8, 1)
    torch.testing.assert_close(losses, ref_losses, rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_blocks_on_two_gpus_match_cpu():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    torch.manual_seed(0)
    model = FourBlocks("begin_block")
    reference = FourBlocks()
    reference.load_state_dict(model.state_dict())
    opts = strategy_options(None).deviceMap(["cuda:0", "cuda:1"])
    x, t = torch.randn(32, 8), torch.randn(32, 8)
    pop = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    _, losses = pop(x, t)
    assert losses.device.type == "cpu"
    assert model.layers[1].weight.device == torch.device("cuda:1")
    ref_losses = train_loop(reference, torch.optim.SGD(reference.parameters(), lr=0.1), (x, t), loss_of, 2, 8, 1)
    torch.testing.assert_close(losses, ref_losses, rtol=1e-4, atol=1e-5)
    pop.destroy()
    assert model.layers[1].weight.device.type == "cpu"


# --------------------------------------------------------------------------- recomputation and memory
class CountingLayer(torch.nn.Linear):
    calls = 0

    def forward(self, x):
        CountingLayer.calls += 1
        return super().forward(x)


def test_pipelined_training_recomputes_unless_disabled():
    def forward_calls(disable):
        model = FourBlocks()
        model.layers[1] = poptorch.BeginBlock(CountingLayer(8, 8), ipu_id=1)
        poptorch.BeginBlock(model.layers[0], ipu_id=0)
        opts = strategy_options(None, ga=4, di=1)
        if disable:
            opts._Popart.set("autoRecomputation", 0)
        pop = poptorch.trainingModel(model, opts)
        pop.compile(torch.randn(4, 8), torch.randn(4, 8))
        CountingLayer.calls = 0
        pop(torch.randn(4, 8), torch.randn(4, 8))
        return CountingLayer.calls

    assert forward_calls(disable=False) == 8  # 4 micro-batches, each forward re-run in backward
    assert forward_calls(disable=True) == 4


class SavedActivationMeter:
    """Bytes of activations autograd keeps alive, tracked through saved-tensor hooks."""

    def __init__(self):
        self.live = 0
        self.peak = 0

    def pack(self, tensor):
        size = tensor.numel() * tensor.element_size()
        holder = _Holder(tensor)
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(holder, self._freed, size)
        return holder

    def _freed(self, size):
        self.live -= size

    @staticmethod
    def unpack(holder):
        return holder.tensor


class _Holder:
    def __init__(self, tensor):
        self.tensor = tensor


@pytest.mark.parametrize("recompute", [True, False])
def test_pipelined_activation_memory_is_flat_in_gradient_accumulation(recompute):
    peaks = []
    for ga in (8, 64):
        model = FourBlocks("begin_block")
        opts = strategy_options(None, ga=ga, di=1)
        if not recompute:
            opts._Popart.set("autoRecomputation", 0)
        pop = poptorch.trainingModel(model, opts)
        x, t = torch.randn(ga * 16, 8), torch.randn(ga * 16, 8)
        pop.compile(x, t)
        meter = SavedActivationMeter()
        with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
            pop(x, t)
        peaks.append(meter.peak)
    assert peaks[0] > 0
    assert peaks[1] == peaks[0]


class MarkedLayer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return poptorch.recomputationCheckpoint(torch.tanh(self.fc(x)))


class TwoBlocksOfMarkedLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = poptorch.BeginBlock(torch.nn.Sequential(MarkedLayer(), MarkedLayer()), ipu_id=0)
        self.second = poptorch.BeginBlock(torch.nn.Sequential(MarkedLayer(), MarkedLayer()), ipu_id=1)

    def forward(self, x, t):
        out = self.second(self.first(x))
        return out, F.mse_loss(out, t)


def test_recomputation_checkpoints_make_each_marked_layer_a_recomputation_unit():
    torch.manual_seed(0)
    model = TwoBlocksOfMarkedLayers()
    reference = copy.deepcopy(model)
    poptorch.removeBlocks(reference)
    x, t = torch.randn(4 * 3, 8), torch.randn(4 * 3, 8)
    pop = poptorch.trainingModel(model, strategy_options(None, ga=4, di=1),
                                 torch.optim.SGD(model.parameters(), lr=0.1))
    _, losses = pop(x, t)
    assert pop._executable.layout.recompute
    assert pop.executionPlan().recomputation_units == ["first.0", "first.1", "second.0", "second.1"]
    ref_losses = train_loop(reference, torch.optim.SGD(reference.parameters(), lr=0.1), (x, t), loss_of, 1, 4, 1)
    torch.testing.assert_close(losses, ref_losses, rtol=1e-6, atol=1e-6)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_single_gpu_training_and_inference_match_cpu():
    torch.manual_seed(0)
    model = FourBlocks()
    reference = FourBlocks()
    reference.load_state_dict(model.state_dict())
    opts = strategy_options(None, ga=2, di=2).deviceMap(["cuda:0"])
    x, t = torch.randn(16, 8), torch.randn(16, 8)
    pop = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    _, losses = pop(x, t)
    assert losses.device.type == "cpu"
    assert model.layers[0].weight.device.type == "cuda"
    ref_losses = train_loop(reference, torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9), (x, t),
                            loss_of, 2, 2, 1)
    torch.testing.assert_close(losses, ref_losses, rtol=1e-4, atol=1e-5)
    pop.detachFromDevice()
    assert model.layers[0].weight.device.type == "cpu"
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    inference = poptorch.inferenceModel(model, poptorch.Options().deviceMap(["cuda:0"]))
    out, _ = inference(x, t)
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, model(x, t)[0].detach(), rtol=1e-4, atol=1e-5)
    assert model.layers[0].weight.device.type == "cpu"  # inference copies live on the GPU, not the host model


def test_activation_moves_only_at_block_boundaries():
    from openpop.runtime.devices import DevicePlacement
    model = FourBlocks()
    ipu_of = {"layers.0": 0, "layers.1": 0, "layers.2": 1, "layers.3": 1}
    placement = DevicePlacement(
        model, lambda name: torch.device("cuda", ipu_of.get(name, 0)))  # names only; nothing is moved
    hooked = [name for name, module in model.named_modules()
              if any(module is m for m, _ in placement._boundaries)]
    # The root, and each module on another device than its parent (the ModuleList container is
    # on the root's device, so both layers on IPU 1 count).
    assert hooked == ["", "layers.2", "layers.3"]
