"""Lightning as lightning-graphcore's users wrote it: ``IPUStrategy(accelerator=IPUAccelerator())``
with no ``accelerator=`` flag, and Lightning 2.0's pure-half ``model.half()`` +
``precision="16-mixed"``, whose ``strategy.batch_to_device`` cast float batches to float16.
Training results are checked against hand-written loops."""
import copy
import importlib

import pytest
import torch

from helpers.lightning_models import IPUStrategy, Regressor, loader, make_net, pl, regression_data, trainer
from helpers.oracle import train_loop

pytestmark = pytest.mark.usefixtures("one_thread")

from lightning.pytorch.accelerators import CPUAccelerator, IPUAccelerator  # noqa: E402
from lightning.pytorch.plugins import IPUPrecision  # noqa: E402
from lightning.pytorch.utilities.exceptions import MisconfigurationException  # noqa: E402

CHANGED = (torch.float32, torch.float64)
UNCHANGED = (torch.uint8, torch.int8, torch.int32, torch.int64, torch.bool)


def _oracle_sgd(net, x, y, combined, di, r, dtype=torch.float32, lr=0.05):
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    xs, ys = x.to(dtype), y.to(dtype)
    for start in range(0, x.shape[0], combined):
        train_loop(net, optimizer, (xs[start:start + combined], ys[start:start + combined]),
                   lambda model, a, b: torch.nn.functional.mse_loss(model(a), b), di=di, ga=1, r=r)
    return net


def _lightning_graphcore():
    """``lightning_graphcore`` as served by openpop (skip where the real package is installed)."""
    module = importlib.import_module("lightning_graphcore")
    hook = importlib.import_module("openpop.lightning.hook")
    if not isinstance(getattr(module, "__loader__", None), hook._AliasLoader):
        pytest.skip("the real lightning-graphcore is installed")
    return module


# ---------------------------------------------------------------------------------------- 6a
def test_strategy_carrying_its_accelerator_needs_no_accelerator_flag():
    accelerator = IPUAccelerator()
    run = trainer(strategy=IPUStrategy(accelerator=accelerator), devices=4)
    assert run.accelerator is accelerator and run.strategy.accelerator is accelerator
    assert isinstance(run.strategy, IPUStrategy) and isinstance(run.strategy.precision_plugin, IPUPrecision)
    assert run.strategy.replication_factor == 4 and run.num_devices == 4


@pytest.mark.parametrize("flavour", ["lightning.pytorch", "pytorch_lightning"])
def test_both_distributions_take_the_strategys_accelerator(flavour):
    pl_module = pytest.importorskip(flavour)
    strategy = pl_module.strategies.IPUStrategy(accelerator=pl_module.accelerators.IPUAccelerator())
    run = pl_module.Trainer(strategy=strategy, devices=2, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False)
    assert run.accelerator is strategy.accelerator and run.strategy.replication_factor == 2


