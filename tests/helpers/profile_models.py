"""The models the profile tests record: a 4-stage pipeline (``pipelined_model``, ``batch``) and a
one-layer model."""
import torch
import torch.nn.functional as F

import poptorch

STAGES = 4
GA = 8
DI = 2
MICRO = 2


class FourStages(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(STAGES))
        for i, layer in enumerate(self.layers):
            poptorch.BeginBlock(layer, user_id=f"b{i}", ipu_id=i)

    def forward(self, x, target):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x, F.mse_loss(x, target)


def pipelined_model():
    torch.manual_seed(0)
    opts = poptorch.Options().deviceIterations(DI)
    opts.Training.gradientAccumulation(GA)
    opts.setExecutionStrategy(poptorch.PipelinedExecution())
    model = FourStages()
    return poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.01))


def batch():
    rows = DI * GA * MICRO
    return torch.randn(rows, 8), torch.randn(rows, 8)


class OneLayer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x, target):
        out = self.fc(x)
        return out, F.mse_loss(out, target)
