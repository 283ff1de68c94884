"""PopTorch's error texts stay as PopTorch words them, followed by one line "openpop: <what to
do>" where PopTorch's text names no fix."""
import pytest
import torch

import poptorch
from openpop import errors


class ReturnsLogits(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.linear(x)  # no loss


def test_a_training_model_without_a_loss_says_how_to_return_one():
    model = ReturnsLogits()
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(poptorch.Error) as info:
        training(torch.randn(2, 4))
    text = str(info.value)
    assert "Couldn't find a loss in graph!\nopenpop: a trainingModel's forward must return its loss" in text
    assert "poptorch.identity_loss(value, reduction='mean')" in text


def test_a_batch_that_does_not_divide_says_which_sizes_would():
    options = poptorch.Options().deviceIterations(3)
    inference = poptorch.inferenceModel(torch.nn.Linear(4, 2), options)
    with pytest.raises(AssertionError) as info:
        inference(torch.randn(7, 4))
    text = str(info.value)
    assert text.startswith("Invalid batch dimension: In the input ")
    assert text.endswith("\nopenpop: give input a batch of a multiple of 3 samples (for example 6), or let "
                         "poptorch.DataLoader(options, dataset, batch_size=<micro-batch>) build such batches; "
                         "batching is explained in docs/guides/poptorch.md#batching")


def test_the_batching_link_of_the_fix_line_has_its_page_and_anchor():
    """The link names a page of the docs and a heading on it (MkDocs' anchor: the heading, lower-cased)."""
    from pathlib import Path
    page, anchor = errors.BATCHING_DOCS.split("#")
    path = Path(__file__).resolve().parents[1] / page
    headings = [line.lstrip("#").strip().lower().replace(" ", "-") for line in path.read_text().splitlines()
                if line.startswith("#")]
    assert anchor in headings


def test_an_op_between_blocks_is_named():
    from openpop.runtime.plan import BlockRecorder, OpsOutsideBlocks

    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    recorder = BlockRecorder(model)
    recorder.begin_block("first", 0)
    x = model(torch.zeros(1, 2))
    recorder.end_block()
    with OpsOutsideBlocks(recorder), pytest.raises(poptorch.Error) as info:
        x * 2
    recorder.close()
    assert str(info.value).startswith(errors.NO_ACTIVE_BLOCK + "\nopenpop: aten.mul ran after a `with poptorch.Block")


def test_a_wrong_execution_strategy_lists_the_right_ones():
    with pytest.raises(AssertionError, match=r"strategy must be a _IExecutionStrategy, got str 'pipelined'\n"
                                             r"openpop: use poptorch\.PipelinedExecution, ShardedExecution"):
        poptorch.Options().setExecutionStrategy("pipelined")
