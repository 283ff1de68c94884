"""Lightning's IPUStrategy with the compiled backend allowed: Lightning's per-optimizer-step work
hangs on optimizer step hooks, so the executor stays eager (one warning naming them) and the
run still equals the plain-PyTorch oracle."""
import copy

import pytest
import torch

import poptorch

from helpers.lightning_models import IPUStrategy, Regressor, loader, make_net, regression_data, trainer

pytestmark = pytest.mark.usefixtures("one_thread")


def test_ipu_strategy_with_auto_backend_stays_eager_and_exact(warnings_logged):
    x, y = regression_data(n=64)
    model = Regressor(make_net(), lr=0.05, momentum=0.9)
    reference = copy.deepcopy(model.net)
    opts = poptorch.Options().openpopBackend("auto", compile_after=0.0)
    t = trainer(accelerator="ipu", devices=1, max_epochs=1,
                strategy=IPUStrategy(device_iterations=4, training_opts=opts))
    t.fit(model, loader(x, y, batch_size=4))
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    for step in range(16):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(reference(x[step * 4:(step + 1) * 4]), y[step * 4:(step + 1) * 4]).backward()
        optimizer.step()
    for ours, theirs in zip(model.net.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    declined = [m for m in warnings_logged() if "compiled backend does not support" in m]
    assert len(declined) == 1 and "optimizer step hooks" in declined[0]
    assert t.global_step == 16
