"""Local replicas on their own devices, and concurrent micro-batches with recomputation.

The multi-GPU logic runs here on the CPU: ``replicas_apart`` makes the device map report that
replicas do not share devices, so each replica gets its own weight copy, its own gradients, the
reduction onto replica 0 and the broadcast after each step — exactly the GPU path, with every
copy on the CPU. ``OPENPOP_CONCURRENT_STAGES=on`` runs the several-device thread schedule.
"""
import copy
import sys
import threading
import time

import pytest
import torch
import torch.nn.functional as F

import poptorch
from openpop.runtime.devices import DeviceMap

from helpers.models import FourBlocks, Normed, loss_of, strategy_options
from helpers.oracle import train_loop


@pytest.fixture
def replicas_apart(monkeypatch):
    monkeypatch.setattr(DeviceMap, "replicas_share_devices", lambda self: False)


def replicated_options(di=2, ga=3, r=2, reduction=None):
    opts = poptorch.Options().deviceIterations(di).replicationFactor(r).outputMode(poptorch.OutputMode.All)
    opts.Training.gradientAccumulation(ga)
    if reduction is not None:
        opts.Training.accumulationAndReplicationReductionType(reduction)
    return opts


def assert_same_parameters(model, reference, tol=1e-6):
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=tol, atol=tol, msg=name)


# --------------------------------------------------------------------------- the map
def test_replicas_share_devices_logic():
    assert not DeviceMap(["cuda:0", "cuda:1"], ipus_per_replica=1, replicas=2).replicas_share_devices()
    assert DeviceMap(["cuda:0", "cuda:1"], ipus_per_replica=2, replicas=2).replicas_share_devices()
    assert DeviceMap(["cpu"], ipus_per_replica=4, replicas=4).replicas_share_devices()
    four = DeviceMap(["cuda:0", "cuda:1", "cuda:2", "cuda:3"], ipus_per_replica=2, replicas=2)
    assert not four.replicas_share_devices()
    assert [str(d) for d in four.all_devices()] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]


def test_one_name_per_device():
    from openpop.runtime.devices import resolve_device_map
    assert resolve_device_map(2, 1, ["cpu", "cpu:1"]).devices == [torch.device("cpu")] * 2


def test_cuda_without_index_names_the_current_device(monkeypatch):
    from openpop.runtime.devices import resolve_device_map
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert resolve_device_map(2, 1, ["cuda", "cuda:0"]).devices == [torch.device("cuda", 1), torch.device("cuda", 0)]


def test_replicas_sharing_the_cpu_use_one_weight_set():
    model = FourBlocks()
    pop = poptorch.trainingModel(model, replicated_options())
    pop(torch.randn(12, 8), torch.randn(12, 8))
    assert not pop._session.replicas.own_weights


# --------------------------------------------------------------------------- training
@pytest.mark.parametrize("reduction", [poptorch.ReductionType.Mean, poptorch.ReductionType.Sum])
@pytest.mark.parametrize("concurrent", [False, True])
def test_replica_copies_train_like_the_oracle(replicas_apart, monkeypatch, reduction, concurrent):
    monkeypatch.setenv("OPENPOP_CONCURRENT_STAGES", "on" if concurrent else "off")
    torch.manual_seed(0)
    model = FourBlocks()
    reference = copy.deepcopy(model)
    x, t = torch.randn(2 * 3 * 2 * 2, 8), torch.randn(2 * 3 * 2 * 2, 8)
    opts = replicated_options(reduction=reduction)
    pop = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    _, losses = pop(x, t)
    replicas = pop._session.replicas
    assert replicas is not None and len(replicas.models) == 2
    assert pop._executable.concurrent == concurrent
    replica = replicas.model(1)
    assert all(p is not q for p, q in zip(model.parameters(), replica.parameters()))
    ref_losses = train_loop(reference, torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9), (x, t),
                            loss_of, 2, 3, 2, reduction="mean" if reduction == poptorch.ReductionType.Mean else "sum")
    torch.testing.assert_close(losses.flatten(), ref_losses, rtol=1e-6, atol=1e-6)
    assert_same_parameters(model, reference)  # replica 1's rows of every step match too: broadcasts work
    assert all(p.grad is None for p in replica.parameters())


