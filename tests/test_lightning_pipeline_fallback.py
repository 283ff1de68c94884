"""The pipeline-depth error is typed (``errors.PipelineDepthError`` carries the forward stage
count), and ``IPUStrategy`` decides its ``ShardedExecution`` fallback from that type, not from
the message text. Numerics against a plain-PyTorch loop."""
import copy

import pytest

pytest.importorskip("lightning.pytorch")  # a skip, not an ImportError, from openpop.lightning below

import torch
from torch.utils.data import DataLoader, TensorDataset

import poptorch
from openpop import errors
from openpop.lightning import IPUStrategy
from openpop.lightning.stage_runner import StageRunner

from helpers.lightning_models import QUIET, pl

pytestmark = pytest.mark.usefixtures("one_thread")


def four_stage_net():
    torch.manual_seed(1)
    return torch.nn.Sequential(poptorch.BeginBlock(torch.nn.Linear(4, 6), ipu_id=0), torch.nn.Tanh(),
                               poptorch.BeginBlock(torch.nn.Linear(6, 6), ipu_id=1), torch.nn.Tanh(),
                               poptorch.BeginBlock(torch.nn.Linear(6, 6), ipu_id=2),
                               poptorch.BeginBlock(torch.nn.Linear(6, 1), ipu_id=3))


class Losses(torch.nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x, y):
        out = self.net(x)
        return out, torch.nn.functional.mse_loss(out, y)


class Regressor(pl.LightningModule):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def data(n=16):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=generator)
    return x, torch.sin(x.sum(1, keepdim=True))


def loader(x, y):
    return DataLoader(TensorDataset(x, y), batch_size=2)


# ---------------------------------------------------------------------- the typed error
def test_training_too_few_micro_batches_raises_pipeline_depth_error_with_the_stage_count():
    x, y = data(4)
    options = poptorch.Options()
    options.Training.gradientAccumulation(2)
    net = Losses(four_stage_net())
    model = poptorch.trainingModel(net, options, torch.optim.SGD(net.parameters(), lr=0.1))
    with pytest.raises(errors.PipelineDepthError) as info:
        model(x, y)
    assert isinstance(info.value, poptorch.Error) and info.value.stages == 4
    assert str(info.value) == (
        "'poptorch_py_error': poptorch.Options().Training.gradientAccumulation must be greater than or equal to "
        "the number of pipeline stages (7) when using poptorch.PipelinedExecution. Please note that a model with "
        "4 pipeline stages in PopTorch will have an additional 3 stages when training.")


def test_inference_too_few_device_iterations_raises_pipeline_depth_error_with_the_stage_count():
    model = poptorch.inferenceModel(four_stage_net(), poptorch.Options().deviceIterations(3))
    with pytest.raises(errors.PipelineDepthError) as info:
        model(torch.randn(3, 4))
    assert info.value.stages == 4
    assert str(info.value) == ("'poptorch_py_error': poptorch.Options().deviceIterations must be greater than or "
                               "equal to the number of pipeline stages (4) when using PopTorch.PipelinedExecution.")


# ---------------------------------------------------------------------- the strategy's fallback
def test_training_falls_back_to_sharded_and_matches_plain_pytorch():
    x, y = data()
    net = four_stage_net()
    oracle = copy.deepcopy(net)
    with pytest.warns(UserWarning, match=r"split into 4 pipeline stages .* accumulate_grad_batches is 2\. "
                                         r".*accumulate_grad_batches=7"):
        trainer = pl.Trainer(accelerator="ipu", devices=1, max_epochs=1, accumulate_grad_batches=2, **QUIET)
        trainer.fit(Regressor(net), loader(x, y))
    assert type(trainer.strategy.training_opts._execution_strategy).__name__ == "ShardedExecution"

    optimizer = torch.optim.SGD(oracle.parameters(), lr=0.1)
    for step in range(4):  # 8 micro-batches of 2 rows, 2 per optimizer step
        optimizer.zero_grad()
        for micro in range(2):
            rows = slice((2 * step + micro) * 2, (2 * step + micro + 1) * 2)
            (torch.nn.functional.mse_loss(oracle(x[rows]), y[rows]) / 2).backward()
        optimizer.step()
    for ours, theirs in zip(net.parameters(), oracle.parameters()):
        torch.testing.assert_close(ours, theirs)


def test_predict_falls_back_to_sharded_and_matches_plain_pytorch():
    x, y = data(12)
    net = four_stage_net()
    with pytest.warns(UserWarning, match=r"device_iterations >= 4 for inference, but it is 3\..*"
                                         r"IPUStrategy\(device_iterations=4\)"):
        trainer = pl.Trainer(accelerator="ipu", devices=1, strategy=IPUStrategy(device_iterations=3), **QUIET)
        predictions = trainer.predict(Regressor(net), loader(x, y))
    with torch.no_grad():
        torch.testing.assert_close(torch.cat(predictions), net(x))


def test_a_chosen_pipelined_execution_raises_the_typed_error():
    x, y = data()
    options = poptorch.Options()
    options.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))
    options.Training.gradientAccumulation(2)
    trainer = pl.Trainer(accelerator="ipu", devices=1, max_epochs=1, strategy=IPUStrategy(training_opts=options),
                         **QUIET)
    with pytest.raises(errors.PipelineDepthError) as info:
        trainer.fit(Regressor(four_stage_net()), loader(x, y))
    assert info.value.stages == 4


def test_the_fallback_reads_the_stage_count_from_the_error_not_its_text(monkeypatch):
    compile_for_real = StageRunner.compile

    def too_shallow_once(runner, batch, positions):
        if type(runner.executor.options._execution_strategy).__name__ == "PipelinedExecution":
            raise errors.PipelineDepthError("a message in other words", stages=3)
        compile_for_real(runner, batch, positions)

    monkeypatch.setattr(StageRunner, "compile", too_shallow_once)
    x, y = data()
    with pytest.warns(UserWarning, match=r"split into 3 pipeline stages .*accumulate_grad_batches=5"):
        trainer = pl.Trainer(accelerator="ipu", devices=1, max_epochs=1, **QUIET)
        trainer.fit(Regressor(torch.nn.Linear(4, 1)), loader(x, y))
    assert type(trainer.strategy.training_opts._execution_strategy).__name__ == "ShardedExecution"
