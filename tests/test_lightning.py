"""Lightning on openpop: Trainer forms, numerics against plain-PyTorch oracles, evaluation
outputs, checkpoints, and the limitations of Lightning's old IPU support that openpop lifts."""
import copy

import pytest

pytest.importorskip("lightning.pytorch")  # a skip, not an ImportError, from openpop.lightning below

import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, TensorDataset

import openpop.lightning as opl

from helpers.lightning_models import QUIET, IPUStrategy, Regressor, loader, make_net, pl, regression_data, trainer

pytestmark = pytest.mark.usefixtures("one_thread")

MSE = torch.nn.functional.mse_loss


def oracle_steps(net, x, y, micro, per_step, steps, optimizer, scheduler=None, clip=None):
    """Plain PyTorch: ``steps`` optimizer steps, each over ``per_step`` consecutive micro-batches
    of ``micro`` rows (mean-reduced), as PopART's [DI, GA, R, micro] order lays them out."""
    losses, row = [], 0
    for _ in range(steps):
        optimizer.zero_grad()
        for _ in range(per_step):
            xb, yb = x[row:row + micro], y[row:row + micro]
            row = (row + micro) % x.shape[0]
            loss = MSE(net(xb), yb)
            losses.append(loss.detach())
            (loss / per_step).backward()
        if clip is not None:
            clip(net.parameters())
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    return torch.stack(losses)


# ---------------------------------------------------------------------- Trainer forms
@pytest.mark.parametrize("form", ["accelerator_devices", "accelerator_strategy", "strategy_only", "strategy_name",
                                  "legacy_plugin"])
def test_trainer_forms_select_openpop(form):
    kwargs = {
        "accelerator_devices": dict(accelerator="ipu", devices=4),
        "accelerator_strategy": dict(accelerator="ipu", devices=4, strategy=IPUStrategy(device_iterations=8)),
        "strategy_only": dict(strategy=IPUStrategy(device_iterations=8), devices=4),
        "strategy_name": dict(strategy="ipu_strategy", devices=4),
        "legacy_plugin": dict(plugins=pl.plugins.IPUPlugin(device_iterations=8), devices=4),
    }[form]
    t = trainer(**kwargs)
    assert isinstance(t.accelerator, opl.IPUAccelerator)
    assert isinstance(t.strategy, opl.IPUStrategy)
    assert isinstance(t.precision_plugin, opl.IPUPrecision)
    assert t.num_devices == 4 and t.strategy.replication_factor == 4
    assert t.strategy.root_device == torch.device("cpu")


def test_names_and_registries():
    from lightning.pytorch.accelerators import AcceleratorRegistry, IPUAccelerator
    from lightning.pytorch.plugins import IPUPrecisionPlugin
    from lightning.pytorch.strategies import StrategyRegistry
    from lightning.pytorch.strategies.ipu import IPUStrategy as FromSubmodule
    assert IPUAccelerator is opl.IPUAccelerator and IPUPrecisionPlugin is opl.IPUPrecision
    assert FromSubmodule is opl.IPUStrategy
    assert "ipu" in AcceleratorRegistry.available_accelerators()
    assert "ipu_strategy" in StrategyRegistry.available_strategies()
    assert pl.Trainer(accelerator="ipu", devices="auto", logger=False).num_devices == 4


def test_user_options_win_over_derived_settings():
    import poptorch
    training = poptorch.Options().deviceIterations(3)
    training.Training.gradientAccumulation(5)
    training.outputMode(poptorch.OutputMode.All)
    inference = poptorch.Options().replicationFactor(2)
    strategy = IPUStrategy(device_iterations=7, training_opts=training, inference_opts=inference)
    t = trainer(accelerator="ipu", devices=4, strategy=strategy, accumulate_grad_batches=2, max_epochs=1)
    x, y = regression_data(n=240)
    t.fit(Regressor(), loader(x, y, batch_size=2))
    opts = t.strategy.training_opts
    assert (opts.device_iterations, opts.replication_factor, opts.Training.gradient_accumulation) == (3, 4, 5)
    assert t.strategy.inference_opts.device_iterations == 7 and t.strategy.inference_opts.replication_factor == 2
    assert t.global_step == 240 // (2 * 3 * 4 * 5) * 3


