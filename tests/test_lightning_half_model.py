"""``model.half()`` with ``precision="16-mixed"``: pure float16 training, as Lightning 2.0 ran it
(parameters stay the user's float16 tensors, float inputs cast to float16, no autocast, no
automatic loss scaling), checked against a hand-written float16 loop."""
import copy

import pytest
import torch

from helpers.lightning_models import IPUStrategy, Regressor, loader, make_net, pl, regression_data, trainer
from helpers.oracle import train_loop

pytestmark = pytest.mark.usefixtures("one_thread")


class DtypeProbe(pl.Callback):
    def __init__(self):
        self.batch_dtypes = set()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batch_dtypes.add(batch[0].dtype)


def test_half_model_with_16_mixed_trains_in_pure_float16_like_the_oracle():
    x, y = regression_data(n=128)
    model = Regressor(make_net(), lr=0.05).half()
    parameters = list(model.parameters())
    reference = copy.deepcopy(model.net)
    probe = DtypeProbe()
    run = trainer(accelerator="ipu", devices=2, precision="16-mixed", strategy=IPUStrategy(device_iterations=2),
                  max_epochs=1, callbacks=[probe])
    run.fit(model, loader(x, y, batch_size=4))

    assert list(model.parameters()) == parameters and {p.dtype for p in parameters} == {torch.float16}
    assert probe.batch_dtypes == {torch.float16}
    assert not hasattr(run.optimizers[0], "loss_scaling")
    assert run.strategy.training_opts.Training.automaticLossScalingSettings["enabled"] is False

    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)
    xh, yh = x.half(), y.half()
    for start in range(0, 128, 16):
        train_loop(reference, optimizer, (xh[start:start + 16], yh[start:start + 16]),
                   lambda net, a, b: torch.nn.functional.mse_loss(net(a), b), di=2, ga=1, r=2)
    for ours, theirs in zip(model.net.parameters(), reference.parameters()):
        assert ours.dtype == torch.float16
        torch.testing.assert_close(ours, theirs, rtol=1e-3, atol=1e-3)  # bit-exact today
    assert run.global_step == 128 // 16 * 2


def test_float32_model_with_16_mixed_keeps_autocast_and_loss_scaling():
    x, y = regression_data(n=64)
    model = Regressor(make_net())
    probe = DtypeProbe()
    run = trainer(accelerator="ipu", devices=1, precision="16-mixed", max_epochs=1, callbacks=[probe])
    run.fit(model, loader(x, y, batch_size=4))
    assert {p.dtype for p in model.parameters()} == {torch.float32} and probe.batch_dtypes == {torch.float32}
    assert run.strategy.training_opts.Training.automaticLossScalingSettings["enabled"] is True
    assert run.optimizers[0].loss_scaling > 0
