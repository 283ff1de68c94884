"""End to end: poptorch.DataLoader feeding a trainingModel, sync and async, against an oracle."""
import copy

import pytest
import torch
import torch.nn.functional as F

import poptorch

from helpers.oracle import train_loop


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x, y):
        out = self.fc(x)
        return out, F.cross_entropy(out, y)


def dataset(n=240):
    g = torch.Generator().manual_seed(3)
    return torch.utils.data.TensorDataset(torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g))


@pytest.mark.parametrize("mode", [poptorch.DataLoaderMode.Sync, poptorch.DataLoaderMode.Async])
def test_loader_fed_training_matches_oracle(mode):
    torch.manual_seed(0)
    model = Model()
    reference = copy.deepcopy(model)
    opts = poptorch.Options().deviceIterations(3).replicationFactor(2)
    opts.Training.gradientAccumulation(2)
    data = dataset()
    loader = poptorch.DataLoader(opts, data, batch_size=5, mode=mode)
    assert loader.combinedBatchSize == 5 * 3 * 2 * 2
    pop = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    calls = 0
    for x, y in loader:
        pop(x, y)
        calls += 1
    loader.terminate()
    assert calls == len(data) // 60
    x_all, y_all = data.tensors
    for i in range(calls):
        train_loop(reference, ref_opt, (x_all[i * 60:(i + 1) * 60], y_all[i * 60:(i + 1) * 60]),
                   lambda m, a, b: m(a, b)[1], 3, 2, 2)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)