# ---------------------------------------------------------------------- numerics
def test_fit_equals_plain_pytorch_oracle():
    """devices=4, accumulate_grad_batches=2, device_iterations=8, momentum SGD, a step-interval
    LR scheduler: same weights, same losses, one global step per optimizer step."""
    x, y = regression_data(n=512)
    scheduler = lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)  # noqa: E731
    model = Regressor(make_net(), lr=0.05, momentum=0.9, scheduler=scheduler)
    reference = copy.deepcopy(model.net)
    t = trainer(accelerator="ipu", devices=4, strategy=IPUStrategy(device_iterations=8), accumulate_grad_batches=2,
                max_epochs=2)
    t.fit(model, loader(x, y, batch_size=4))

    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    losses = oracle_steps(reference, x, y, micro=4, per_step=8, steps=32, optimizer=optimizer,
                          scheduler=torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5))
    for ours, theirs in zip(model.net.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    assert t.global_step == 32
    assert t.optimizers[0].param_groups[0]["lr"] == pytest.approx(optimizer.param_groups[0]["lr"])
    # train_loss is logged once per host call: the mean over its 64 micro-batches.
    torch.testing.assert_close(t.callback_metrics["train_loss"], losses[-64:].mean(), rtol=1e-5, atol=1e-6)
    assert t.accumulate_grad_batches == 2  # restored after the run


def test_step_sees_cpu_batch_index_and_global_step():
    x, y = regression_data(n=64)
    model = Regressor()
    t = trainer(accelerator="ipu", devices=2, strategy=IPUStrategy(device_iterations=4), accumulate_grad_batches=2,
                max_epochs=1)
    t.fit(model, loader(x, y, batch_size=2))
    seen = model.seen[1:]  # the first entry is the compile pass
    assert len(seen) == 32
    # micro-batch k of the epoch (replicas share it): batch_idx = k, global_step = k // 2
    expected = [(k, k // 2) for k in range(16) for _ in range(2)]
    assert [(b, g) for _, b, g, _ in seen] == expected


def test_estimated_stepping_batches_counts_optimizer_steps():
    class Recording(Regressor):
        def configure_optimizers(self):
            self.estimate = self.trainer.estimated_stepping_batches
            return super().configure_optimizers()
    x, y = regression_data(n=128)
    model = Recording()
    t = trainer(accelerator="ipu", devices=2, strategy=IPUStrategy(device_iterations=4), max_epochs=3)
    t.fit(model, loader(x, y, batch_size=4))
    assert model.estimate == t.global_step == 128 // 32 * 4 * 3


# ---------------------------------------------------------------------- evaluation
def test_validate_test_predict_outputs_and_leftover_batches():
    x, y = regression_data(n=50)
    model = Regressor()
    t = trainer(accelerator="ipu", devices=2, strategy=IPUStrategy(device_iterations=4))
    expected = model(x).detach()
    predictions = t.predict(model, DataLoader(x, batch_size=3))
    assert [p.shape[0] for p in predictions] == [24, 24, 2]  # 24 = 3 x 4 x 2, the last one on the host
    torch.testing.assert_close(torch.cat(predictions), expected)
    (result,) = t.validate(model, loader(x, y, batch_size=3), verbose=False)
    assert result["val_loss"] == pytest.approx(MSE(expected, y).item(), rel=1e-5)
    (result,) = t.test(model, loader(x, y, batch_size=3), verbose=False)
    assert result["test_loss"] == pytest.approx(MSE(expected, y).item(), rel=1e-5)


def test_validation_sees_trained_weights_during_fit():
    class Checking(Regressor):
        def on_validation_epoch_end(self):
            self.val_seen = self.trainer.callback_metrics["val_loss"].item()
            self.host = MSE(self(self.vx), self.vy).item()
    x, y = regression_data(n=128)
    model = Checking()
    model.vx, model.vy = x[:64], y[:64]
    t = trainer(accelerator="ipu", devices=2, strategy=IPUStrategy(device_iterations=2), max_epochs=2,
                num_sanity_val_steps=1)
    t.fit(model, loader(x, y), loader(x[:64], y[:64]))
    assert model.val_seen == pytest.approx(model.host, rel=1e-5)


# ---------------------------------------------------------------------- checkpoints
def test_checkpoint_resume_equals_uninterrupted_run(tmp_path):
    x, y = regression_data(n=128)
    scheduler = lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)  # noqa: E731
    settings = dict(accelerator="ipu", devices=2, strategy=None, accumulate_grad_batches=2)

    def run(epochs, **kwargs):
        model = Regressor(make_net(), lr=0.01, optimizer="adam", scheduler=scheduler)
        options = dict(QUIET, **{k: v for k, v in settings.items() if k != "strategy"})
        options.update(kwargs)
        t = pl.Trainer(strategy=IPUStrategy(device_iterations=2), max_epochs=epochs, **options)
        return model, t

    straight, t1 = run(3)
    t1.fit(straight, loader(x, y))
    first, t2 = run(1, enable_checkpointing=True, callbacks=[pl.callbacks.ModelCheckpoint(dirpath=tmp_path,
                                                                                           save_last=True)])
    t2.fit(first, loader(x, y))
    resumed, t3 = run(3)
    t3.fit(resumed, loader(x, y), ckpt_path=str(tmp_path / "last.ckpt"))
    assert t3.global_step == t1.global_step == 3 * (128 // 32) * 2
    for a, b in zip(straight.parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert t3.optimizers[0].param_groups[0]["lr"] == t1.optimizers[0].param_groups[0]["lr"]


# ---------------------------------------------------------------------- lifted limitations
class Logging(Regressor):
    def training_step(self, batch, batch_idx):
        self.log("idx_mean", float(batch_idx))
        self.log("count", 1.0, reduce_fx="sum")
        self.log("idx_max", float(batch_idx), reduce_fx="max")
        self.log_dict({"weighted": batch[0][:, 0].mean()}, batch_size=batch[0].shape[0])
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.log("val_x", batch[0].mean())
        self.log("val_count", float(batch[0].shape[0]), reduce_fx="sum")

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        self.log("predicted", float(batch[0].shape[0]), reduce_fx="sum")
        return self(batch[0])


class ListLogger(pl.loggers.Logger):
    def __init__(self):
        super().__init__()
        self.records = []

    @property
    def name(self):
        return "list"

    @property
    def version(self):
        return 0

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def log_metrics(self, metrics, step=None):
        self.records.append((dict(metrics), step))


def test_self_log_in_steps_is_reduced_per_host_call():
    x, y = regression_data(n=80)
    model = Logging()
    t = trainer(accelerator="ipu", devices=2, strategy=IPUStrategy(device_iterations=4), max_epochs=1,
                limit_train_batches=1)
    t.fit(model, loader(x, y, batch_size=2))
    metrics = t.callback_metrics
    assert metrics["idx_mean"].item() == pytest.approx(1.5)   # batch_idx 0..3, twice each
    assert metrics["count"].item() == 8                       # 4 device iterations x 2 replicas
    assert metrics["idx_max"].item() == 3
    assert metrics["weighted"].item() == pytest.approx(x[:16, 0].mean().item(), rel=1e-5)
    # validation: epoch means weighted by sample count, leftover host batch included
    (result,) = t.validate(model, loader(x[:10], y[:10], batch_size=1), verbose=False)
    assert result["val_x"] == pytest.approx(x[:10].mean().item(), rel=1e-5)
    assert result["val_count"] == 10
    logger = ListLogger()
    t = trainer(accelerator="ipu", devices=2, strategy=IPUStrategy(device_iterations=2), logger=logger)
    t.predict(model, loader(x[:12], y[:12], batch_size=2))
    assert [(m["predicted"], step) for m, step in logger.records] == [(8.0, 0), (4.0, 1)]


class TwoOptimizers(pl.LightningModule):
    """Manual optimization: two models, two optimizers, stepped in turn (GAN-style)."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.first, self.second = make_net(seed=3), make_net(seed=4)

    def training_step(self, batch, batch_idx):
        x, y = batch
        opt_a, opt_b = self.optimizers()
        loss_a = MSE(self.first(x), y)
        opt_a.zero_grad()
        self.manual_backward(loss_a)
        opt_a.step()
        loss_b = MSE(self.second(x) + self.first(x).detach(), y)
        opt_b.zero_grad()
        self.manual_backward(loss_b)
        opt_b.step()
        self.log("loss_b", loss_b)
        return loss_b

    def configure_optimizers(self):
        return torch.optim.SGD(self.first.parameters(), lr=0.1), torch.optim.Adam(self.second.parameters(), lr=0.01)


def test_manual_optimization_with_two_optimizers_equals_oracle():
    x, y = regression_data(n=64)
    model = TwoOptimizers()
    first, second = copy.deepcopy(model.first), copy.deepcopy(model.second)
    t = trainer(accelerator="ipu", devices=1, strategy=IPUStrategy(device_iterations=4), max_epochs=2)
    t.fit(model, loader(x, y, batch_size=4))
    opt_a, opt_b = torch.optim.SGD(first.parameters(), lr=0.1), torch.optim.Adam(second.parameters(), lr=0.01)
    for _ in range(2):
        for row in range(0, 64, 4):
            xb, yb = x[row:row + 4], y[row:row + 4]
            opt_a.zero_grad()
            MSE(first(xb), yb).backward()
            opt_a.step()
            opt_b.zero_grad()
            MSE(second(xb) + first(xb).detach(), yb).backward()
            opt_b.step()
    for a, b in zip(list(model.first.parameters()) + list(model.second.parameters()),
                    list(first.parameters()) + list(second.parameters())):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert t.global_step == 2 * 2 * 16  # two optimizers, 16 micro-batches per epoch


def test_manual_optimization_with_replicas_equals_ddp_oracle():
    """devices=2: replicas meet as DDP ranks (gradients averaged at manual_backward, each
    optimizer step applied once)."""
    x, y = regression_data(n=64)
    model = TwoOptimizers()
    first, second = copy.deepcopy(model.first), copy.deepcopy(model.second)
    t = trainer(accelerator="ipu", devices=2, strategy=IPUStrategy(device_iterations=2), max_epochs=1)
    t.fit(model, loader(x, y, batch_size=4))
    opt_a, opt_b = torch.optim.SGD(first.parameters(), lr=0.1), torch.optim.Adam(second.parameters(), lr=0.01)
    for row in range(0, 64, 8):  # one step per device iteration: replica r gets rows row+4r .. row+4r+4
        parts = [(x[row + 4 * r:row + 4 * r + 4], y[row + 4 * r:row + 4 * r + 4]) for r in range(2)]
        opt_a.zero_grad()
        (sum(MSE(first(xb), yb) for xb, yb in parts) / 2).backward()
        opt_a.step()
        opt_b.zero_grad()
        (sum(MSE(second(xb) + first(xb).detach(), yb) for xb, yb in parts) / 2).backward()
        opt_b.step()
    for a, b in zip(list(model.first.parameters()) + list(model.second.parameters()),
                    list(first.parameters()) + list(second.parameters())):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert t.global_step == 2 * 8  # two optimizers, 8 steps


def test_manual_replicas_that_diverge_are_an_error():
    class Diverging(TwoOptimizers):
        def training_step(self, batch, batch_idx):
            if batch[0][0, 0] > 0:  # only some replicas step
                return super().training_step(batch, batch_idx)
            return None

    x, y = regression_data(n=64)
    x[::4, 0] = torch.arange(16).float() % 2 - 0.5  # replica 0 positive, replica 1 negative
    t = trainer(accelerator="ipu", devices=2, max_epochs=1)
    with pytest.raises(RuntimeError, match="did not meet"):
        t.fit(Diverging(), loader(x, y, batch_size=4))


@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_gradient_clipping_each_optimizer_step(algorithm):
    class Counting(Regressor):
        clipped_norms = []

        def on_before_optimizer_step(self, optimizer):
            grads = [p.grad for p in self.parameters()]
            assert all(g is not None for g in grads)
            self.clipped_norms.append(len(grads))

    x, y = regression_data(n=128)
    model = Counting(make_net(), lr=0.5)
    reference = copy.deepcopy(model.net)
    t = trainer(accelerator="ipu", devices=2, strategy=IPUStrategy(device_iterations=4), max_epochs=1,
                gradient_clip_val=0.05, gradient_clip_algorithm=algorithm)
    t.fit(model, loader(x, y, batch_size=4))
    if algorithm == "norm":
        clip = lambda params: torch.nn.utils.clip_grad_norm_(params, 0.05)  # noqa: E731
    else:
        clip = lambda params: torch.nn.utils.clip_grad_value_(params, 0.05)  # noqa: E731
    oracle_steps(reference, x, y, micro=4, per_step=2, steps=16, clip=clip,
                 optimizer=torch.optim.SGD(reference.parameters(), lr=0.5))
    for ours, theirs in zip(model.net.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    assert len(Counting.clipped_norms) == 16  # once per optimizer step, not per host call


class ReversedBatches(torch.utils.data.Sampler):
    """A user BatchSampler: batches of 3 indices, last batch first."""

    def __init__(self, n):
        self.batches = list(BatchSampler(SequentialSampler(range(n)), 3, drop_last=True))[::-1]

    def __iter__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)


def test_batch_sampler_with_several_replicas():
    class Recording(Regressor):
        ids = []

        def training_step(self, batch, batch_idx):
            if not self._compile_pass():
                self.ids.append(batch[0][:, 0].tolist())
            return super().training_step(batch, batch_idx)

        def _compile_pass(self):
            from openpop.runtime import context
            ctx = context.current()
            return ctx is not None and ctx.tracing

    n = 48
    x = torch.arange(n, dtype=torch.float32).unsqueeze(1).repeat(1, 4)
    y = torch.zeros(n, 1)
    sampler = ReversedBatches(n)
    t = trainer(accelerator="ipu", devices=4, strategy=IPUStrategy(device_iterations=2), max_epochs=1)
    t.fit(Recording(), DataLoader(TensorDataset(x, y), batch_sampler=sampler))
    assert Recording.ids == [[float(i) for i in batch] for batch in sampler.batches]


def test_batch_transfer_hooks_are_honoured():
    class Transferring(Regressor):
        transfers = 0

        def transfer_batch_to_device(self, batch, device, dataloader_idx):
            type(self).transfers += 1
            return super().transfer_batch_to_device(batch, device, dataloader_idx)

        def on_after_batch_transfer(self, batch, dataloader_idx):
            x, y = batch
            return x * 0 + 7, y

        def training_step(self, batch, batch_idx):
            assert torch.all(batch[0] == 7)
            return super().training_step(batch, batch_idx)

    x, y = regression_data(n=64)
    t = trainer(accelerator="ipu", devices=2, strategy=IPUStrategy(device_iterations=2), max_epochs=1)
    t.fit(Transferring(), loader(x, y, batch_size=4))
    assert Transferring.transfers == 64 // 16  # once per host call (combined batch)


def test_python_branching_on_tensor_values_is_eager():
    class Branching(Regressor):
        def training_step(self, batch, batch_idx):
            x, y = batch
            out = self(x)
            if y.mean() > 0:             # a data-dependent branch, decided per micro-batch
                loss = MSE(out, y)
            else:
                loss = torch.nn.functional.l1_loss(out, y)
            if batch_idx % 2:            # a Python value, different per micro-batch
                loss = loss * 2
            return loss

    x, y = regression_data(n=64)
    model = Branching(make_net(), lr=0.1)
    reference = copy.deepcopy(model.net)
    t = trainer(accelerator="ipu", devices=1, strategy=IPUStrategy(device_iterations=4), max_epochs=1)
    t.fit(model, loader(x, y, batch_size=4))
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for k in range(16):
        xb, yb = x[4 * k:4 * k + 4], y[4 * k:4 * k + 4]
        out = reference(xb)
        loss = MSE(out, yb) if yb.mean() > 0 else torch.nn.functional.l1_loss(out, yb)
        loss = loss * 2 if k % 2 else loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for ours, theirs in zip(model.net.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


# ---------------------------------------------------------------------- bad input
def test_unsupported_precision():
    with pytest.raises(ValueError, match=r"`Trainer\(accelerator='ipu', precision='64-true'\)` is not supported"):
        pl.Trainer(accelerator="ipu", devices=1, precision="64-true", logger=False)


@pytest.mark.parametrize("devices, message", [(3, "power of two"), ([0, 1], "must be an int")])
def test_devices_must_be_a_power_of_two(devices, message):
    with pytest.raises(ValueError, match=message):
        pl.Trainer(accelerator="ipu", devices=devices, logger=False)


def test_ipu_strategy_with_another_accelerator():
    with pytest.raises(ValueError, match="needs `accelerator='ipu'`"):
        pl.Trainer(accelerator="cpu", strategy=IPUStrategy(), logger=False)
    with pytest.raises(ValueError, match="runs with `IPUStrategy` only"):
        pl.Trainer(accelerator="ipu", strategy="ddp", logger=False)


def test_bad_strategy_arguments():
    with pytest.raises(ValueError, match="device_iterations"):
        IPUStrategy(device_iterations=0)
    with pytest.raises(TypeError, match="poptorch.Options"):
        IPUStrategy(training_opts={"device_iterations": 2})


def test_accumulate_grad_batches_changing_between_epochs():
    x, y = regression_data(n=64)
    scheduler = pl.callbacks.GradientAccumulationScheduler(scheduling={0: 1, 1: 2})
    t = trainer(accelerator="ipu", devices=1, max_epochs=2, callbacks=[scheduler])
    with pytest.raises(RuntimeError, match="does not support `accumulate_grad_batches` changing between epochs"):
        t.fit(Regressor(), loader(x, y))

    class Changing(pl.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            self.weights = copy.deepcopy(pl_module.state_dict())
            trainer.accumulate_grad_batches = 4

    model, changing = Regressor(), Changing()
    t = trainer(accelerator="ipu", devices=1, max_epochs=2, callbacks=[changing])
    with pytest.raises(RuntimeError, match="changing between epochs"):
        t.fit(model, loader(x, y))
    for key, value in changing.weights.items():
        assert torch.equal(model.state_dict()[key], value)


def test_lbfgs_needs_manual_optimization():
    class WithLBFGS(Regressor):
        def configure_optimizers(self):
            return torch.optim.LBFGS(self.parameters())
    x, y = regression_data(n=32)
    with pytest.raises(pl.utilities.exceptions.MisconfigurationException, match="manual optimization"):
        trainer(accelerator="ipu", devices=1, max_epochs=1).fit(WithLBFGS(), loader(x, y))


def test_compile_pass_leaves_torchmetrics_and_logs_alone():
    torchmetrics = pytest.importorskip("torchmetrics")

    class Metered(Regressor):
        def __init__(self):
            super().__init__()
            self.total = torchmetrics.SumMetric()

        def validation_step(self, batch, batch_idx):
            self.total.update(batch[0][:, 0])
            self.log("total", self.total)
            self.log("rows", float(batch[0].shape[0]), reduce_fx="sum")

    x, y = regression_data(n=48)
    t = trainer(accelerator="ipu", devices=2, strategy=IPUStrategy(device_iterations=3))
    (result,) = t.validate(Metered(), loader(x, y, batch_size=4), verbose=False)
    assert result["total"] == pytest.approx(x[:, 0].sum().item(), rel=1e-5, abs=1e-5)
    assert result["rows"] == 48


def test_test_and_predict_with_buffers_under_inference_mode():
    """Lightning's evaluation loops run under torch.inference_mode(); models with buffers work."""
    class WithBuffer(Regressor):
        def __init__(self):
            super().__init__()
            self.register_buffer("scale", torch.tensor(2.0))

        def forward(self, x):
            return super().forward(x) * self.scale

    x, y = regression_data(16)
    cpu = trainer(accelerator="cpu", devices=1).test(WithBuffer(), loader(x, y), verbose=False)
    ipu_trainer = trainer(accelerator="ipu", devices=1)
    ipu = ipu_trainer.test(WithBuffer(), loader(x, y), verbose=False)
    assert ipu[0]["test_loss"] == pytest.approx(cpu[0]["test_loss"], rel=1e-6)
    predictions = ipu_trainer.predict(WithBuffer(), loader(x, y))
    assert sum(len(p) for p in predictions) == 16


def test_manual_optimization_with_replicas_steps_the_scheduler_once():
    class Manual(Regressor):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            optimizer = self.optimizers()
            x, y = batch
            loss = torch.nn.functional.mse_loss(self(x), y)
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()
            self.lr_schedulers().step()
            return loss

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)]

    x, y = regression_data(32)
    model = Manual()
    trainer(accelerator="ipu", devices=2, max_epochs=1).fit(model, loader(x, y))
    # 32 samples / (4 per replica x 2 replicas) = 4 optimizer steps -> lr halved twice.
    assert model.optimizers().param_groups[0]["lr"] == pytest.approx(0.025)


def test_misleading_step_settings_are_warned_about():
    x, y = regression_data(16)
    model = Regressor()
    checkpoint = pl.callbacks.ModelCheckpoint(every_n_train_steps=3)
    run = trainer(accelerator="ipu", devices=2, strategy=IPUStrategy(device_iterations=2), max_epochs=1,
                  enable_checkpointing=True, callbacks=[checkpoint])
    with pytest.warns(UserWarning, match=r"every_n_train_steps=3\) is not a multiple of device_iterations=2"):
        run.fit(model, loader(x, y, batch_size=4))


def test_a_training_epoch_without_a_batch_is_an_error_naming_the_sizes():
    """12 samples, combined batch 4 x 2 x 2 = 16: training drops the incomplete batch, so an epoch would have
    none and Lightning would skip it with no optimizer step. An error before anything runs instead."""
    x, y = regression_data(12)
    model = Regressor()
    before = copy.deepcopy(model.state_dict())
    run = trainer(accelerator="ipu", devices=2, strategy=IPUStrategy(device_iterations=2), max_epochs=1)
    with pytest.raises(pl.utilities.exceptions.MisconfigurationException) as error:
        run.fit(model, loader(x, y, batch_size=4))
    assert str(error.value) == (
        "The training dataset (12 samples) is smaller than one host call's combined batch (16 samples = batch_size 4 "
        "x device_iterations 2 x devices 2 x accumulate_grad_batches 1): an epoch has no batch, so no optimizer "
        "step would run.\nopenpop: use a batch_size of at most 3 or fewer devices, device_iterations or "
        "accumulate_grad_batches, or give the dataset at least 16 samples")
    assert run.global_step == 0
    assert all(torch.equal(before[name], value) for name, value in model.state_dict().items())


def test_user_options_set_to_defaults_still_win():
    import poptorch
    from openpop.lightning.run_options import stage_options
    settings = dict(training=True, device_iterations=4, replicas=2, accumulation=2, loss_scaling=False)
    user = poptorch.Options().deviceIterations(1).replicationFactor(1)
    user.Training.gradientAccumulation(1)
    options, _ = stage_options(user, in_place=True, **settings)
    assert options is user
    assert (options.device_iterations, options.replication_factor, options.Training.gradient_accumulation) == (1, 1, 1)
    derived, _ = stage_options(None, in_place=True, **settings)
    assert (derived.device_iterations, derived.replication_factor, derived.Training.gradient_accumulation) == (4, 2, 2)


def test_prediction_writer_gets_each_host_calls_sample_indices():
    """BasePredictionWriter: batch_indices are the dataset indices of each host call's rows
    (one combined batch), in row order, shuffled loaders included."""
    from lightning.pytorch.callbacks import BasePredictionWriter

    class Writer(BasePredictionWriter):
        def __init__(self):
            super().__init__("batch_and_epoch")
            self.batches, self.epoch_indices = [], None

        def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx,
                               dataloader_idx):
            self.batches.append((list(batch_indices), prediction))

        def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
            self.epoch_indices = batch_indices

    x, y = regression_data(n=40)
    model = Regressor()
    writer = Writer()
    t = trainer(accelerator="ipu", devices=2, strategy=IPUStrategy(device_iterations=4), callbacks=[writer])
    t.predict(model, loader(x, y, batch_size=4, shuffle=True))
    assert [len(indices) for indices, _ in writer.batches] == [32, 8]  # 4 x 2 x 4, then the rest
    seen = [i for indices, _ in writer.batches for i in indices]
    assert sorted(seen) == list(range(40)) and seen != list(range(40))
    for indices, prediction in writer.batches:
        torch.testing.assert_close(prediction, model(x[indices]).detach(), rtol=1e-6, atol=1e-6)
    assert writer.epoch_indices == [[indices for indices, _ in writer.batches]]
