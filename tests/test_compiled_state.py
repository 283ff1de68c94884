"""The compiled backend's state beyond parameters: buffers the forward updates (BatchNorm running
statistics, a buffer changed in place) and dropout's random numbers, against eager openpop and a
hand-written loop (runtime/compiled/program.py's docstring states the contract: masks equal
eager's, drawn from torch's generator in eager's micro-batch order)."""
import copy

import pytest
import torch
import torch.nn.functional as F

import poptorch

from helpers.models import make_data
from helpers.oracle import train_loop

P = 0.5


class NormedDropout(torch.nn.Module):
    """Linear, BatchNorm, dropout, input noise (``randn_like``: Inductor would draw it with its
    own generator code); a buffer summing its inputs in place; the dropped activations are an
    output (their zeros are the mask)."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 8)
        self.bn = torch.nn.BatchNorm1d(8)
        self.fc2 = torch.nn.Linear(8, 2)
        self.register_buffer("seen", torch.zeros(6))

    def forward(self, x, target):
        self.seen.add_(x.detach().sum(0))
        if self.training:
            x = x + 0.1 * torch.randn_like(x)
        dropped = F.dropout(self.bn(self.fc1(x)), P, self.training)
        out = self.fc2(torch.relu(dropped))
        return out, F.mse_loss(out, target), dropped


def options(backend, di, ga, r=1, seed=5):
    # The whole-call program is what these tests check: pinned, so a slow probe on a busy machine
    # cannot pick "regions" (the load-dependent auto choice is the reliability issue's).
    unit = "program" if backend == "compiled" else None
    opts = poptorch.Options().deviceIterations(di).replicationFactor(r).randomSeed(seed)
    opts.openpopBackend(backend, unit=unit)
    opts.Training.gradientAccumulation(ga)
    opts.broadcastBuffers(False)  # ``seen`` is not a normalisation statistic: per replica
    opts.outputMode(poptorch.OutputMode.All)
    opts.showCompilationProgressBar(False)
    return opts


def train(backend, base, di, ga, r, calls=2, seed=5):
    """``calls`` host calls; returns the outputs, the model's state, replica 1's stored buffers,
    torch's generator state after them and the training model."""
    model = copy.deepcopy(base)
    pop = poptorch.trainingModel(model, options(backend, di, ga, r, seed),
                                 torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    outs = [pop(*make_data(di * ga * r * 4, seed=call)) for call in range(calls)]
    assert pop._dispatch.compiled.last == backend
    replicas = pop._executable.replica_buffers
    names = [name for name, _ in model.named_buffers(remove_duplicate=False)]  # the executor's order
    stored = {n: b.clone() for n, b in zip(names, replicas.values[1])} if replicas.per_replica else {}
    return outs, copy.deepcopy(model.state_dict()), stored, torch.get_rng_state(), pop


def assert_same_state(a, b, rtol=1e-5, atol=1e-6):
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=rtol, atol=atol, msg=key)


@pytest.fixture(scope="module")
def base():
    torch.manual_seed(0)
    return NormedDropout()


DI, GA = 3, 2


@pytest.fixture(scope="module")
def compiled(base):
    return train("compiled", base, DI, GA, 1)


@pytest.mark.slow
def test_statistics_and_dropout_match_eager_and_hand_loop(base, compiled):
    di, ga = DI, GA
    eager = train("eager", base, di, ga, 1)

    reference = copy.deepcopy(base)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(5)
    hand_losses = [train_loop(reference, optimizer, make_data(di * ga * 4, seed=call),
                              lambda m, x, t: m(x, t)[1], di, ga, 1) for call in range(2)]

    for (out, loss, dropped), (e_out, e_loss, e_dropped), h_loss in zip(compiled[0], eager[0], hand_losses):
        assert torch.equal(dropped == 0, e_dropped == 0)  # the same masks, micro-batch by micro-batch
        torch.testing.assert_close(loss, e_loss, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(loss.reshape(-1), h_loss, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out, e_out, rtol=1e-5, atol=1e-6)
    assert_same_state(compiled[1], eager[1])
    assert_same_state(compiled[1], reference.state_dict())
    assert compiled[1]["bn.num_batches_tracked"] == 2 * di * ga
    assert torch.equal(compiled[3], eager[3])  # the generator ends where eager's does

    # The stream: every micro-batch draws its own mask, at rate P; another seed, other masks.
    masks = torch.cat([dropped for _, _, dropped in compiled[0]]).reshape(2 * di * ga, 4, 8) == 0
    assert len({tuple(m.flatten().tolist()) for m in masks}) == 2 * di * ga
    assert abs(masks.float().mean().item() - P) < 0.15
    reseeded = train("compiled", base, di, ga, 1, calls=1, seed=6)
    assert not torch.equal(reseeded[0][0][2] == 0, compiled[0][0][2] == 0)


@pytest.mark.slow
def test_replicas_keep_their_own_buffers_and_draw_their_own_masks(base):
    compiled = train("compiled", base, 2, 1, 2)
    eager = train("eager", base, 2, 1, 2)
    for (_, loss, dropped), (_, e_loss, e_dropped) in zip(compiled[0], eager[0]):
        assert torch.equal(dropped == 0, e_dropped == 0)
        torch.testing.assert_close(loss, e_loss, rtol=1e-5, atol=1e-6)
    assert_same_state(compiled[1], eager[1])  # the host sees replica 0's buffers
    assert_same_state(compiled[2], eager[2])  # replica 1's, kept by the executor
    assert not torch.allclose(compiled[2]["bn.running_mean"], compiled[1]["bn.running_mean"])
    assert not torch.allclose(compiled[2]["seen"], compiled[1]["seen"])
    assert torch.equal(compiled[3], eager[3])


def test_eval_inference_draws_nothing_and_keeps_statistics(base):
    """``eval()``: no mask, no statistics update; ``seen`` (changed in any mode) is carried
    through the inference program's micro-batches into the executor's weight copies."""
    model = copy.deepcopy(base).eval()
    reference = copy.deepcopy(model)
    pop = poptorch.inferenceModel(model, options("compiled", 2, 1))
    x, t = make_data(8)
    rng = torch.get_rng_state()
    out, _, dropped = pop(x, t)
    assert pop._dispatch.compiled.last == "compiled"
    assert torch.equal(torch.get_rng_state(), rng)
    with torch.no_grad():
        expected = reference(x, t)
    torch.testing.assert_close(out, expected[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dropped, expected[2], rtol=1e-6, atol=1e-6)
    with pop._executable.weights.active():  # the executor's copies
        assert_same_state(model.state_dict(), reference.state_dict())


def test_a_failing_call_changes_nothing(compiled):
    """The program's buffers are committed only after it finished; the generators it advanced
    are put back."""
    pop = compiled[4]
    program = pop._dispatch.compiled._program
    run = program._compiled

    def fails_after_running(*args):
        run(*args)
        raise RuntimeError("injected")

    state, rng = copy.deepcopy(pop.model.state_dict()), torch.get_rng_state()
    program._compiled = fails_after_running
    try:
        with pytest.raises(RuntimeError, match="injected"):
            pop(*make_data(DI * GA * 4, seed=7))
    finally:
        program._compiled = run
    assert_same_state(pop.model.state_dict(), state, rtol=0, atol=0)
    assert torch.equal(torch.get_rng_state(), rng)
