"""Buffers written in forward are device state between micro-batches, as on an IPU
(``runtime/buffer_state.py``): the next micro-batch, device iteration and host call read their
values, never their autograd history; within a micro-batch gradients flow through them as in
PyTorch.

The oracle is the hand-written loop Graphcore's TGN application runs on the CPU: every
micro-batch a forward and a backward, then the buffers detached (``detach_()``); with replicas,
each replica's micro-batches run on buffers of its own (the host ends with replica 0's).
"""
import copy

import pytest
import torch
import torch.nn.functional as F

import poptorch
from openpop.runtime.devices import DeviceMap

from helpers.oracle import micro_batches

NODES, DIM = 12, 4


class Memory(torch.nn.Module):
    """TGN's memory module in small: per-node state read at the start of the forward and
    written back with values that require grad (``index_put_``), plus plain values."""

    def __init__(self):
        super().__init__()
        self.register_buffer("memory", torch.zeros(NODES, DIM))
        self.register_buffer("last_seen", torch.zeros(NODES))
        self.cell = torch.nn.GRUCell(DIM + 1, DIM)

    def forward(self, idx, msg, t):
        old = self.memory[idx]
        new = self.cell(torch.cat([old, msg + (t - self.last_seen[idx]).unsqueeze(-1)], -1), old)
        self.memory.index_put_((idx,), new)
        self.last_seen[idx] = t
        return new


class TGNLike(torch.nn.Module):
    """The memory, a link predictor, a loss in training and probabilities in inference."""

    def __init__(self, blocks=False):
        super().__init__()
        self.memory = Memory()
        self.hidden = torch.nn.Linear(DIM, DIM)
        self.head = torch.nn.Linear(DIM, 1)
        if blocks:
            poptorch.BeginBlock(self.memory, ipu_id=0)
            poptorch.BeginBlock(self.hidden, ipu_id=1)

    def forward(self, idx, msg, t, y):
        z = self.memory(idx, msg, t)
        out = self.head(torch.relu(self.hidden(z))).squeeze(-1)
        if self.training:
            return out, F.binary_cross_entropy_with_logits(out, y)
        return out.sigmoid()


class WrittenThenRead(torch.nn.Module):
    """Reads the previous micro-batch's cache (a plain value), writes it with history and reads
    it again: the gradient flows through that write into ``fc`` within the micro-batch."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(DIM, DIM)
        self.out = torch.nn.Linear(DIM, DIM)
        self.register_buffer("cache", torch.zeros(DIM))

    def forward(self, x, target):
        h = torch.tanh(self.fc(x + self.cache))
        self.cache.copy_(h.mean(0))
        out = self.out(h) + self.cache.sum()
        return out, F.mse_loss(out, target)


class Reassigning(torch.nn.Module):
    """A registered buffer reassigned in forward (``self.ema = ...``) with values that require grad."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(DIM, DIM)
        self.out = torch.nn.Linear(DIM, DIM)
        self.register_buffer("ema", torch.zeros(DIM))

    def forward(self, x, target):
        h = torch.tanh(self.fc(x))
        self.ema = 0.5 * self.ema + 0.5 * h.mean(0)
        out = self.out(h + self.ema)
        return out, F.mse_loss(out, target)


# --------------------------------------------------------------------------- oracle
def detach_buffers(model):
    for buffer in model.buffers():
        buffer.detach_()


def oracle(model, optimizer, inputs, di, ga, r=1, states=None):
    """``train_loop`` with buffers as device state: detached after every micro-batch, one set
    per replica (the model ends holding replica 0's). ``states``: the replicas' buffers kept
    from call to call (a list, filled from the model's at the first call). Returns the losses
    ``[di, ga, r]``."""
    splits = [micro_batches(t, di, ga, r) for t in inputs]
    states = states if states is not None else []
    if not states:
        states.extend([b.detach().clone() for b in model.buffers()] for _ in range(r))
    states[0] = [b.detach().clone() for b in model.buffers()]  # (the host's are replica 0's)
    losses = []
    for d in range(di):
        optimizer.zero_grad(set_to_none=True)
        for g in range(ga):
            for k in range(r):
                load_buffers(model, states[k])
                loss = model(*[s[d][g][k] for s in splits])[1]
                (loss / (ga * r)).backward()
                detach_buffers(model)
                states[k] = [b.clone() for b in model.buffers()]
                losses.append(loss.detach())
        optimizer.step()
    load_buffers(model, states[0])
    return torch.stack(losses)


