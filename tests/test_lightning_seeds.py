"""The seed documents' snippets, as written, with a small LightningModule filled in: Lightning's
IPU guides (basic and advanced) and Graphcore's Lightning tutorial. Each trains (loss decreases).
Plus precision, autoreport and the pytorch_lightning distribution."""
import json
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import poptorch

from helpers.lightning_models import QUIET, pl

pytestmark = pytest.mark.usefixtures("one_thread")

FEATURES, CLASSES = 16, 4


def classification(n=1024, seed=0):
    weights = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(1234))
    x = torch.randn(n, FEATURES, generator=torch.Generator().manual_seed(seed))
    return x, (x @ weights).argmax(1)


class LossHistory(pl.Callback):
    def __init__(self):
        self.losses = []

    def on_train_epoch_end(self, trainer, pl_module):
        self.losses.append(trainer.callback_metrics["train_loss"].item())


class Classifier(pl.LightningModule):
    """The guides' "MyLightningModule": two linear layers, cross entropy, Adam (the MNIST sample)."""

    def __init__(self, hidden=32, batch_size=1, n=1024, sgd=False):
        super().__init__()
        self.sgd = sgd
        self.l1 = torch.nn.Linear(FEATURES, hidden)
        self.l2 = torch.nn.Linear(hidden, CLASSES)
        self.batch_size, self.n = batch_size, n

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        accuracy = torch.sum(torch.eq(torch.argmax(self(x), -1), y).to(torch.float32)) / len(y)
        self.log("val_acc", accuracy)
        return accuracy

    def configure_optimizers(self):
        if self.sgd:  # Adam's eps underflows in float16 ("16-true")
            return torch.optim.SGD(self.parameters(), lr=0.1)
        return torch.optim.Adam(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return DataLoader(TensorDataset(*classification(self.n)), batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(TensorDataset(*classification(256, seed=1)), batch_size=self.batch_size)


def fit(model, trainer_kwargs, epochs=3):
    history = LossHistory()
    settings = dict(QUIET, max_epochs=epochs, callbacks=[history], num_sanity_val_steps=0)
    settings.update(trainer_kwargs)
    trainer = pl.Trainer(**settings)
    trainer.fit(model)
    assert history.losses[-1] < history.losses[0], history.losses
    return trainer


# ---------------------------------------------------------------------- Lightning's basic guide
@pytest.mark.parametrize("devices", [1, 8])
def test_basic_guide(devices):
    # trainer = pl.Trainer(accelerator="ipu", devices=1)  /  pl.Trainer(accelerator="ipu", devices=8)
    trainer = fit(Classifier(batch_size=16), dict(accelerator="ipu", devices=devices))
    assert trainer.num_devices == devices and trainer.callback_metrics["val_acc"] > 0.4


# ---------------------------------------------------------------------- Lightning's advanced guide
def test_advanced_guide_device_iterations():
    from lightning.pytorch.strategies import IPUStrategy

    model = Classifier()
    trainer = fit(model, dict(accelerator="ipu", devices=8, strategy=IPUStrategy(device_iterations=32)))
    assert trainer.global_step == 3 * 1024 // (8 * 32) * 32


def test_advanced_guide_training_and_inference_options():
    from lightning.pytorch import Trainer
    from lightning.pytorch.strategies import IPUStrategy

    model = Classifier()
    inference_opts = poptorch.Options()
    inference_opts.deviceIterations(32)

    training_opts = poptorch.Options()
    with pytest.warns(DeprecationWarning):
        training_opts.anchorMode(poptorch.AnchorMode.All)
    training_opts.deviceIterations(32)

    trainer = Trainer(
        accelerator="ipu", devices=8, strategy=IPUStrategy(inference_opts=inference_opts, training_opts=training_opts),
        max_epochs=3, num_sanity_val_steps=0, **QUIET)
    trainer.fit(model)
    assert trainer.strategy.training_opts.replication_factor == 8
    assert trainer.callback_metrics["train_loss_epoch"] < 1.0


class BeginBlockModule(Classifier):
    """Advanced guide: BeginBlock in __init__ places layer1, layer2+layer3, layer4, softmax on 4 IPUs."""

    def __init__(self):
        super().__init__()
        self.layer1 = poptorch.BeginBlock(torch.nn.Linear(FEATURES, 10), ipu_id=0)
        self.layer2 = poptorch.BeginBlock(torch.nn.Linear(10, 5), ipu_id=1)
        self.layer3 = torch.nn.Linear(5, 5)
        self.layer4 = poptorch.BeginBlock(torch.nn.Linear(5, CLASSES), ipu_id=2)
        self.softmax = poptorch.BeginBlock(torch.nn.Softmax(dim=1), ipu_id=3)

    def forward(self, x):
        x = torch.relu(self.layer1(x))
        x = torch.relu(self.layer3(torch.relu(self.layer2(x))))
        return self.softmax(self.layer4(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.nll_loss(torch.log(self(x) + 1e-6), y)
        self.log("train_loss", loss, on_epoch=True)
        return loss


class BlockContextModule(BeginBlockModule):
    """Advanced guide: the block context manager inside forward."""

    def __init__(self):
        Classifier.__init__(self)
        self.layer1 = torch.nn.Linear(FEATURES, 10)
        self.layer2 = torch.nn.Linear(10, 5)
        self.layer3 = torch.nn.Linear(5, 5)
        self.layer4 = torch.nn.Linear(5, CLASSES)
        self.act = torch.nn.ReLU()
        self.softmax = torch.nn.Softmax(dim=1)

    def forward(self, x):
        with poptorch.Block(ipu_id=0):
            x = self.act(self.layer1(x))
        with poptorch.Block(ipu_id=1):
            x = self.act(self.layer2(x))
        with poptorch.Block(ipu_id=2):
            x = self.act(self.layer3(x))
            x = self.act(self.layer4(x))
        with poptorch.Block(ipu_id=3):
            x = self.softmax(x)
        return x

    def training_step(self, batch, batch_idx):
        # "or any of the step functions": every op belongs to a block, the loss too (PopTorch's
        # "No active Block, all the ops must belong to a Block" otherwise).
        x, y = batch
        probabilities = self(x)
        with poptorch.Block(ipu_id=3):
            loss = torch.nn.functional.nll_loss(torch.log(probabilities + 1e-6), y)
        self.log("train_loss", loss, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        probabilities = self(x)
        with poptorch.Block(ipu_id=3):
            accuracy = torch.sum(torch.eq(torch.argmax(probabilities, -1), y).to(torch.float32)) / len(y)
        self.log("val_acc", accuracy)
        return accuracy


@pytest.mark.slow
@pytest.mark.parametrize("module", [BeginBlockModule, BlockContextModule])
def test_advanced_guide_model_parallelism_falls_back_to_sharded(module):
    from lightning.pytorch.strategies import IPUStrategy

    model = module()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = fit(model, dict(accelerator="ipu", devices=8, strategy=IPUStrategy(device_iterations=20)), epochs=4)
    sharded = [w for w in caught if "ShardedExecution" in str(w.message)]
    assert len(sharded) == 1 and "accumulate_grad_batches=7" in str(sharded[0].message)
    executor = trainer.strategy.poptorch_models if trainer.strategy.poptorch_models else None
    assert executor is not None
    assert type(trainer.strategy.training_opts._execution_strategy).__name__ == "ShardedExecution"


# ---------------------------------------------------------------------- Graphcore's tutorial
class SimpleTorchModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.the_network = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(),
                                               torch.nn.Linear(32, CLASSES), torch.nn.LogSoftmax(1))

    def forward(self, x):
        return self.the_network(x)


class TeenyTinyModel(pl.LightningModule):
    def __init__(self, options=None):
        super().__init__()
        self.model = SimpleTorchModel()
        self.options = options

    def training_step(self, batch, _):
        x, label = batch
        prediction = self.model(x)
        loss = torch.nn.functional.nll_loss(prediction, label)
        loss = poptorch.identity_loss(loss, reduction="mean")  # the tutorial's custom losses
        self.log("train_loss", loss, on_epoch=True)
        return loss

    def validation_step(self, batch, _):
        x, label = batch
        preds = torch.argmax(self.model(x), dim=1)
        acc = torch.sum(preds == label).float() / len(label)
        self.log("val_acc", acc, prog_bar=True)
        return acc

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)

    def train_dataloader(self):
        dataset = TensorDataset(*classification(3072))
        if self.options is None:
            return DataLoader(dataset, batch_size=16, shuffle=True)
        return poptorch.DataLoader(self.options, dataset, batch_size=16, shuffle=True)


def test_tutorial_options_and_poptorch_dataloader():
    from lightning.pytorch.plugins import IPUPlugin

    options = poptorch.Options()
    options.deviceIterations(3)
    options.replicationFactor(8)
    options.Training.gradientAccumulation(4)
    model = TeenyTinyModel(options)
    trainer = fit(model, dict(plugins=IPUPlugin(inference_opts=options, training_opts=options), log_every_n_steps=1))
    # each batch: 3 x 8 x 4 micro-batches of 16 -> 3072 samples give 2 host calls, 3 steps each
    assert trainer.global_step == 3 * 2 * 3


def test_tutorial_pipelined_with_autoreport(tmp_path):
    from lightning.pytorch.strategies import IPUStrategy

    model = TeenyTinyModel()
    model.model.the_network[2] = poptorch.BeginBlock(model.model.the_network[2], ipu_id=1)
    options = poptorch.Options()
    options.Training.gradientAccumulation(8)
    strategy = IPUStrategy(training_opts=options, autoreport=True, autoreport_dir=str(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = fit(model, dict(accelerator="ipu", devices=1, strategy=strategy))
    assert not [w for w in caught if "ShardedExecution" in str(w.message)]  # 2 stages, 8 >= 3: pipelined
    report = json.loads((tmp_path / "training" / "profile.json").read_text())
    assert report["format"] == "openpop-profile-1" and report["stage"] == "training"
    assert report["execution"]["strategy"] == "PipelinedExecution"
    assert [b["ipu"] for b in report["execution"]["blocks"]] == [0, 1]
    assert [s["stage"] for s in report["stages"]] == [0, 1]
    assert report["geometry"]["gradient_accumulation"] == 8
    assert len(report["host_calls"]) == trainer.global_step and report["compile_seconds"] >= 0
    assert {m["ipu"] for m in report["memory"]} == {0, 1}
    assert sum(m["parameter_bytes"] for m in report["memory"]) == 4 * sum(p.numel() for p in model.parameters())
    assert report["totals"]["samples"] == 3072 // 128 * 128 * 3
    assert (tmp_path / "validation" / "profile.json").exists() is False  # no val loader
    summary = json.loads((tmp_path / "training" / "report.json").read_text())  # trace + HTML report too
    assert [c["call"] for c in summary["host_calls"]] == [0, 1]
    assert {s["stage"] for s in summary["stages"]} == {0, 1}
    assert (tmp_path / "training" / "trace.json").exists() and (tmp_path / "training" / "report.html").exists()


# ---------------------------------------------------------------------- precision
@pytest.mark.parametrize("precision", ["32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true"])
def test_precisions_train(precision):
    from lightning.pytorch.strategies import IPUStrategy

    model = Classifier(batch_size=8, n=512, sgd=True)
    trainer = fit(model, dict(accelerator="ipu", devices=2, precision=precision,
                              strategy=IPUStrategy(device_iterations=4)))
    expected = {"16-true": torch.float16, "bf16-true": torch.bfloat16}.get(precision, torch.float32)
    assert model.l1.weight.dtype == expected
    assert trainer.precision_plugin.precision == precision


# ---------------------------------------------------------------------- pytorch_lightning
def test_pytorch_lightning_distribution():
    ppl = pytest.importorskip("pytorch_lightning")
    from pytorch_lightning.strategies import IPUStrategy

    class Model(ppl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(FEATURES, CLASSES)

        def training_step(self, batch, batch_idx):
            loss = torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])
            self.log("train_loss", loss, on_epoch=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.5)

    history = []

    class History(ppl.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            history.append(trainer.callback_metrics["train_loss_epoch"].item())

    trainer = ppl.Trainer(accelerator="ipu", devices=2, strategy=IPUStrategy(device_iterations=4), max_epochs=3,
                          callbacks=[History()], **QUIET)
    trainer.fit(Model(), DataLoader(TensorDataset(*classification(512)), batch_size=4))
    assert type(trainer.strategy).__module__ == "openpop._pytorch_lightning.strategy"
    assert history[-1] < history[0] and trainer.global_step == 3 * 512 // 32 * 4
