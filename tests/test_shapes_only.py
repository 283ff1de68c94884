"""The compiled backend's probe micro-batch on fake tensors (runtime/shapes_only.py): it reports
what a real run reports and hashes the same aten ops, so a saved program's key is the same both
ways; with the executable cache a process whose program is saved runs no real probe. Nothing here
compiles (programs are built, not called)."""
import os

import pytest
import torch

import poptorch
from openpop.runtime import executable
from openpop.runtime.args import BoundInputs
from openpop.runtime.executable import trace_model
from openpop.runtime.shapes_only import ShapesOnly
from openpop.runtime.weights import ReplicaBuffers


class Stateful(torch.nn.Module):
    """BatchNorm (statistics), dropout (random draws), a buffer changed in place, two outputs."""

    def __init__(self, activation="relu", dropout=0.5):
        super().__init__()
        torch.manual_seed(0)
        self.first, self.norm, self.second = torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2)
        self.dropout = torch.nn.Dropout(dropout)
        self.activation = activation
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x, target):
        self.calls.add_(1)
        h = self.norm(self.first(x))
        h = self.dropout(torch.relu(h) if self.activation == "relu" else torch.tanh(h))
        out = self.second(h)
        return out, torch.nn.functional.mse_loss(out, target)


class Attention(torch.nn.Module):
    """Attention without dropout: its op is tagged as drawing random numbers, and draws none."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.qkv = torch.nn.Linear(8, 24)

    def forward(self, x, target):
        q, k, v = self.qkv(x).unsqueeze(1).chunk(3, dim=-1)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.0).squeeze(1)
        return out, torch.nn.functional.mse_loss(out, target)


class ReadsAValue(Stateful):
    """Reads a tensor's value in Python: fake tensors have none."""

    def forward(self, x, target):
        out, loss = super().forward(x, target)
        return out * float(x.abs().max().item() > 0), loss


def leave_saved(program):
    """An empty file where the program would be saved (as a process that compiled it leaves it)."""
    os.makedirs(os.path.dirname(program.saved.path), exist_ok=True)
    with open(program.saved.path, "wb"):
        pass


def built(model, cache=None, features=6, outputs=2):
    """``(executor, inputs)`` after one eager host call of an ``auto`` executor that never compiles."""
    opts = poptorch.Options().openpopBackend("auto", compile_after=1e9).showCompilationProgressBar(False)
    opts.Training.gradientAccumulation(2)
    if cache is not None:
        opts.enableExecutableCaching(str(cache))
    pop = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.01))
    args = (torch.randn(8, 4, features) if isinstance(model, Attention) else torch.randn(8, features),
            torch.randn(8, 4, outputs) if isinstance(model, Attention) else torch.randn(8, outputs))
    pop(*args)
    return pop, BoundInputs(pop._signature, args, {})


@pytest.mark.parametrize("model_class", [Stateful, Attention])
def test_a_probe_on_shapes_reports_what_a_real_probe_reports(model_class, tmp_path):
    model = model_class()
    pop, inputs = built(model, tmp_path, *((8, 8) if model_class is Attention else ()))
    backend = pop._dispatch.compiled
    state = [b.clone() for b in model.buffers()], torch.random.get_rng_state()
    shaped = backend._probe(pop._view, inputs, pop._executable, ShapesOnly())
    ops = backend._ops, backend._ops_digest
    for before, after in zip(state[0], model.buffers()):
        assert torch.equal(before, after)  # (the counter ran for real under the fake mode: restored)
    assert torch.equal(state[1], torch.random.get_rng_state())

    real = backend._probe(pop._view, inputs, pop._executable)
    assert shaped == real
    assert (backend._ops, backend._ops_digest) == ops
    if model_class is Stateful:
        assert real.draws_random and set(real.updated_buffers) == {
            "calls", "norm.running_mean", "norm.running_var", "norm.num_batches_tracked"}
    else:
        assert not real.draws_random and not real.updated_buffers


def test_a_saved_program_is_found_without_a_real_probe(tmp_path):
    pop, inputs = built(Stateful(), tmp_path)
    program = pop._dispatch.compiled._program_for(pop._view, inputs, pop._executable)
    assert pop._dispatch.compiled.probed_on == "values"  # nothing saved: the real probe says what is compiled
    leave_saved(program)

    pop, inputs = built(Stateful(), tmp_path)
    again = pop._dispatch.compiled._program_for(pop._view, inputs, pop._executable)
    assert pop._dispatch.compiled.probed_on == "shapes" and again.saved.path == program.saved.path

    pop, inputs = built(Stateful("tanh"), tmp_path)
    other = pop._dispatch.compiled._program_for(pop._view, inputs, pop._executable)
    assert pop._dispatch.compiled.probed_on == "values" and other.saved.path != program.saved.path

    pop, inputs = built(Stateful(dropout=0.0), tmp_path)  # same ops but no draw: another program
    other = pop._dispatch.compiled._program_for(pop._view, inputs, pop._executable)
    assert other.saved.path != program.saved.path


def test_a_model_fake_tensors_cannot_run_is_probed_for_real(tmp_path):
    pop, inputs = built(ReadsAValue(), tmp_path)
    assert pop._dispatch.compiled._probe_shapes(pop._view, inputs, pop._executable) is None
    program = pop._dispatch.compiled._program_for(pop._view, inputs, pop._executable)
    leave_saved(program)
    pop, inputs = built(ReadsAValue(), tmp_path)
    assert pop._dispatch.compiled._program_for(pop._view, inputs, pop._executable).saved.path == program.saved.path
    assert pop._dispatch.compiled.probed_on == "values"


@pytest.mark.parametrize("model_class", [Stateful, ReadsAValue])
def test_the_executors_trace_on_shapes_finds_what_a_real_trace_finds(model_class, monkeypatch):
    """Two replicas and a buffer the forward changes: per-replica buffers either way; the loss is
    found among the outputs. A model that reads a value is traced for real."""
    runs = []

    def trace(*args):
        runs.append("shapes" if args[-1] is not None else "values")
        return run_trace(*args)

    run_trace = executable._trace
    monkeypatch.setattr(executable, "_trace", trace)
    model = model_class()
    opts = poptorch.Options().replicationFactor(2).broadcastBuffers(False).showCompilationProgressBar(False)
    pop = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.01))
    args = (torch.randn(8, 6), torch.randn(8, 2))
    pop.compile(*args)
    inputs = BoundInputs(pop._signature, args, {})
    state = [b.clone() for b in model.buffers()]
    traced = [trace_model(model, inputs, pop._settings, pop._precision, pop._executable.weights, shapes_only)
              for shapes_only in (True, False)]
    for before, after in zip(state, model.buffers()):
        assert torch.equal(before, after)
    shaped, real = traced
    fell_back = model_class is ReadsAValue  # (its shapes run raised: run again for real)
    assert runs[-3:] == (["shapes", "values", "values"] if fell_back else ["values", "shapes", "values"])
    assert (shaped.loss_index, shaped.track_losses) == (real.loss_index, real.track_losses) == (1, False)
    assert type(shaped.replica_buffers) is type(real.replica_buffers) is ReplicaBuffers
    assert shaped.plan.blocks == real.plan.blocks