def load_buffers(model, values):
    with torch.no_grad():
        for buffer, value in zip(model.buffers(), values):
            buffer.copy_(value)


def tgn_data(rows_per_micro, micro_count, seed=0):
    """Distinct nodes within each micro-batch (``index_put_`` with repeated indices picks one)."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.cat([torch.randperm(NODES, generator=g)[:rows_per_micro] for _ in range(micro_count)])
    rows = idx.shape[0]
    msg = torch.randn(rows, 1, generator=g)
    t = torch.arange(rows, dtype=torch.float32) / rows
    y = torch.randint(0, 2, (rows,), generator=g).float()
    return idx, msg, t, y


def dense_data(rows, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, DIM, generator=g), torch.randn(rows, DIM, generator=g)


def options(di, ga, r=1, **backend):
    opts = poptorch.Options().deviceIterations(di).replicationFactor(r).outputMode(poptorch.OutputMode.All)
    opts.Training.gradientAccumulation(ga)
    if backend:
        opts.openpopBackend(**backend)
    return opts


def assert_same_state(model, reference, tol=1e-5):
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=tol, atol=tol, msg=name)
    for (name, b), c in zip(model.named_buffers(), reference.buffers()):
        torch.testing.assert_close(b, c, rtol=tol, atol=tol, msg=name)
        assert not b.requires_grad, name


def train_against_oracle(make, data, di, ga, r=1, calls=2, lr=0.1, opts=None, **backend):
    """``calls`` host calls of a training model against the oracle; returns the executor."""
    torch.manual_seed(1)
    model = make()
    reference = copy.deepcopy(model)
    opts = opts if opts is not None else options(di, ga, r, **backend)
    pop = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=lr))
    optimizer = torch.optim.SGD(reference.parameters(), lr=lr)
    states = []
    for call in range(calls):
        inputs = data(call)
        _, losses = pop(*inputs)
        expected = oracle(reference, optimizer, inputs, di, ga, r, states)
        torch.testing.assert_close(losses.reshape(-1), expected, rtol=1e-5, atol=1e-6)
        assert_same_state(model, reference)
    return pop


# --------------------------------------------------------------------------- serial
@pytest.mark.parametrize("di, ga", [(4, 1), (4, 2), (1, 3)])
def test_tgn_memory_trains_as_the_oracle(di, ga):
    rows = 3
    pop = train_against_oracle(TGNLike, lambda call: tgn_data(rows, di * ga, seed=call), di, ga)
    assert pop._executable.stateful_buffers


@pytest.mark.parametrize("make", [WrittenThenRead, Reassigning])
def test_gradient_flows_through_the_buffer_within_its_micro_batch(make):
    di, ga = 3, 2
    train_against_oracle(make, lambda call: dense_data(di * ga * 2, seed=call), di, ga)


def test_reassigned_buffer_stays_the_registered_tensor():
    model = Reassigning()
    registered = model.ema
    pop = poptorch.trainingModel(model, options(2, 2), torch.optim.SGD(model.parameters(), lr=0.1))
    pop(*dense_data(8))
    assert model.ema is registered and not registered.requires_grad
    assert registered.abs().sum() > 0


def test_models_without_stateful_buffers_do_nothing_per_micro_batch():
    """BatchNorm's statistics are written without autograd history: no BufferState."""
    from helpers.models import Normed
    model = Normed()
    pop = poptorch.trainingModel(model, options(2, 2), torch.optim.SGD(model.parameters(), lr=0.1))
    pop(torch.randn(16, 4))
    assert not pop._executable.stateful_buffers and pop._schedule.buffer_state is None


def test_compile_leaves_no_history_in_the_buffers():
    model = TGNLike()
    before = [b.clone() for b in model.buffers()]
    pop = poptorch.trainingModel(model, options(4, 1), torch.optim.SGD(model.parameters(), lr=0.1))
    pop.compile(*tgn_data(3, 4))
    for buffer, value in zip(model.buffers(), before):
        assert not buffer.requires_grad
        torch.testing.assert_close(buffer, value)


