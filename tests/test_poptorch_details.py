"""PopTorch details: "No active Block", updatable buffers checked at compile, Async loading of a
shuffled Subset, annotated models that pickle and print, the legacy BeginBlock(function) form,
and removeBlocks."""
import copy
import io
import re

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import Subset

import poptorch
from openpop.enums import SharingStrategy

from helpers.data_loading import indexed_dataset
from helpers.oracle import train_loop

NO_ACTIVE_BLOCK = "No active Block, all the ops must belong to a Block"


def auto_increment(di=2, ga=1):
    opts = poptorch.Options().deviceIterations(di)
    opts.Training.gradientAccumulation(ga)
    return opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))


# --- "No active Block" ------------------------------------------------------------------

def test_an_op_after_the_last_block_is_refused_at_compile():
    """PopTorch's own test (pipelining_test.py, test_missing_block)."""

    class Model(torch.nn.Module):
        def forward(self, x):
            poptorch.Block.useAutoId()
            with poptorch.Block(ipu_id=0):
                x = x * 4
            x = x * 4
            return x

    model = poptorch.inferenceModel(Model(), auto_increment())
    with pytest.raises(poptorch.Error, match=re.escape(NO_ACTIVE_BLOCK)):
        model.compile(torch.randn(2, 5))
    assert not model.isCompiled()


class TwoBlocks(torch.nn.Module):
    def __init__(self, loss_in_block):
        super().__init__()
        self.a = torch.nn.Linear(3, 3)
        self.b = torch.nn.Linear(3, 3)
        self.loss_in_block = loss_in_block

    def forward(self, x, y):
        x = x * 2  # before the first block: stage 0
        with poptorch.Block("first", ipu_id=0):
            x = self.a(x)
        with poptorch.Block("second", ipu_id=1):
            x = torch.tanh(self.b(x))
            if self.loss_in_block:
                return x, F.mse_loss(x, y)
        return x, F.mse_loss(x, y)


def test_a_loss_outside_the_last_block_is_refused_before_any_step():
    model = TwoBlocks(loss_in_block=False)
    before = copy.deepcopy(model.state_dict())
    training = poptorch.trainingModel(model, auto_increment(di=1, ga=4), torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(poptorch.Error, match=re.escape(NO_ACTIVE_BLOCK)):
        training(torch.randn(4, 3), torch.randn(4, 3))
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name])


def test_every_op_in_a_block_trains_like_plain_pytorch():
    """As Graphcore's pipelining tutorial writes it: the loss inside the last block."""
    torch.manual_seed(0)
    model = TwoBlocks(loss_in_block=True)
    reference = copy.deepcopy(model)
    x, y = torch.randn(8, 3), torch.randn(8, 3)
    training = poptorch.trainingModel(model, auto_increment(di=2, ga=4), torch.optim.SGD(model.parameters(), lr=0.1))
    training(x, y)
    assert [b.user_id for b in training._executable.plan.blocks] == ["first", "second"]
    train_loop(reference, torch.optim.SGD(reference.parameters(), lr=0.1), [x, y], lambda m, a, b: m(a, b)[1],
               di=2, ga=4, r=1)
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got, want)


class Encoder(torch.nn.Module):
    """A container whose first layer starts a block (as DINO's ViT with a BeginBlock patch_embed)."""

    def __init__(self):
        super().__init__()
        self.embed = poptorch.BeginBlock(torch.nn.Linear(3, 3), "encoder", ipu_id=1)
        self.head = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.head(torch.relu(self.embed(x)))


def test_a_module_entered_between_blocks_runs_when_its_own_block_starts_first():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(3))
            self.encoder = Encoder()

        def forward(self, x):
            with poptorch.Block("prologue", ipu_id=0):
                x = x * self.scale
            return self.encoder(x)  # entered with no block active; its first op is in "encoder"

    model = Model()
    x = torch.randn(4, 3)
    inference = poptorch.inferenceModel(model, auto_increment(di=2))
    torch.testing.assert_close(inference(x), model(x))
    blocks = {b.user_id: b.modules for b in inference._executable.plan.blocks}
    assert blocks["encoder"] == ["encoder", "encoder.embed", "encoder.head"]


# --- updatableNamedBuffers --------------------------------------------------------------

class WithBuffers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("offset", torch.zeros(3))
        self.fc = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.fc(x) + self.offset


class WithBuffersAndLoss(WithBuffers):
    def forward(self, x):
        out = super().forward(x)
        return out, poptorch.identity_loss(out.pow(2), reduction="mean")


@pytest.mark.parametrize("training", [False, True])
def test_updatable_named_buffers_naming_a_missing_buffer_fail_at_compile(training):
    opts = poptorch.Options().updatableNamedBuffers(["offset", "fc.scale"])
    if training:
        model = WithBuffersAndLoss()
        pop = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    else:
        model = WithBuffers()
        pop = poptorch.inferenceModel(model, opts)
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(poptorch.Error, match=re.escape("names buffers the model does not have: fc.scale "
                                                       "(its buffers: offset)")):
        pop(torch.randn(2, 3))
    assert not pop.isCompiled()
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name])


def test_updatable_named_buffers_that_exist_compile_and_update():
    model = WithBuffers()
    pop = poptorch.inferenceModel(model, poptorch.Options().updatableNamedBuffers(["offset"]))
    x = torch.randn(2, 3)
    pop(x)
    model.offset.fill_(5.0)
    pop.copyNamedBuffersToDevice()
    torch.testing.assert_close(pop(x), model.fc(x) + 5.0)


# --- Async loading of a shuffled Subset -------------------------------------------------

def batches(loader):
    return [[t.clone() for t in batch] for batch in loader]


