"""Replicated models with BatchNorm (and other normalisation statistics) train without
``broadcastBuffers(False)``, as on PopTorch: each replica keeps its own running statistics
and the host sees replica 0's. Other buffers a model changes in place still need the option."""
import copy

import pytest
import torch
import torch.nn.functional as F

import poptorch

from helpers.oracle import micro_batches, train_loop


class ConvNet(torch.nn.Module):
    """A small ResNet-like stem: conv, BatchNorm2d, pooling, classifier."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4, 5)

    def forward(self, x, labels):
        h = torch.relu(self.bn(self.conv(x)))
        out = self.fc(h.mean(dim=(2, 3)))
        return out, F.cross_entropy(out, labels)


class FunctionalNorm(torch.nn.Module):
    """Running statistics kept in the model's own buffers, updated by ``F.batch_norm``."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.register_buffer("mean", torch.zeros(4))
        self.register_buffer("var", torch.ones(4))

    def forward(self, x):
        h = F.batch_norm(self.fc(x), self.mean, self.var, training=True, momentum=0.5)
        return h, poptorch.identity_loss(h.pow(2), reduction="mean")


class InstanceNormed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 6)
        self.norm = torch.nn.InstanceNorm1d(2, track_running_stats=True)

    def forward(self, x):
        h = self.norm(self.fc(x).reshape(-1, 2, 3))
        return h, poptorch.identity_loss(h.pow(2), reduction="mean")


def options(di, ga, r, broadcast=None):
    opts = poptorch.Options().deviceIterations(di).replicationFactor(r)
    opts.Training.gradientAccumulation(ga)
    if broadcast is not None:
        opts.broadcastBuffers(broadcast)
    return opts


def replica_zero_statistics(model, inputs, di, ga, r, call):
    """The statistics replica 0 ends with: ``call(model, micro-batches...)`` on its micro-batches
    only (statistics do not affect the training-mode forward or the gradients)."""
    splits = [micro_batches(t, di, ga, r) for t in inputs]
    with torch.no_grad():
        for d in range(di):
            for g in range(ga):
                call(model, *[s[d][g][0] for s in splits])


@pytest.mark.parametrize("broadcast", [None, False])
def test_replicated_batchnorm_trains_without_broadcast_buffers(broadcast):
    di, ga, r = 2, 2, 2
    g = torch.Generator().manual_seed(3)
    x = torch.randn(di * ga * r * 2, 3, 5, 5, generator=g)
    labels = torch.randint(0, 5, (x.shape[0],), generator=g)
    model = ConvNet()
    reference = copy.deepcopy(model)
    pop = poptorch.trainingModel(model, options(di, ga, r, broadcast),
                                 torch.optim.SGD(model.parameters(), lr=0.1))
    _, _loss = pop(x, labels)
    train_loop(reference, torch.optim.SGD(reference.parameters(), lr=0.1), (x, labels),
               lambda m, a, b: m(a, b)[1], di, ga, r)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param, reference.get_parameter(name), msg=name)
    assert int(model.bn.num_batches_tracked) == di * ga  # replica 0's micro-batches only


def test_replica_zero_statistics_reach_the_host():
    di, ga, r = 2, 2, 2
    x = torch.randn(di * ga * r * 2, 3, 5, 5)
    labels = torch.randint(0, 5, (x.shape[0],))
    model = ConvNet()
    reference = copy.deepcopy(model)
    # lr=0: the statistics then depend on the data only, not on when the weights changed.
    poptorch.trainingModel(model, options(di, ga, r), torch.optim.SGD(model.parameters(), lr=0.0))(x, labels)
    replica_zero_statistics(reference, (x, labels), di, ga, r, lambda m, a, b: m(a, b))
    torch.testing.assert_close(model.bn.running_mean, reference.bn.running_mean)
    torch.testing.assert_close(model.bn.running_var, reference.bn.running_var)


def test_functional_batch_norm_on_own_buffers_is_a_statistic_too():
    di, ga, r = 1, 2, 2
    x = torch.randn(di * ga * r * 3, 4)
    model = FunctionalNorm()
    reference = copy.deepcopy(model)
    pop = poptorch.trainingModel(model, options(di, ga, r), torch.optim.SGD(model.parameters(), lr=0.0))
    pop(x)
    replica_zero_statistics(reference, (x,), di, ga, r, lambda m, a: m(a))
    torch.testing.assert_close(model.mean, reference.mean)
    torch.testing.assert_close(model.var, reference.var)


def test_instance_norm_statistics_with_replicas():
    di, ga, r = 1, 1, 2
    x = torch.randn(di * ga * r * 2, 6)
    model = InstanceNormed()
    reference = copy.deepcopy(model)
    pop = poptorch.trainingModel(model, options(di, ga, r), torch.optim.SGD(model.parameters(), lr=0.0))
    pop(x)
    replica_zero_statistics(reference, (x,), di, ga, r, lambda m, a: m(a))
    torch.testing.assert_close(model.norm.running_mean, reference.norm.running_mean)


def test_replicated_inference_in_training_mode_keeps_per_replica_statistics():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    outputs_reference = copy.deepcopy(model)
    statistics_reference = copy.deepcopy(model)
    di, r = 2, 2
    x = torch.randn(di * r * 3, 4)
    pop = poptorch.inferenceModel(model, options(di, 1, r))
    out = pop(x)
    # In training mode the output uses each micro-batch's own statistics.
    torch.testing.assert_close(out, torch.cat([outputs_reference(chunk).detach() for chunk in x.split(3)]))
    replica_zero_statistics(statistics_reference, (x,), di, 1, r, lambda m, a: m(a))
    pop.copyWeightsToHost()
    torch.testing.assert_close(model[1].running_mean, statistics_reference[1].running_mean)


class CountsCalls(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.bn = torch.nn.BatchNorm1d(4)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        h = self.bn(self.fc(x))
        return h, poptorch.identity_loss(h.pow(2), reduction="mean")


def test_other_buffers_changed_in_place_still_need_broadcast_disabled():
    model = CountsCalls()
    before = copy.deepcopy(model.state_dict())
    failing = poptorch.trainingModel(model, options(1, 1, 2))
    with pytest.raises(poptorch.Error, match=r"PopTorch does not support broadcasting buffers\. If your model is "
                                             r"able to tolerate buffers becoming out of sync between replicas, "
                                             r"you can disable buffer broadcasting using "
                                             r"poptorch\.Options\.broadcastBuffers\(False\)\."):
        failing(torch.randn(4, 4))
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    model.destroy()
    poptorch.trainingModel(model, options(1, 1, 2, broadcast=False))(torch.randn(4, 4))
    assert float(model.calls) == 1.0  # replica 0's count
