"""Small LightningModules, data and Trainer settings shared by the Lightning tests."""
import warnings

import pytest

pl = pytest.importorskip("lightning.pytorch")

import torch  # noqa: E402
from lightning.pytorch.strategies import IPUStrategy  # noqa: E402,F401  (resolved by openpop's hook)
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

warnings.filterwarnings("ignore", ".*does not have many workers.*")
warnings.filterwarnings("ignore", ".*isinstance\\(treespec, LeafSpec\\)*")

QUIET = dict(enable_progress_bar=False, logger=False, enable_checkpointing=False, enable_model_summary=False)


def regression_data(n=256, features=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=generator)
    y = torch.sin(x.sum(1, keepdim=True))
    return x, y


def loader(x, y, batch_size=4, **kwargs):
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, **kwargs)


def make_net(features=4, hidden=8, seed=1):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))


class Regressor(pl.LightningModule):
    """MSE regression; logs its loss in every step; records what the steps saw."""

    def __init__(self, net=None, lr=0.05, momentum=0.0, optimizer="sgd", scheduler=None):
        super().__init__()
        self.net = net if net is not None else make_net()
        self.lr, self.momentum, self.optimizer_name, self.scheduler = lr, momentum, optimizer, scheduler
        self.seen = []

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.seen.append(("train", batch_idx, self.global_step, x.shape[0]))
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("val_loss", loss)
        return loss

    def test_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("test_loss", loss)
        return {"loss": loss}

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        return self(x)

    def configure_optimizers(self):
        if self.optimizer_name == "adam":
            optimizer = torch.optim.Adam(self.parameters(), lr=self.lr)
        else:
            optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=self.momentum)
        if self.scheduler is None:
            return optimizer
        return [optimizer], [{"scheduler": self.scheduler(optimizer), "interval": "step"}]


def trainer(**kwargs):
    settings = dict(QUIET)
    settings.update(kwargs)
    return pl.Trainer(**settings)