def test_reassigning_with_another_shape_is_a_clear_error_before_anything_changes():
    class Growing(Reassigning):
        def forward(self, x, target):
            self.ema = torch.cat([self.ema, x.mean(0)])
            out = self.out(torch.tanh(self.fc(x)))
            return out, F.mse_loss(out, target)

    model = Growing()
    weights = copy.deepcopy(model.state_dict())
    pop = poptorch.trainingModel(model, options(1, 1), torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(poptorch.Error, match=r"Buffer ema is reassigned .* shape \[8\] .* it was \[4\]"):
        pop(*dense_data(2))
    assert model.ema.shape == (4,)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, weights[name], msg=name)


def test_a_failed_call_leaves_the_buffers_as_before_without_history():
    class Failing(TGNLike):
        calls = 0

        def forward(self, *args):
            Failing.calls += 1
            if Failing.calls == 4:  # (the compile trace is call 1)
                raise RuntimeError("boom")
            return super().forward(*args)

    model = Failing()
    pop = poptorch.trainingModel(model, options(4, 1), torch.optim.SGD(model.parameters(), lr=0.1))
    data = tgn_data(3, 4)
    with pytest.raises(RuntimeError, match="boom"):
        pop(*data)
    assert all(not b.requires_grad for b in model.buffers())
    assert model.memory.memory.abs().sum() == 0
    pop(*data)  # runs on: nothing of the failed call is left in the graph


def test_a_failed_call_rolls_back_a_buffer_the_host_assigned_since_the_last_call():
    class WritesThenFails(TGNLike):
        fail = False

        def forward(self, *args):
            out = super().forward(*args)  # writes the memory
            if self.fail:
                raise RuntimeError("boom")
            return out

    model = WritesThenFails()
    pop = poptorch.trainingModel(model, options(4, 1), torch.optim.SGD(model.parameters(), lr=0.1))
    pop(*tgn_data(3, 4))
    model.memory.memory = torch.full((NODES, DIM), 2.0)  # (TGN's memory does so entering eval())
    model.fail = True
    with pytest.raises(RuntimeError, match="boom"):
        pop(*tgn_data(3, 4, seed=1))
    assert torch.equal(model.memory.memory, torch.full((NODES, DIM), 2.0))
    assert not model.memory.memory.requires_grad


# --------------------------------------------------------------------------- pipelined
@pytest.mark.parametrize("recompute", [True, False])
@pytest.mark.parametrize("concurrency", ["on", "off"])
def test_pipelined_blocks_train_as_the_oracle(monkeypatch, recompute, concurrency):
    monkeypatch.setenv("OPENPOP_CONCURRENT_STAGES", concurrency)
    di, ga, rows = 2, 4, 3
    opts = options(di, ga)
    opts.setExecutionStrategy(poptorch.PipelinedExecution())
    if not recompute:
        opts._Popart.set("autoRecomputation", 0)
    pop = train_against_oracle(lambda: TGNLike(blocks=True), lambda call: tgn_data(rows, di * ga, seed=call),
                               di, ga, opts=opts)
    assert pop._executable.layout.recompute == recompute
    assert not pop._executable.concurrent  # a micro-batch's backward ends before the next reads the memory