def test_replica_copies_with_adam_and_pipelined_recomputation(replicas_apart, monkeypatch):
    monkeypatch.setenv("OPENPOP_CONCURRENT_STAGES", "on")
    torch.manual_seed(0)
    model = FourBlocks("begin_block")
    reference = FourBlocks()
    reference.load_state_dict(model.state_dict())
    opts = replicated_options(di=2, ga=8)
    opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))
    x, t = torch.randn(2 * 8 * 2 * 2, 8), torch.randn(2 * 8 * 2 * 2, 8)
    pop = poptorch.trainingModel(model, opts, torch.optim.Adam(model.parameters(), lr=0.01))
    _, losses = pop(x, t)
    assert pop._executable.layout.recompute and pop._executable.concurrent and pop._session.replicas.own_weights
    ref_losses = train_loop(reference, torch.optim.Adam(reference.parameters(), lr=0.01), (x, t), loss_of, 2, 8, 2)
    torch.testing.assert_close(losses.flatten(), ref_losses, rtol=1e-5, atol=1e-6)
    assert_same_parameters(model, reference, tol=1e-5)


def test_replica_copies_with_automatic_loss_scaling(replicas_apart):
    torch.manual_seed(0)
    model = FourBlocks()
    reference = copy.deepcopy(model)
    opts = replicated_options(di=1, ga=2)
    opts.Training.setAutomaticLossScaling(True)
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.1, loss_scaling=2.0 ** 10)
    x, t = torch.randn(8, 8), torch.randn(8, 8)
    poptorch.trainingModel(model, opts, optimizer)(x, t)
    train_loop(reference, torch.optim.SGD(reference.parameters(), lr=0.1), (x, t), loss_of, 1, 2, 2)
    assert_same_parameters(model, reference, tol=1e-5)


