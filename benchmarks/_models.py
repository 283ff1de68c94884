"""Models several benchmarks share."""
import torch
import torch.nn.functional as F

import poptorch


class MLP(torch.nn.Module):
    """The tiny MLP of the host-overhead benchmarks (a width x width layer, ReLU, a width x 1 head);
    returns ``(output, mse loss)``."""

    def __init__(self, width=32):
        super().__init__()
        self.fc1 = torch.nn.Linear(width, width)
        self.fc2 = torch.nn.Linear(width, 1)

    def forward(self, x, y):
        out = self.fc2(torch.relu(self.fc1(x)))
        return out, F.mse_loss(out, y)


class FourBlocks(torch.nn.Module):
    """Four ``width x width`` linear layers with tanh, one ``BeginBlock`` (virtual IPU) each.
    Returns ``(output, mse loss)``; ``summed``: the output summed to a scalar (a pipeline
    benchmark that measures memory, not output collection)."""

    def __init__(self, width=256, summed=False):
        super().__init__()
        self.summed = summed
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(4))
        for i, layer in enumerate(self.layers):
            poptorch.BeginBlock(layer, user_id=f"b{i}", ipu_id=i)

    def forward(self, x, target):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x.sum() if self.summed else x, F.mse_loss(x, target)