def test_lightning_graphcore_spelling_fits_like_the_oracle():
    graphcore = _lightning_graphcore()
    from lightning_graphcore.accelerator import IPUAccelerator as FromAcceleratorModule
    from lightning_graphcore.strategy import IPUStrategy as FromStrategyModule
    assert (graphcore.IPUStrategy, graphcore.IPUAccelerator) == (FromStrategyModule, FromAcceleratorModule)
    assert (graphcore.IPUStrategy, graphcore.IPUAccelerator) == (IPUStrategy, IPUAccelerator)

    x, y = regression_data(n=64)
    model = Regressor(make_net(), lr=0.05)
    reference = copy.deepcopy(model.net)
    run = trainer(strategy=graphcore.IPUStrategy(accelerator=graphcore.IPUAccelerator(), device_iterations=2),
                  devices=4, max_epochs=1)
    run.fit(model, loader(x, y, batch_size=2))

    _oracle_sgd(reference, x, y, combined=2 * 2 * 4, di=2, r=4)
    for ours, theirs in zip(model.net.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert run.global_step == 64 // 16 * 2


def test_strategy_carrying_another_accelerator_is_refused_naming_the_fix():
    with pytest.raises(ValueError, match=r"IPUStrategy\(accelerator=IPUAccelerator\(\)\)"):
        trainer(strategy=IPUStrategy(accelerator=CPUAccelerator()), devices=1)


def test_accelerator_flag_as_well_is_lightnings_own_both_error():
    # Lightning refuses an accelerator given twice for every strategy; the IPU one is no exception.
    with pytest.raises(MisconfigurationException, match="accelerator set through both strategy class and"):
        trainer(strategy=IPUStrategy(accelerator=IPUAccelerator()), accelerator="ipu", devices=1)


# ---------------------------------------------------------------------------------------- 6b
def _batch():
    return {"floats": [torch.ones(2, dtype=dtype) for dtype in CHANGED],
            "others": tuple(torch.ones(2, dtype=dtype) for dtype in UNCHANGED)}


def _assert_cast(batch, floats_to):
    assert [t.dtype for t in batch["floats"]] == [floats_to] * len(CHANGED)
    assert tuple(t.dtype for t in batch["others"]) == UNCHANGED
    assert all(torch.all(t == 1) for t in [*batch["floats"], *batch["others"]])


@pytest.mark.parametrize("spelling", ["flag", "plugin"])
def test_16_mixed_batch_to_device_casts_floats_to_half_before_fit(spelling):
    # lightning-graphcore's test_pure_half_precision asks the strategy before fit: no model yet.
    if spelling == "flag":
        run = trainer(strategy=IPUStrategy(accelerator=IPUAccelerator()), precision="16-mixed", devices=1)
    else:
        run = trainer(strategy=IPUStrategy(accelerator=IPUAccelerator(), precision_plugin=IPUPrecision("16-mixed")),
                      devices=1)
    assert run.strategy.precision_plugin.precision == "16-mixed"
    _assert_cast(run.strategy.batch_to_device(_batch()), torch.float16)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_other_precisions_leave_the_batch_as_it_is(precision):
    run = trainer(accelerator="ipu", precision=precision, devices=1)
    batch = run.strategy.batch_to_device(_batch())
    assert [t.dtype for t in batch["floats"]] == list(CHANGED)
    assert tuple(t.dtype for t in batch["others"]) == UNCHANGED


class BatchProbe(pl.Callback):
    """What ``strategy.batch_to_device`` makes of a float32/float64/int batch during the run, and
    the dtypes the training steps saw."""

    def __init__(self):
        self.during_run = None
        self.step_dtypes = set()

    def on_train_start(self, trainer, pl_module):
        self.during_run = trainer.strategy.batch_to_device(_batch())

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.step_dtypes.add(batch[0].dtype)


def test_half_model_16_mixed_casts_during_the_run_and_fits_like_the_float16_oracle():
    x, y = regression_data(n=64)
    model = Regressor(make_net(), lr=0.05).half()
    reference = copy.deepcopy(model.net)
    probe = BatchProbe()
    strategy = IPUStrategy(accelerator=IPUAccelerator(), precision_plugin=IPUPrecision("16-mixed"))
    run = trainer(strategy=strategy, devices=2, max_epochs=1, callbacks=[probe])
    run.fit(model, loader(x, y, batch_size=4))

    _assert_cast(probe.during_run, torch.float16)
    assert probe.step_dtypes == {torch.float16}
    assert {p.dtype for p in model.parameters()} == {torch.float16}
    _oracle_sgd(reference, x, y, combined=4 * 2, di=1, r=2, dtype=torch.float16)
    for ours, theirs in zip(model.net.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-3, atol=1e-3)


def test_float32_model_16_mixed_keeps_float32_batches_for_autocast():
    x, y = regression_data(n=16)
    probe = BatchProbe()
    run = trainer(accelerator="ipu", precision="16-mixed", devices=1, max_epochs=1, callbacks=[probe])
    run.fit(Regressor(make_net()), loader(x, y, batch_size=4))
    batch = probe.during_run
    assert [t.dtype for t in batch["floats"]] == list(CHANGED)
    assert tuple(t.dtype for t in batch["others"]) == UNCHANGED
    assert probe.step_dtypes == {torch.float32}
