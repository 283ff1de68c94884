"""Concurrent micro-batches (several devices, or ``OPENPOP_CONCURRENT_STAGES=on``) add their
gradients in micro-batch order, so a pipelined model trains bit for bit as in a serial run, run
after run (before: in completion order, which differed from run to run)."""
import pytest
import torch
import torch.nn.functional as F

import poptorch
from openpop.runtime.devices import DeviceMap

DEVICES = ["cpu", "cpu:1", "cpu:2", "cpu:3"]  # four virtual IPUs on "several" devices, all the CPU


class Pipelined(torch.nn.Module):
    """Four blocks on four IPUs, dropout in two of them (so the RNG order matters too)."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(4))
        self.drop = torch.nn.Dropout(0.2)
        for i, layer in enumerate(self.layers):
            poptorch.BeginBlock(layer, user_id=f"b{i}", ipu_id=i)

    def forward(self, x, target):
        for i, layer in enumerate(self.layers):
            x = torch.tanh(layer(x))
            if i in (1, 2):
                x = self.drop(x)
        return x, F.mse_loss(x, target)


def train(monkeypatch, concurrent, *, recompute=True, running_mean=False, replicas=1, calls=2):
    monkeypatch.setenv("OPENPOP_CONCURRENT_STAGES", "on" if concurrent else "off")
    torch.manual_seed(0)
    model = Pipelined()
    ga, di = 8, 2
    opts = poptorch.Options().deviceIterations(di).replicationFactor(replicas).deviceMap(DEVICES)
    opts.showCompilationProgressBar(False).outputMode(poptorch.OutputMode.All)
    opts.Training.gradientAccumulation(ga)
    if not recompute:
        opts._Popart.set("autoRecomputation", 0)
    if running_mean:
        opts.Training.setMeanAccumulationAndReplicationReductionStrategy(poptorch.MeanReductionStrategy.Running)
    pop = poptorch.trainingModel(model, opts, torch.optim.Adam(model.parameters(), lr=0.01))
    generator = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(calls):
        n = di * ga * replicas * 4
        _, loss = pop(torch.randn(n, 16, generator=generator), torch.randn(n, 16, generator=generator))
        losses.append(loss)
    assert pop._executable.concurrent == concurrent
    return [p.detach().clone() for p in model.parameters()], torch.cat(losses)


def assert_equal_bits(a, b):
    (params_a, losses_a), (params_b, losses_b) = a, b
    assert torch.equal(losses_a, losses_b)
    assert all(torch.equal(p, q) for p, q in zip(params_a, params_b))


@pytest.mark.parametrize("recompute", [True, False])
def test_concurrent_equals_serial_bit_for_bit_run_after_run(monkeypatch, recompute):
    serial = train(monkeypatch, False, recompute=recompute)
    for _ in range(3):
        assert_equal_bits(serial, train(monkeypatch, True, recompute=recompute))


def test_concurrent_running_mean_equals_serial(monkeypatch):
    """The running mean (kept for float16 accumulators) is applied in micro-batch order too."""
    serial = train(monkeypatch, False, running_mean=True, calls=1)
    assert_equal_bits(serial, train(monkeypatch, True, running_mean=True, calls=1))


def test_replicas_with_their_own_weights_concurrent_equals_serial(monkeypatch):
    monkeypatch.setattr(DeviceMap, "replicas_share_devices", lambda self: False)
    serial = train(monkeypatch, False, recompute=False, replicas=2, calls=1)
    for _ in range(2):
        assert_equal_bits(serial, train(monkeypatch, True, recompute=False, replicas=2, calls=1))


class FailsInOneMicroBatch(Pipelined):
    def __init__(self):
        super().__init__()
        self.calls = 0
        self.fail_on = None

    def forward(self, x, target):
        self.calls += 1
        if self.calls == self.fail_on:
            raise ValueError("micro-batch failed")
        return super().forward(x, target)


def test_a_failing_concurrent_micro_batch_does_not_hold_up_the_others(monkeypatch):
    """The micro-batches after a failed one do not wait for its turn forever; the call is rolled back."""
    monkeypatch.setenv("OPENPOP_CONCURRENT_STAGES", "on")
    model = FailsInOneMicroBatch()
    opts = poptorch.Options().deviceIterations(2).deviceMap(DEVICES).showCompilationProgressBar(False)
    opts.Training.gradientAccumulation(8)
    pop = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    x, t = torch.randn(2 * 8 * 2, 16), torch.randn(2 * 8 * 2, 16)
    pop(x, t)
    before = [p.detach().clone() for p in model.parameters()]
    model.calls, model.fail_on = 0, 8 + 3  # the second step: the first step was applied
    with pytest.raises(ValueError, match="micro-batch failed"):
        pop(x, t)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    model.fail_on = None
    pop(x, t)
