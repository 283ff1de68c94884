"""openpop.annotations: the user-visible surface of blocks and what they report to a run."""
import copy
import io
import re

import pytest
import torch

from openpop import annotations, printing
from openpop.annotations import BeginBlock, Block, BlockFunction, removeBlocks
from openpop.errors import NO_ACTIVE_BLOCK, Error
from openpop.runtime import context


class Recorder:
    """Stands in for the engine's block recorder: logs what the annotations report."""

    def __init__(self):
        self.events = []

    def begin_block(self, user_id, ipu_id):
        self.events.append(("begin", user_id, ipu_id))

    def end_block(self):
        self.events.append(("end",))


class recording_run:
    """Context: a run whose context carries a ``Recorder``."""

    def __enter__(self):
        self._running = context.running(training=False)
        run = self._running.__enter__()
        run.block_recorder = Recorder()
        return run.block_recorder

    def __exit__(self, *exc):
        return self._running.__exit__(*exc)


def two_layer_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def annotated_model():
    model = two_layer_model()
    BeginBlock(model[0], "embed", ipu_id=0)
    BeginBlock(model[2], "head", ipu_id=1)
    return model


def block_ids(model):
    return [(hook.user_id, hook.ipu_id) for m in model.modules()
            if (hook := annotations.block_annotation(m)) is not None]


# --- BeginBlock -------------------------------------------------------------------

def test_begin_block_returns_the_module_and_leaves_values_unchanged():
    plain, model = two_layer_model(), two_layer_model()
    assert BeginBlock(model[2], "head", 1) is model[2]
    x = torch.randn(5, 4)
    torch.testing.assert_close(model(x), plain(x))


def test_begin_block_errors():
    model = two_layer_model()
    BeginBlock(model[0])
    with pytest.raises(Error, match=re.escape("module has already been assigned to a block.")):
        BeginBlock(model[0], "again")
    with pytest.raises(Error, match=re.escape("module is not an instance of torch.nn.Module or function.")):
        BeginBlock(42)


def test_begin_block_on_a_function_wraps_it_in_a_block_module():
    wrapped = BeginBlock(lambda x: x * 2, "double", 1)
    assert isinstance(wrapped, torch.nn.Module)
    assert wrapped(torch.ones(2)).tolist() == [2.0, 2.0]
    with recording_run() as recorder:
        wrapped(torch.ones(2))
    assert recorder.events == [("begin", "double", 1)]


def test_repr_shows_begin_block_annotations(capsys):
    model = annotated_model()
    text = printing.module_repr(model)
    assert text == ("Sequential(\n"
                    "  (0): BeginBlock(user_id=embed, ipu_id=0) Linear(in_features=4, out_features=3, bias=True)\n"
                    "  (1): ReLU()\n"
                    "  (2): BeginBlock(user_id=head, ipu_id=1) Linear(in_features=3, out_features=2, bias=True)\n"
                    ")")
    assert printing.module_repr(two_layer_model()) == repr(two_layer_model())
    printing.print(model)
    assert capsys.readouterr().out == text + "\n"


@pytest.mark.parametrize("duplicate", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
def test_annotations_survive_copies(duplicate):
    model = annotated_model()
    assert block_ids(duplicate(model)) == [("embed", 0), ("head", 1)]


def test_annotations_survive_torch_save_and_load():
    model = annotated_model()
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert block_ids(loaded) == [("embed", 0), ("head", 1)]
    x = torch.randn(2, 4)
    torch.testing.assert_close(loaded(x), model(x))
    with recording_run() as recorder:
        loaded(x)
    assert recorder.events == [("begin", "embed", 0), ("begin", "head", 1)]


def test_remove_blocks():
    model = annotated_model()
    model[1].register_forward_pre_hook(lambda m, args: None)  # a user hook stays
    removeBlocks(model)
    assert block_ids(model) == []
    assert len(model[1]._forward_pre_hooks) == 1
    BeginBlock(model[0], "again")  # no longer "already assigned"


# --- outside an executor everything is a no-op ------------------------------------

def test_plain_model_runs_unchanged_outside_an_executor():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = annotated_model()

        @BlockFunction("tail", ipu_id=1)
        def tail(self, x):
            return x * 2

        def forward(self, x):
            Block.useAutoId()
            with Block(ipu_id=0):
                x = self.layers(x)
            Block.start("free")
            annotations.assert_active_block()
            return self.tail(x) + 1

    model, plain = Model(), two_layer_model()
    x = torch.randn(3, 4)
    torch.testing.assert_close(model(x), plain(x) * 2 + 1)
    assert annotations.current_block() is None
    annotations.assert_active_block()  # after a Block ended: still fine outside a run


def test_a_run_without_a_recorder_is_also_a_no_op():
    with context.running(training=True):
        with Block("a"):
            pass
        annotations.assert_active_block()
        assert annotations.current_block() is None


# --- what a recording run sees ----------------------------------------------------

def test_recorder_sees_blocks_in_forward_order():
    model = annotated_model()
    with recording_run() as recorder:
        model(torch.randn(1, 4))
        with Block("extra", 2):
            assert annotations.current_block() == ("extra", 2)
        Block.start("tail")
    assert recorder.events == [("begin", "embed", 0), ("begin", "head", 1),
                               ("begin", "extra", 2), ("end",), ("begin", "tail", None)]


def test_auto_ids_count_per_run_and_restart_with_use_auto_id():
    def forward():
        with Block():
            pass
        with Block("named"):
            pass
        with Block(ipu_id=1):
            pass

    with recording_run() as recorder:
        forward()
        Block.useAutoId()
        forward()
    begun = [e[1:] for e in recorder.events if e[0] == "begin"]
    assert begun == [("0", None), ("named", None), ("1", 1)] * 2
    with recording_run() as recorder:  # a new run starts again at "0"
        forward()
    assert recorder.events[0] == ("begin", "0", None)


def test_begin_block_without_user_id_takes_an_auto_id_each_run():
    model = two_layer_model()
    BeginBlock(model[0], ipu_id=0)
    BeginBlock(model[2], ipu_id=1)
    for _ in range(2):
        with recording_run() as recorder:
            model(torch.randn(1, 4))
        assert recorder.events == [("begin", "0", 0), ("begin", "1", 1)]


def test_block_function_decorator():
    @BlockFunction("decoder", ipu_id=3)
    def decoder(x):
        """Doubles."""
        seen.append(annotations.current_block())
        return x * 2

    seen = []

    assert decoder.__doc__ == "Doubles."
    assert decoder(torch.ones(1)).tolist() == [2.0]  # outside a run: no block, no check
    with recording_run() as recorder:
        decoder(torch.ones(1))
    assert recorder.events == [("begin", "decoder", 3), ("end",)]
    assert seen == [None, ("decoder", 3)]


def test_no_active_block_after_a_block_scope_ends():
    with recording_run():
        annotations.assert_active_block()  # before the first block: stage 0, fine
        with Block("a"):
            annotations.assert_active_block()
        assert annotations.current_block() is None
        with pytest.raises(Error, match=re.escape(NO_ACTIVE_BLOCK)):
            annotations.assert_active_block()
        Block.start("b")
        annotations.assert_active_block()


def test_block_is_a_module_and_a_context_manager():
    block = Block("enc", 1)
    assert isinstance(block, torch.nn.Module)
    assert repr(block) == "Block(user_id=enc, ipu_id=1)"
    with block as entered:
        assert entered is block