def test_recomputation_updates_running_statistics_once_per_micro_batch():
    class Staged(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
            self.bn = torch.nn.BatchNorm1d(4)
            self.out = torch.nn.Linear(4, 4)
            poptorch.BeginBlock(self.fc, ipu_id=0)
            poptorch.BeginBlock(self.bn, ipu_id=1)
            poptorch.BeginBlock(self.out, ipu_id=1)

        def forward(self, x):
            out = self.out(self.bn(self.fc(x)))
            return out, poptorch.identity_loss(out.pow(2), reduction="mean")

    model = Staged()
    reference = copy.deepcopy(model)
    opts = options(1, 4)
    opts.setExecutionStrategy(poptorch.PipelinedExecution())
    x = torch.randn(16, 4)
    pop = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    pop(x)
    assert pop._executable.layout.recompute
    oracle(reference, torch.optim.SGD(reference.parameters(), lr=0.1), (x,), 1, 4)
    assert int(model.bn.num_batches_tracked) == 4
    assert_same_state(model, reference)


# --------------------------------------------------------------------------- replicas
def test_replicas_keep_their_own_memory_and_the_host_sees_replica_zeros():
    di, ga, r, rows = 2, 2, 2, 3
    opts = options(di, ga, r).broadcastBuffers(False)
    pop = train_against_oracle(TGNLike, lambda call: tgn_data(rows, di * ga * r, seed=call), di, ga, r, opts=opts)
    assert pop._executable.replica_buffers.per_replica


def test_replicas_apart_keep_their_own_memory(monkeypatch):
    monkeypatch.setattr(DeviceMap, "replicas_share_devices", lambda self: False)
    monkeypatch.setenv("OPENPOP_CONCURRENT_STAGES", "on")
    di, ga, r, rows = 2, 2, 2, 3
    opts = options(di, ga, r).broadcastBuffers(False)
    pop = train_against_oracle(TGNLike, lambda call: tgn_data(rows, di * ga * r, seed=call), di, ga, r, opts=opts)
    assert pop._session.replicas.own_weights and not pop._executable.concurrent


def test_replicated_memory_needs_broadcast_buffers_off_as_on_poptorch():
    model = TGNLike()
    pop = poptorch.trainingModel(model, options(1, 1, 2), torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(poptorch.Error, match="broadcastBuffers"):
        pop(*tgn_data(3, 2))


# --------------------------------------------------------------------------- inference sharing the weights
def test_inference_model_sharing_the_weights_carries_its_own_memory():
    """TGN's validation: an inference model of the trained model writes its own (device) memory
    call after call; the host's memory is the training model's; after more training the
    inference model starts again from the host's weights and buffers."""
    di, ga, rows = 4, 2, 3
    torch.manual_seed(1)
    model = TGNLike()
    reference = copy.deepcopy(model)
    training = poptorch.trainingModel(model, options(di, ga), torch.optim.SGD(model.parameters(), lr=0.1))
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    inference = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(2))
    for call in range(2):
        data = tgn_data(rows, di * ga, seed=call)
        training.train()  # (as TGN's loops: the model in the mode its executor is about to compile)
        training(*data)
        oracle(reference, optimizer, data, di, ga)
        host_memory = model.memory.memory.clone()
        evaluated = copy.deepcopy(reference).eval()  # the inference model's device copy
        inference.eval()
        for seed in (10, 11):
            probe = tgn_data(rows, 2, seed=seed)
            with torch.no_grad():
                expected = torch.cat([evaluated(*[t[i * rows:(i + 1) * rows] for t in probe]) for i in range(2)])
            torch.testing.assert_close(inference(*probe), expected, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(model.memory.memory, host_memory)  # the host's memory is not the device copy's
    assert_same_state(model, reference)


def test_inference_model_with_a_reassigned_buffer_carries_it():
    model = Reassigning().eval()
    reference = copy.deepcopy(model)
    inference = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(2))
    for seed in range(2):
        x, t = dense_data(4, seed=seed)
        with torch.no_grad():
            expected = torch.cat([reference(x[:2], t[:2])[0], reference(x[2:], t[2:])[0]])
        torch.testing.assert_close(inference(x, t)[0], expected)
    assert model.ema.abs().sum() == 0  # the host's buffer: inference writes its own copy


def test_host_reassigning_a_buffer_between_calls_is_seen_and_kept():
    """TGN's memory swaps its buffers for new tensors when it enters ``eval()``: the training
    model trains on the new ones, the inference model uploads them and leaves them in place."""
    di, ga, rows = 2, 1, 3
    model = TGNLike()
    reference = copy.deepcopy(model)
    training = poptorch.trainingModel(model, options(di, ga), torch.optim.SGD(model.parameters(), lr=0.1))
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    inference = poptorch.inferenceModel(model, poptorch.Options())
    probe = tgn_data(rows, 1, seed=5)
    inference.eval()
    inference(*probe)  # compiled with the first tensors
    for call in range(2):
        data = tgn_data(rows, di * ga, seed=call)
        training.train()
        training(*data)
        oracle(reference, optimizer, data, di, ga)
        replacement = model.memory.memory.detach() + 1.0
        model.memory.memory = replacement
        reference.memory.memory = reference.memory.memory.detach() + 1.0
        inference.copyWeightsToDevice()
        with torch.no_grad():
            expected = copy.deepcopy(reference).eval()(*probe)
        torch.testing.assert_close(inference(*probe), expected, rtol=1e-5, atol=1e-6)
        assert model.memory.memory is replacement
    assert_same_state(model, reference)


# --------------------------------------------------------------------------- compiled backend
@pytest.mark.slow
@pytest.mark.parametrize("make, data", [
    (TGNLike, lambda call: tgn_data(3, 8, seed=call)),
    (WrittenThenRead, lambda call: dense_data(16, seed=call)),
    (Reassigning, lambda call: dense_data(16, seed=call)),
])
def test_compiled_program_carries_buffers_as_the_oracle(one_thread, make, data):
    pop = train_against_oracle(make, data, 4, 2, backend="compiled", unit="program")
    assert pop._dispatch.compiled.last == "compiled"


class Wrapped(torch.nn.Module):
    """``inner`` as a child: the compiled unit 'regions' compiles its forward."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *args):
        return self.inner(*args)


@pytest.mark.slow
@pytest.mark.parametrize("make, data", [
    (TGNLike, lambda call: tgn_data(3, 8, seed=call)),
    (lambda: Wrapped(WrittenThenRead()), lambda call: dense_data(16, seed=call)),
    (lambda: Wrapped(Reassigning()), lambda call: dense_data(16, seed=call)),
])
def test_compiled_regions_train_as_the_oracle(one_thread, make, data):
    """The regions (TGN's memory module among them) write their buffers inside compiled code."""
    pop = train_against_oracle(make, data, 4, 2, backend="compiled", unit="regions")
    assert pop._dispatch.compiled.last == "compiled" and pop._dispatch.compiled.regions.regions


# --------------------------------------------------------------------------- tensors assigned in forward
MODULE_SETATTR = torch.nn.Module.__setattr__  # (openpop patches it while passes run: put back after)

class MaskedBlock(torch.nn.Module):
    """CLIP's attention block's pattern: a plain tensor attribute (not a buffer) reassigned in
    forward to the same tensor (``.to(device)``, ``.type(dtype)``)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(DIM, DIM)
        self.mask = torch.triu(torch.full((DIM, DIM), -0.5), 1)

    def forward(self, x):
        self.mask = self.mask.to(x.device)
        self.mask = self.mask.type(x.dtype)
        return torch.tanh(self.fc(x)) @ (self.mask + torch.eye(DIM))


class Masked(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = MaskedBlock()
        self.out = torch.nn.Linear(DIM, DIM)

    def forward(self, x, target):
        out = self.out(self.block(x))
        return out, F.mse_loss(out, target)


class TableBlock(torch.nn.Module):
    """Swin's pattern: a parameter reassigned in forward to itself (``.to(device=...)``)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(DIM, DIM)
        self.table = torch.nn.Parameter(torch.randn(DIM) * 0.1)

    def forward(self, x):
        self.table = self.table.to(device=x.device)
        return torch.tanh(self.fc(x)) + self.table


class Tabled(Masked):
    def __init__(self):
        super().__init__()
        self.block = TableBlock()


class Caching(Masked):
    """Stores a new tensor in a plain attribute each forward: the program cannot carry it."""

    def __init__(self):
        super().__init__()
        self.block.last = torch.zeros(DIM)

    def forward(self, x, target):
        self.block.last = x.detach().mean(0)
        return super().forward(x, target)


@pytest.mark.slow
@pytest.mark.parametrize("make", [Masked, Tabled, lambda: Wrapped(Reassigning())],
                         ids=["attribute", "parameter", "nested-buffer"])
@pytest.mark.parametrize("di, ga", [(1, 1), (4, 2)])
def test_compiled_program_takes_tensors_a_submodule_assigns_in_forward(one_thread, make, di, ga):
    """A submodule's forward assigning a tensor to its attribute or buffer: Dynamo refused it in
    the program's loops ("HOP: Unsafe side effect") and, at one micro-batch, let the traced value
    escape ("Cannot access storage of TensorWrapper")."""
    made = []

    def make_and_keep():
        model = make()
        block = getattr(model, "block", None)
        made.append((model, getattr(block, "mask", getattr(block, "table", None))))
        return model

    pop = train_against_oracle(make_and_keep, lambda call: dense_data(4 * di * ga, seed=call), di, ga,
                               backend="compiled", unit="program")
    assert pop._dispatch.compiled.last == "compiled"
    model, mask = made[0]
    if isinstance(model, Masked):  # the slot holds the tensor it held before, as in eager
        assert getattr(model.block, "table", getattr(model.block, "mask", None)) is mask
    assert torch.nn.Module.__setattr__ is MODULE_SETATTR


class SharedMasked(torch.nn.Module):
    """One masked block at two places of the tree, run twice."""

    def __init__(self):
        super().__init__()
        self.first = MaskedBlock()
        self.second = self.first
        self.out = torch.nn.Linear(DIM, DIM)

    def forward(self, x, target):
        out = self.out(self.second(self.first(x)))
        return out, F.mse_loss(out, target)


class HookMasked(Masked):
    """The assignment in a forward-pre hook (traced with the forward)."""

    def __init__(self):
        super().__init__()
        self.block.register_forward_pre_hook(_move_mask)


def _move_mask(module, args):
    module.mask = module.mask.to(args[0].device)


@pytest.mark.slow
@pytest.mark.parametrize("make", [SharedMasked, HookMasked])
def test_compiled_program_takes_assignments_in_shared_modules_and_hooks(one_thread, make):
    pop = train_against_oracle(make, lambda call: dense_data(8, seed=call), 2, 2, backend="compiled", unit="program")
    assert pop._dispatch.compiled.last == "compiled"
    assert torch.nn.Module.__setattr__ is MODULE_SETATTR


class EmaBlock(torch.nn.Module):
    """A buffer the forward reassigns (``self.ema = ...``) or, ``in_place``, updates in place."""

    def __init__(self, in_place):
        super().__init__()
        self.fc = torch.nn.Linear(DIM, DIM)
        self.in_place = in_place
        self.register_buffer("ema", torch.zeros(DIM))

    def forward(self, x):
        h = torch.tanh(self.fc(x))
        if self.in_place:
            self.ema.mul_(0.5).add_(0.5 * h.detach().mean(0))
        else:
            self.ema = 0.5 * self.ema + 0.5 * h.detach().mean(0)
        return h + self.ema


class SharedEma(torch.nn.Module):
    """One ``EmaBlock`` under two names, run twice; ``tied``: the output layer's weight is the
    input layer's too (a tensor at two slots, as BERT's tied embeddings)."""

    def __init__(self, in_place=False, tied=False):
        super().__init__()
        self.first = EmaBlock(in_place)
        self.second = self.first
        self.out = torch.nn.Linear(DIM, DIM)
        if tied:
            self.out.weight = self.first.fc.weight

    def forward(self, x, target):
        out = self.out(self.second(self.first(x)))
        return out, F.mse_loss(out, target)


@pytest.mark.parametrize("make", [SharedEma, lambda: SharedEma(in_place=True), lambda: SharedEma(tied=True)],
                         ids=["reassigned", "in-place", "tied-weights"])
@pytest.mark.parametrize("di, ga", [(1, 1), (2, 2)])
def test_compiled_program_updates_buffers_of_a_module_under_two_names(one_thread, make, di, ga):
    """``functional_call`` set the shared slot twice and left the traced forward's input in it:
    at one micro-batch the program failed ("Cannot access storage of TensorWrapper")."""
    made = []

    def make_and_keep():
        made.append(make())
        return made[-1]

    pop = train_against_oracle(make_and_keep, lambda call: dense_data(4 * di * ga, seed=call), di, ga,
                               backend="compiled", unit="program")
    assert pop._dispatch.compiled.last == "compiled"
    assert all(type(b) is torch.Tensor and not b.requires_grad for b in made[0].buffers())


def test_a_plain_attribute_replaced_in_forward_is_refused_before_anything_changes(one_thread):
    torch.manual_seed(0)
    model = Caching()
    before = model.block.last
    weights = copy.deepcopy(model.state_dict())
    pop = poptorch.trainingModel(model, options(2, 1, backend="compiled", unit="program"),
                                 torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(poptorch.Error, match=r"attribute block\.last, a tensor the forward pass replaces .*"
                                             r"register_buffer\(\.\.\., persistent=False\)"):
        pop(*dense_data(8))
    assert model.block.last is before
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, weights[name], msg=name)
    assert torch.nn.Module.__setattr__ is MODULE_SETATTR

    torch.manual_seed(0)
    auto_model, reference = Caching(), Caching()
    reference.load_state_dict(auto_model.state_dict())
    auto = poptorch.trainingModel(auto_model, options(2, 1, backend="auto"),
                                  torch.optim.SGD(auto_model.parameters(), lr=0.1))
    inputs = dense_data(8)
    _, losses = auto(*inputs)
    assert auto._dispatch.compiled.last != "compiled"
    expected = oracle(reference, torch.optim.SGD(reference.parameters(), lr=0.1), inputs, 2, 1)
    torch.testing.assert_close(losses.reshape(-1), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(auto_model.block.last, reference.block.last)


def test_a_parameter_replaced_in_forward_is_refused_and_put_back(one_thread):
    """PopTorch's error, from the compile pass, which puts the parameter back first."""
    class Replacing(Tabled):
        def forward(self, x, target):
            self.block.table = torch.nn.Parameter(self.block.table.detach() * 1.0)
            return super().forward(x, target)

    torch.manual_seed(0)
    model = Replacing()
    table = model.block.table
    pop = poptorch.trainingModel(model, options(2, 1, backend="compiled", unit="program"),
                                 torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(poptorch.Error, match=r"Parameter block\.table is reassigned within the model"):
        pop(*dense_data(8))
    assert model.block.table is table and model.block._parameters["table"] is table
    assert torch.nn.Module.__setattr__ is MODULE_SETATTR


class DecayingBlock(MaskedBlock):
    """Reassigns its mask to itself, and to a new tensor once ``decay`` is set."""

    decay = False

    def forward(self, x):
        self.mask = self.mask.to(x.device)
        if self.decay:
            self.mask = self.mask * 0.5
        return super().forward(x)


class Decaying(Masked):
    def __init__(self):
        super().__init__()
        self.block = DecayingBlock()


@pytest.mark.parametrize("cached", [False, True], ids=["traced", "saved-program"])
def test_a_program_with_assigned_slots_refuses_to_retrace(one_thread, cached, tmp_path):
    """Only the probe saw that the assigned tensor was the slot's own: a retrace (a Python value the
    forward reads changed) could store another, which the program would silently undo. With the
    executable cache the saved program's checks fail instead of Dynamo's guards."""
    torch.manual_seed(0)
    model = Decaying()
    opts = options(2, 1, backend="compiled", unit="program")
    if cached:
        opts.enableExecutableCaching(str(tmp_path))
    pop = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    pop(*dense_data(8))
    assert pop._dispatch.compiled.last == "compiled"
    model.block.decay = True
    weights = copy.deepcopy(model.state_dict())
    with pytest.raises(poptorch.Error, match="re-traced the program until its recompile limit"):
        pop(*dense_data(8, seed=1))
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, weights[name], msg=name)
    assert torch.nn.Module.__setattr__ is MODULE_SETATTR


def test_overlapping_recordings_and_scopes_put_setattr_back():
    """As two threads entering and leaving in turn do: A in, B in, A out, B out."""
    from openpop.runtime import assigned_slots
    model = Masked()
    first, second = assigned_slots.scoped({id(model.block): {"mask"}}), assigned_slots.recording(
        assigned_slots.Recorded(model))
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert torch.nn.Module.__setattr__ is not MODULE_SETATTR  # the recording is still inside
    second.__exit__(None, None, None)
    assert torch.nn.Module.__setattr__ is MODULE_SETATTR