def test_replica_copies_keep_their_own_buffers_like_shared_replicas(monkeypatch):
    """BatchNorm statistics stay per replica (host sees replica 0's) in both replica paths."""
    torch.manual_seed(0)
    model = Normed()
    shared = copy.deepcopy(model)
    x = torch.randn(2 * 2 * 2 * 4, 4)

    def train(m):
        opts = replicated_options(di=2, ga=2).broadcastBuffers(False)
        pop = poptorch.trainingModel(m, opts, torch.optim.SGD(m.parameters(), lr=0.1))
        return pop, pop(x)

    shared_pop, (shared_out, shared_loss) = train(shared)
    assert shared_pop._executable.replica_buffers.per_replica
    monkeypatch.setattr(DeviceMap, "replicas_share_devices", lambda self: False)
    pop, (out, loss) = train(model)
    assert pop._session.replicas.own_weights
    torch.testing.assert_close(out, shared_out, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(loss, shared_loss, rtol=1e-6, atol=1e-6)
    for (name, a), b in zip(model.named_buffers(), shared.buffers()):
        torch.testing.assert_close(a, b, msg=name)
    assert not torch.equal(pop._session.replicas.model(1).bn.running_mean, model.bn.running_mean)


def test_host_edits_reach_every_replica_on_attach(replicas_apart):
    torch.manual_seed(0)
    model = FourBlocks()
    reference = copy.deepcopy(model)
    x, t = torch.randn(8, 8), torch.randn(8, 8)
    pop = poptorch.trainingModel(model, replicated_options(di=1, ga=2),
                                 torch.optim.SGD(model.parameters(), lr=0.1))
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    pop(x, t)
    train_loop(reference, ref_optimizer, (x, t), loss_of, 1, 2, 2)
    pop.detachFromDevice()
    with torch.no_grad():
        for m in (model, reference):
            m.layers[2].weight.mul_(0.5)
    pop.attachToDevice()
    assert torch.equal(pop._session.replicas.model(1).layers[2].weight, model.layers[2].weight)
    _, losses = pop(x, t)
    ref_losses = train_loop(reference, ref_optimizer, (x, t), loss_of, 1, 2, 2)
    torch.testing.assert_close(losses.flatten(), ref_losses, rtol=1e-6, atol=1e-6)
    assert_same_parameters(model, reference)


# --------------------------------------------------------------------------- inference
def test_inference_replica_copies_follow_host_weights(replicas_apart):
    torch.manual_seed(0)
    model = FourBlocks()
    x, t = torch.randn(2 * 2 * 4, 8), torch.randn(2 * 2 * 4, 8)
    inference = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(2).replicationFactor(2))
    out, _ = inference(x, t)
    assert inference._session.replicas.own_weights
    torch.testing.assert_close(out, model(x, t)[0].detach(), rtol=1e-6, atol=1e-6)
    # Training the same model makes the inference replicas re-upload on the next call.
    training = poptorch.trainingModel(model, replicated_options(di=1, ga=1),
                                      torch.optim.SGD(model.parameters(), lr=0.5))
    training(x[:8], t[:8])
    out, _ = inference(x, t)
    torch.testing.assert_close(out, model(x, t)[0].detach(), rtol=1e-6, atol=1e-6)
    # Host edits with copyWeightsToDevice reach replica 1 (rows of replica 1 are 4:8 and 12:16).
    with torch.no_grad():
        model.layers[0].bias.add_(1.0)
    inference.copyWeightsToDevice()
    out, _ = inference(x, t)
    torch.testing.assert_close(out[4:8], model(x[4:8], t[4:8])[0].detach(), rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- concurrency with recomputation
class DropoutScale(torch.nn.Module):
    """``y = dropout(x) * w``: the gradient of ``w`` is ``sum(y) / w``, so any mismatch between
    the forward's mask and the recomputation's mask shows in the weights."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(2.0))
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(x) * self.w


class DropoutStages(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stages = torch.nn.ModuleList(DropoutScale() for _ in range(2))
        for i, stage in enumerate(self.stages):
            poptorch.BeginBlock(stage, ipu_id=i)

    def forward(self, x):
        first = self.stages[0](x)
        second = self.stages[1](first.detach())
        return first, second, poptorch.identity_loss(first.sum() + second.sum(), reduction="none")


def test_concurrent_recomputation_replays_each_micro_batch_dropout_mask(monkeypatch):
    monkeypatch.setenv("OPENPOP_CONCURRENT_STAGES", "on")
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads interleave as often as possible
    try:
        check_dropout_masks_replayed()
    finally:
        sys.setswitchinterval(interval)


def check_dropout_masks_replayed():
    torch.manual_seed(0)
    model = DropoutStages()
    ga, di = 16, 2
    opts = strategy_options(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement), ga=ga, di=di)
    opts.Training.accumulationAndReplicationReductionType(poptorch.ReductionType.Sum)
    pop = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=1e-3))
    x = torch.ones(di * ga * 4, 4096)
    w_before = [stage.w.item() for stage in model.stages]
    first, second, _ = pop(x)
    assert pop._executable.concurrent and pop._executable.layout.recompute
    # Step 0's gradient of w_i is the sum of that step's outputs of stage i divided by w_i.
    rows = ga * 4
    for i, out in enumerate((first, second)):
        expected_grad = out[:rows].sum() / w_before[i]
        w_after_first_step = w_before[i] - 1e-3 * expected_grad
        # The second step starts from there; check it with its own outputs.
        expected = w_after_first_step - 1e-3 * out[rows:].sum() / w_after_first_step
        torch.testing.assert_close(model.stages[i].w.detach(), torch.tensor(expected.item()), rtol=1e-5, atol=1e-6)


def test_concurrent_dropout_masks_repeat_the_serial_run(monkeypatch):
    """Turns admit micro-batches to a device in order, so its generator is drawn as in a
    serial run: same masks, whatever the thread timing."""
    def run(concurrency):
        monkeypatch.setenv("OPENPOP_CONCURRENT_STAGES", concurrency)
        torch.manual_seed(0)
        model = DropoutStages()
        opts = strategy_options(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement), ga=8, di=2)
        pop = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=1e-3))
        first, second, _ = pop(torch.ones(2 * 8 * 2, 256))
        assert pop._executable.concurrent == (concurrency == "on")
        return first, second, [p.detach().clone() for p in model.parameters()]

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        serial = run("off")
        for _ in range(3):
            concurrent = run("on")
            assert torch.equal(concurrent[0], serial[0]) and torch.equal(concurrent[1], serial[1])
            for a, b in zip(concurrent[2], serial[2]):
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    finally:
        sys.setswitchinterval(interval)


def run_micro_batch_threads(micro_batch, count):
    """Start ``micro_batch(i)`` threads in reverse order (the worst case for ordering); all
    must finish (no deadlock)."""
    threads = [threading.Thread(target=micro_batch, args=(i,)) for i in reversed(range(count))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert not any(thread.is_alive() for thread in threads)


def test_a_device_holding_two_stages_keeps_a_micro_batch_until_its_last_visit():
    """Round-robin map: device a holds stages 0 and 2, device b stages 1 and 3. Micro-batch 1
    may start stage 0 on a only after micro-batch 0 has run stage 2 there (a serial run's order
    of work, hence of random numbers, on every device), while b overlaps with a."""
    from openpop.runtime.devices import DeviceMap
    from openpop.runtime.pipeline import DeviceLocks
    from openpop.runtime.plan import ExecutionPlan, PlannedBlock
    a, b = torch.device("cuda", 0), torch.device("cuda", 1)  # names only
    plan = ExecutionPlan([PlannedBlock(f"s{i}", f"s{i}", i, i, []) for i in range(4)], 4, 4, True,
                         device_map=DeviceMap([a, b], ipus_per_replica=4, replicas=1))
    assert plan.device_visits() == {a: 2, b: 2}
    locks = DeviceLocks()
    locks.start_step([plan.device_visits()] * 4)
    work = {a: [], b: []}

    def micro_batch(index):
        locks.begin_micro_batch(index)
        with locks.on(a):  # the root module, then stage 0
            work[a].append((index, 0))
            for stage, device in ((1, b), (2, a), (3, b)):
                with locks.on(device):
                    work[device].append((index, stage))
        locks.end_micro_batch()

    run_micro_batch_threads(micro_batch, 4)
    assert work[a] == [(i, s) for i in range(4) for s in (0, 2)]
    assert work[b] == [(i, s) for i in range(4) for s in (1, 3)]


def test_device_turns_admit_micro_batches_in_order():
    """Two 'devices' (names only), four micro-batches started in reverse: each device still
    sees them in order 0, 1, 2, 3, and a micro-batch that skips a device does not block it."""
    from openpop.runtime.pipeline import DeviceLocks
    a, b = torch.device("cuda", 0), torch.device("cuda", 1)
    locks = DeviceLocks()
    locks.start_step([{a: 1, b: 1}] * 4)
    seen = {a: [], b: []}

    def micro_batch(index):
        locks.begin_micro_batch(index)
        with locks.on(a):
            seen[a].append(index)
            if index != 2:  # micro-batch 2 never uses device b
                with locks.on(b):
                    seen[b].append(index)
        locks.end_micro_batch()

    run_micro_batch_threads(micro_batch, 4)
    assert seen == {a: [0, 1, 2, 3], b: [0, 1, 3]}


def test_device_locks_hold_one_device_per_thread():
    from openpop.runtime.pipeline import DeviceLocks
    locks = DeviceLocks()
    cpu, other = torch.device("cpu"), torch.device("cuda", 0)  # names only: locks do not touch devices
    with locks.on(cpu):
        assert locks.held() == cpu
        with locks.on(other):
            assert locks.held() == other
            assert not locks._lock(cpu).locked() and locks._lock(other).locked()
        assert locks.held() == cpu and locks._lock(cpu).locked() and not locks._lock(other).locked()
    assert locks.held() is None and not locks._lock(cpu).locked()


# --------------------------------------------------------------------------- real GPUs
@pytest.mark.gpu
def test_two_replicas_on_two_gpus_match_the_oracle():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    torch.manual_seed(0)
    model = FourBlocks()
    reference = copy.deepcopy(model)
    opts = replicated_options().deviceMap(["cuda:0", "cuda:1"])
    x, t = torch.randn(24, 8), torch.randn(24, 8)
    pop = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.05))
    _, losses = pop(x, t)
    assert pop._session.replicas.model(1).layers[0].weight.device == torch.device("cuda:1")
    assert model.layers[0].weight.device == torch.device("cuda:0")
    ref_losses = train_loop(reference, torch.optim.SGD(reference.parameters(), lr=0.05), (x, t), loss_of, 2, 3, 2)
    torch.testing.assert_close(losses.flatten().cpu(), ref_losses, rtol=1e-4, atol=1e-5)
    pop.destroy()
    assert_same_parameters(model, reference, tol=1e-4)


# --------------------------------------------------------------------------- structural copies
class Shell(torch.nn.Module):
    """Holds an uncopyable object (a lock, like a Lightning Trainer), tied weights, a metric-like
    parameterless module with state, and an instance-level forward bound to itself."""

    def __init__(self):
        super().__init__()
        self.owner = {"lock": threading.Lock()}
        self.embed = torch.nn.Linear(4, 4, bias=False)
        self.head = torch.nn.Linear(4, 4, bias=False)
        self.head.weight = self.embed.weight
        self.counter = Counter()
        self.forward = self.instance_forward

    def instance_forward(self, x, t):
        out = self.head(torch.tanh(self.embed(x)))
        self.counter(x)
        return out, F.mse_loss(out, t)


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rows = 0

    def forward(self, x):
        self.rows += x.shape[0]


def test_replicas_are_structural_copies(replicas_apart):
    torch.manual_seed(0)
    model = Shell()
    reference = Shell()
    reference.load_state_dict(model.state_dict())
    pop = poptorch.trainingModel(model, replicated_options(di=2, ga=2),
                                 torch.optim.SGD(model.parameters(), lr=0.1))
    x, t = torch.randn(16, 4), torch.randn(16, 4)
    _, losses = pop(x, t)
    replica = pop._session.replicas.model(1)
    assert replica is not model and replica.owner is model.owner  # shared, not copied
    assert replica.head.weight is replica.embed.weight and replica.embed.weight is not model.embed.weight
    # compile pass (one micro-batch) + both replicas
    assert replica.counter is model.counter and model.counter.rows == 2 + 16
    ref_losses = train_loop(reference, torch.optim.SGD(reference.parameters(), lr=0.1), (x, t),
                            lambda m, x, t: m(x, t)[1], 2, 2, 2)
    torch.testing.assert_close(losses.flatten(), ref_losses, rtol=1e-6, atol=1e-6)
    # Plain attributes follow replica 0 at every call.
    model.owner = {"changed": True}
    pop(x, t)
    assert replica.owner is model.owner


def test_lightning_fit_and_validate_with_replicas_apart(replicas_apart):
    pytest.importorskip("lightning.pytorch")
    torchmetrics = pytest.importorskip("torchmetrics")
    from helpers.lightning_models import IPUStrategy, Regressor, loader, make_net, regression_data, trainer

    class Metered(Regressor):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.total = torchmetrics.SumMetric()

        def validation_step(self, batch, batch_idx):
            self.total.update(batch[0][:, 0])
            self.log("total", self.total)

    x, y = regression_data(n=64)
    model = Metered(net=make_net(), lr=0.05)
    reference = copy.deepcopy(model.net)
    t = trainer(accelerator="ipu", devices=2, strategy=IPUStrategy(device_iterations=2), max_epochs=1)
    t.fit(model, loader(x, y, batch_size=4))
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)
    for step in range(4):  # 64 rows = 4 host calls of 2 steps x 2 replicas x 4 rows; 8 steps in all
        for d in range(2):
            rows = slice(step * 16 + d * 8, step * 16 + d * 8 + 8)
            optimizer.zero_grad()
            F.mse_loss(reference(x[rows]), y[rows]).backward()
            optimizer.step()
    for ours, theirs in zip(model.net.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    (result,) = t.validate(model, loader(x, y, batch_size=4), verbose=False)
    assert result["total"] == pytest.approx(x[:, 0].sum().item(), rel=1e-5, abs=1e-5)


# --------------------------------------------------------------------------- replica 0 changes between calls
def test_host_edits_freezing_and_hooks_reach_every_replica(replicas_apart, monkeypatch):
    """What the user does to replica 0 between calls (edit weights, freeze, add or remove a
    hook) holds for every replica: same results as replicas sharing one weight set."""
    def run(apart):
        if not apart:
            monkeypatch.undo()
        torch.manual_seed(0)
        model = FourBlocks()
        pop = poptorch.trainingModel(model, replicated_options(di=1, ga=2),
                                     torch.optim.SGD(model.parameters(), lr=0.1))
        x, t = torch.randn(8, 8), torch.randn(8, 8)
        first = pop(x, t)[1]
        model.layers[1].weight.data.mul_(0.5)  # host edit through .data (no version bump), no copyWeightsToDevice
        model.layers[3].weight.requires_grad_(False)  # frozen after compile
        frozen = model.layers[3].weight.detach().clone()
        calls = []
        handle = model.layers[0].register_forward_hook(lambda m, i, o: calls.append(o.shape[0]))
        second = pop(x, t)[1]
        handle.remove()
        third = pop(x, t)[1]
        assert torch.equal(model.layers[3].weight, frozen)
        return [first, second, third], calls, [p.detach().clone() for p in model.parameters()]

    ours = run(apart=True)
    theirs = run(apart=False)
    assert ours[1] == theirs[1] == [2, 2, 2, 2]  # 2 micro-batches x 2 replicas, then removed
    for a, b in zip(ours[0], theirs[0]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    for a, b in zip(ours[2], theirs[2]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- failures leave no lock behind
class FailsOnce(FourBlocks):
    def __init__(self):
        super().__init__("begin_block")
        self.fail_at = 3
        self.calls = 0

    def forward(self, x, target):
        self.calls += 1
        if self.calls == self.fail_at:
            x = self.layers[0](x)
            raise RuntimeError("user error in micro-batch")
        return super().forward(x, target)


def test_a_failing_micro_batch_leaves_no_device_lock_held(monkeypatch):
    monkeypatch.setenv("OPENPOP_CONCURRENT_STAGES", "on")
    model = FailsOnce()
    opts = strategy_options(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement), ga=8, di=1)
    pop = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    x, t = torch.randn(16, 8), torch.randn(16, 8)
    pop.compile(x, t)
    with pytest.raises(RuntimeError, match="user error in micro-batch"):
        pop(x, t)
    locks = pop._session.locks
    assert not locks._lock(torch.device("cpu")).locked()
    pop(x, t)  # runs normally afterwards


def test_interrupted_concurrent_run_waits_for_running_micro_batches(monkeypatch):
    from openpop.runtime import pipeline
    pool = pipeline.ConcurrentMicroBatches(2)
    finished = []
    real_wait = pipeline.concurrent.futures.wait
    interrupts = iter([True])

    def interrupted_wait(futures, *args, **kwargs):
        if next(interrupts, False):
            raise KeyboardInterrupt
        return real_wait(futures, *args, **kwargs)

    def task(index):
        time.sleep(0.05)
        finished.append(index)

    monkeypatch.setattr(pipeline.concurrent.futures, "wait", interrupted_wait)
    with pytest.raises(KeyboardInterrupt):
        pool.run(6, task)
    # The micro-batches already running finished; the ones not started were cancelled.
    assert threading.active_count() >= 1 and 1 <= len(finished) < 6
    monkeypatch.undo()
    before = len(finished)
    time.sleep(0.2)
    assert len(finished) == before  # nothing still running after run() returned
    pool.shutdown()


def test_cuda_current_device_follows_block_boundaries(monkeypatch):
    """Logic of the GPU path on the CPU: the current CUDA device is the block's while it runs,
    and restored after (devices and copies are faked; nothing touches a GPU)."""
    from openpop.runtime import devices
    current = [0]
    calls = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])

    def set_device(device):
        current[0] = torch.device(device).index if not isinstance(device, int) else device
        calls.append(current[0])

    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    monkeypatch.setattr(devices, "to_device", lambda value, device: value)
    model = FourBlocks()
    ipu_of = {"layers.0": 0, "layers.1": 0, "layers.2": 1, "layers.3": 1}
    placement = devices.DevicePlacement(model, lambda name: torch.device("cuda", ipu_of.get(name, 0)))
    seen = []
    placement.install_hooks()
    model.layers[2].register_forward_pre_hook(lambda m, i: seen.append(current[0]))  # after the mover
    model(torch.randn(2, 8), torch.randn(2, 8))
    placement.remove_hooks()
    assert seen == [1] and current[0] == 0
    assert calls == [0, 1, 0, 1, 0, 0]  # root; layers.2 in/out; layers.3 in/out; root out


def test_interrupted_block_restores_the_cuda_device(monkeypatch):
    """KeyboardInterrupt skips forward hooks; the executor's reset puts the thread's CUDA device
    back (devices faked as above)."""
    from openpop.runtime import devices
    current = [0]
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: current.__setitem__(0, torch.device(d).index
                                                                                 if not isinstance(d, int) else d))
    monkeypatch.setattr(devices, "to_device", lambda value, device: value)
    model = FourBlocks()
    placement = devices.DevicePlacement(model, lambda name: torch.device("cuda", 1 if name == "layers.2" else 0))
    placement.install_hooks()

    def interrupt(module, inputs):
        raise KeyboardInterrupt

    model.layers[2].register_forward_pre_hook(interrupt)
    with pytest.raises(KeyboardInterrupt):
        model(torch.randn(2, 8), torch.randn(2, 8))
    placement.remove_hooks()
    assert current[0] == 1  # left on the block's GPU
    devices.reset_boundary_frames()
    assert current[0] == 0 and devices._frames() == []


def test_recomputation_on_another_thread_sees_the_forwards_run_context():
    """On GPUs autograd recomputes on its own threads: the run context (isRunningOnIpu) and
    cross-device alignment are re-entered there."""
    from openpop.runtime import context
    from openpop.runtime.devices import SameDeviceOps
    from openpop.runtime.pipeline import _forward_state, _function_modes
    with context.running(True) as ctx, SameDeviceOps():
        as_in_forward = _forward_state()
    seen = {}

    def recompute():
        seen["before"] = poptorch.isRunningOnIpu()
        with as_in_forward():
            seen["ctx"] = context.current() is ctx and poptorch.isRunningOnIpu()
            seen["aligned"] = any(isinstance(m, SameDeviceOps) for m in _function_modes())
        seen["after"] = context.current()

    thread = threading.Thread(target=recompute)
    thread.start()
    thread.join()
    assert seen == {"before": False, "ctx": True, "aligned": True, "after": None}


def test_cpu_boundaries_without_locks_leave_no_frames():
    from openpop.runtime import devices
    model = FourBlocks()
    placement = devices.DevicePlacement(model, lambda name: torch.device("cpu"))
    placement.install_hooks()
    for _ in range(3):
        model(torch.randn(2, 8), torch.randn(2, 8))
    placement.remove_hooks()
    assert devices._frames() == []
