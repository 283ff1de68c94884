"""Small models several test modules train, with their loss and data makers.

Each model returns ``(output, loss)``, the form ``poptorch.trainingModel`` expects."""
import torch
import torch.nn.functional as F

import poptorch


class Classifier(torch.nn.Module):
    """One linear layer, 4 features -> 3 classes, cross-entropy loss. Module level, so pickle
    finds its class."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x, labels):
        out = self.fc(x)
        return out, F.cross_entropy(out, labels)


def classifier_batch(seed=0, rows=4):
    """``(x, labels)`` for ``Classifier``, the same for the same seed."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 4, generator=g), torch.randint(0, 3, (rows,), generator=g)


def loss_of(model, *inputs):
    """The loss a ``(output, loss)`` model computes: the oracles' ``loss_fn``."""
    return model(*inputs)[1]


class FourBlocks(torch.nn.Module):
    """Four linear layers; ``style`` picks how they are split over four virtual IPUs."""

    def __init__(self, style=None):
        super().__init__()
        self.style = style
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(4))
        if style == "begin_block":
            for i, layer in enumerate(self.layers):
                poptorch.BeginBlock(layer, user_id=f"b{i}", ipu_id=i)

    def forward(self, x, target):
        # With ``with Block`` scopes every op belongs to a block, the loss too (as PopTorch
        # requires: "No active Block"): it joins the last block, as Graphcore's tutorials write it.
        if self.style == "block":
            for i, layer in enumerate(self.layers):
                with poptorch.Block(user_id=f"b{i}", ipu_id=i):
                    x = torch.tanh(layer(x))
            with poptorch.Block(user_id="b3", ipu_id=3):
                return x, F.mse_loss(x, target)
        if self.style == "block_function":
            for i, layer in enumerate(self.layers):
                x = _apply_in_block(i, layer, x)
            return x, _loss_in_last_block(x, target)
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x, F.mse_loss(x, target)


@poptorch.BlockFunction(user_id="b3", ipu_id=3)
def _loss_in_last_block(x, target):
    return F.mse_loss(x, target)


def _apply_in_block(i, layer, x):
    @poptorch.BlockFunction(user_id=f"b{i}", ipu_id=i)
    def run(value):
        return torch.tanh(layer(value))
    return run(x)


def strategy_options(strategy, ga=8, di=2):
    """Options the ``FourBlocks`` tests train under: ``strategy`` None, "sharded" or "pipelined"."""
    opts = poptorch.Options().deviceIterations(di).outputMode(poptorch.OutputMode.All)
    opts.Training.gradientAccumulation(ga)
    if strategy is not None:
        opts.setExecutionStrategy(strategy)
    return opts


class Normed(torch.nn.Module):
    """A linear layer and BatchNorm (buffers updated per micro-batch); identity loss."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.bn = torch.nn.BatchNorm1d(4)

    def forward(self, x):
        out = self.bn(self.fc(x))
        return out, poptorch.identity_loss(out.pow(2), reduction="mean")


class Regressor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 8)
        self.fc2 = torch.nn.Linear(8, 2)

    def forward(self, x, target):
        out = self.fc2(torch.tanh(self.fc1(x)))
        return out, F.mse_loss(out, target)


def regressor_loss(model, x, t):
    return model(x, t)[1]


def make_data(rows, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 6, generator=g), torch.randn(rows, 2, generator=g)