@pytest.mark.parametrize("strategy", [SharingStrategy.ForkServer, SharingStrategy.SharedMemory],
                         ids=["forkserver", "shared_memory"])
def test_async_loader_over_a_shuffled_subset_with_a_generator(strategy):
    subset = Subset(indexed_dataset(40), list(range(5, 35)))
    opts = poptorch.Options()
    sync = poptorch.DataLoader(opts, subset, batch_size=3, shuffle=True,
                               generator=torch.Generator().manual_seed(7))
    loader = poptorch.DataLoader(opts, subset, batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(7),
                                 mode=poptorch.DataLoaderMode.Async, async_options={"sharing_strategy": strategy})
    try:
        first, expected = batches(loader), batches(sync)
        assert len(first) == len(expected) == 10
        for got, want in zip(first, expected):
            assert all(torch.equal(a, b) for a, b in zip(got, want))
        assert sorted(int(i) for batch in first for i in batch[1]) == list(range(5, 35))
        assert [int(i) for b in batches(loader) for i in b[1]] == [int(i) for b in batches(sync) for i in b[1]]
    finally:
        loader.terminate()


# --- annotated models pickle, copy and print ------------------------------------------

def add_one(x):
    return x + 1.0


class Annotated(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(3, 3)
        self.b = poptorch.BeginBlock(torch.nn.Linear(3, 3), "b", ipu_id=1)
        self.shift = poptorch.BeginBlock(add_one, "shift", ipu_id=1)  # the legacy form

    @poptorch.BlockFunction("tail", ipu_id=1)
    def tail(self, x):
        return torch.tanh(x)

    def forward(self, x):
        return self.tail(self.shift(self.b(torch.relu(self.a(x)))))


def saved_and_loaded(model):
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


@pytest.mark.parametrize("duplicate", [saved_and_loaded, copy.deepcopy], ids=["torch_save", "deepcopy"])
def test_an_annotated_model_pickles_and_compiles_the_same(duplicate):
    model = Annotated()
    twin = duplicate(model)
    x = torch.randn(4, 3)
    torch.testing.assert_close(twin(x), model(x))
    plans = []
    for m in (model, twin):
        pop = poptorch.inferenceModel(m, poptorch.Options().deviceIterations(2))
        torch.testing.assert_close(pop(x), model(x))
        plans.append([(b.user_id, b.ipu, b.modules) for b in pop._executable.plan.blocks])
        pop.destroy()
    assert plans[0] == plans[1]
    assert [uid for uid, _, _ in plans[0]] == ["__before_first_block__", "b", "shift", "tail"]


def test_an_annotated_model_prints_its_modules_and_blocks(capsys):
    model = saved_and_loaded(Annotated())
    text = poptorch.module_repr(model)
    assert text == ("Annotated(\n"
                    "  (a): Linear(in_features=3, out_features=3, bias=True)\n"
                    "  (b): BeginBlock(user_id=b, ipu_id=1) Linear(in_features=3, out_features=3, bias=True)\n"
                    "  (shift): BeginBlock(user_id=shift, ipu_id=1) LegacyBeginBlockFn(add_one)\n"
                    ")")
    print(model)
    assert "(shift): LegacyBeginBlockFn(add_one)" in capsys.readouterr().out
    assert repr(poptorch.inferenceModel(model)) == text


# --- the legacy BeginBlock(function) form ---------------------------------------------

def test_legacy_begin_block_of_a_function():
    """PopTorch's test_begin_block_with_function: attributes, and torch.save."""
    block = poptorch.BeginBlock(add_one, 1, 2)
    assert block._user_id == 1 and block._ipu_id == 2
    torch.save(block, io.BytesIO())
    assert block(torch.zeros(2)).tolist() == [1.0, 1.0]


def test_legacy_begin_block_with_a_numeric_id_runs_in_a_pipeline():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(3, 3)
            self.shift = poptorch.BeginBlock(add_one, 1, 1)
            self.b = torch.nn.Linear(3, 3)

        def forward(self, x):
            return self.b(self.shift(self.a(x)))

    model = Model()
    x = torch.randn(4, 3)
    pop = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(2))
    torch.testing.assert_close(pop(x), model(x))
    plan = pop._executable.plan
    assert [(b.user_id, b.ipu) for b in plan.blocks] == [("__before_first_block__", 0), ("1", 1)]
    assert plan.pipeline_stages == 2


# --- removeBlocks -----------------------------------------------------------------------

def test_remove_blocks_leaves_a_single_stage():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 3),
                                poptorch.BeginBlock(add_one, "shift", ipu_id=3))
    poptorch.BeginBlock(model[0], "first", ipu_id=0)
    poptorch.BeginBlock(model[2], "second", ipu_id=1)
    reference = copy.deepcopy(model)
    poptorch.removeBlocks(model)
    poptorch.removeBlocks(model)  # nothing left to remove: no error
    assert "BeginBlock(" not in poptorch.module_repr(model)
    x = torch.randn(4, 3)
    pop = poptorch.inferenceModel(model, auto_increment(di=1))  # one stage: no device iterations needed
    torch.testing.assert_close(pop(x), reference(x))
    plan = pop._executable.plan
    assert [b.user_id for b in plan.blocks] == ["__before_first_block__"]
    assert plan.pipeline_stages == 1 and plan.ipus_per_replica == 1 and not plan.pipelined

    annotated = poptorch.inferenceModel(reference, auto_increment(di=1))
    with pytest.raises(poptorch.Error, match="deviceIterations must be greater than or equal to the number of "
                                             "pipeline stages"):
        annotated(x)  # (the blocks were there: three stages)
