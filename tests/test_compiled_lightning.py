"""Lightning's IPUStrategy on the compiled backend: Lightning's per-optimizer-step work (step
LR schedulers, gradient clipping, global_step) and ``self.log`` in ``training_step`` are part of
the compiled program, and a run equals the same run on the eager backend (itself tested
against plain PyTorch); per-step work the program cannot express keeps the executor eager."""
import pytest
import torch

import poptorch

from helpers.lightning_models import IPUStrategy, loader, make_net, pl, regression_data, trainer

pytestmark = pytest.mark.usefixtures("one_thread")


class LoggedRegressor(pl.LightningModule):
    """MSE regression logging its loss (from a helper), a value it does not return, and its batch_idx."""

    def __init__(self, optimizer="sgd", schedule=False):
        super().__init__()
        self.net = make_net()
        self.optimizer_name, self.schedule = optimizer, schedule

    def training_step(self, batch, batch_idx):
        x, y = batch
        prediction = self.net(x)
        loss = self.shared_loss(prediction, y, "train")
        self.log("largest", prediction.abs().max(), reduce_fx="max")
        self.log("batch_idx", torch.as_tensor(batch_idx, dtype=torch.float32), reduce_fx="max")
        return loss

    def shared_loss(self, prediction, y, stage):  # a helper that logs: runs with the logging view as self
        loss = torch.nn.functional.mse_loss(prediction, y)
        self.log(f"{stage}_loss", loss)
        return loss

    def configure_optimizers(self):
        if self.optimizer_name == "adam":
            optimizer = torch.optim.Adam(self.parameters(), lr=0.02)
        else:
            optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        if not self.schedule:
            return optimizer
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
        return [optimizer], [{"scheduler": scheduler, "interval": "step", "frequency": 2}]


class MetricsPerBatch(pl.Callback):
    def __init__(self):
        self.metrics, self.steps = [], []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.metrics.append({k: float(v) for k, v in trainer.callback_metrics.items()})
        self.steps.append(trainer.global_step)


def fit(backend, model, device_iterations=4, devices=1, samples=64, **trainer_args):
    x, y = regression_data(n=samples)
    record = MetricsPerBatch()
    opts = poptorch.Options().openpopBackend(backend, compile_after=0.0)
    t = trainer(accelerator="ipu", devices=devices, max_epochs=1, callbacks=[record],
                strategy=IPUStrategy(device_iterations=device_iterations, training_opts=opts), **trainer_args)
    t.fit(model, loader(x, y, batch_size=4))
    return t, record


def assert_same_run(eager, compiled, steps=(4, 8, 12, 16)):
    """Same weights, global_step after each host call, logged metrics, scheduler and progress."""
    (t_eager, m_eager, r_eager), (t_compiled, m_compiled, r_compiled) = eager, compiled
    for ours, theirs in zip(m_compiled.parameters(), m_eager.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    assert t_compiled.global_step == t_eager.global_step == steps[-1]
    assert r_compiled.steps == r_eager.steps == list(steps)
    assert len(r_compiled.metrics) == len(r_eager.metrics) == 4
    for ours, theirs in zip(r_compiled.metrics, r_eager.metrics):
        assert ours.keys() == theirs.keys()
        for name in ours:
            assert ours[name] == pytest.approx(theirs[name], rel=1e-5, abs=1e-7), name
    for config_c, config_e in zip(t_compiled.lr_scheduler_configs, t_eager.lr_scheduler_configs):
        assert config_c.scheduler.state_dict() == config_e.scheduler.state_dict()
    groups = [t.optimizers[0].param_groups[0]["lr"] for t in (t_compiled, t_eager)]
    assert groups[0] == groups[1]
    progress = [t.fit_loop.epoch_loop.automatic_optimization.optim_progress.optimizer.step.state_dict()
                for t in (t_compiled, t_eager)]
    assert progress[0] == progress[1]


@pytest.mark.slow
@pytest.mark.parametrize("optimizer, clip, algorithm, schedule, geometry", [
    ("sgd", 0.05, "norm", True, {}),
    # 2 replicas x accumulation 2 x DI 2: batch_idx, logs and steps count every micro-batch
    ("adam", 0.01, "value", False, dict(device_iterations=2, devices=2, accumulate_grad_batches=2, samples=128)),
])
def test_compiled_run_equals_eager_with_step_schedulers_clipping_and_logs(optimizer, clip, algorithm, schedule,
                                                                          geometry):
    runs = []
    for backend in ("eager", "compiled"):
        model = LoggedRegressor(optimizer, schedule)
        t, record = fit(backend, model, gradient_clip_val=clip, gradient_clip_algorithm=algorithm, **geometry)
        runs.append((t, model, record))
    # forced compiled raises when it cannot run the model
    assert_same_run(*runs, steps=(2, 4, 6, 8) if geometry else (4, 8, 12, 16))
    assert runs[1][2].metrics[-1].keys() == {"train_loss", "largest", "batch_idx"}
    assert runs[1][2].metrics[-1]["batch_idx"] == 15.0  # the CPU run's index of the last micro-batch


class BranchesOnBatchIdx(LoggedRegressor):
    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        if batch_idx % 2 == 0:  # Python branching on batch_idx: the compiled program cannot
            self.log("even", loss)
        return loss


class CallsSuper(LoggedRegressor):
    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx)


class ReadsGlobalStep(LoggedRegressor):
    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        return loss * 2 if self.global_step < 6 else loss  # changes inside a host call (DI=4)


class ScaledByHook(LoggedRegressor):
    """Reads a Python float a hook changes after every batch: torch.compile re-traces."""

    scale = 1.0

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y) * self.scale

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.scale = self.scale * 0.5


def test_failed_compile_leaves_schedulers_and_counters_for_the_eager_run(warnings_logged):
    eager = fit("eager", BranchesOnBatchIdx(schedule=True))
    model = BranchesOnBatchIdx(schedule=True)
    t, record = fit("auto", model)
    assert_same_run(_as_run(eager), (t, model, record))
    declined = [m for m in warnings_logged() if "compiled backend does not support" in m]
    assert len(declined) == 1 and "torch.compile(fullgraph=True)" in declined[0]


@pytest.mark.parametrize("model_class, reason", [(CallsSuper, "super(type, obj)"),
                                                 (ReadsGlobalStep, "`self.global_step` read inside a step")])
def test_steps_the_program_cannot_run_exactly_run_eagerly(warnings_logged, model_class, reason):
    eager = fit("eager", model_class())
    model = model_class()
    t, record = fit("auto", model)
    assert_same_run(_as_run(eager), (t, model, record))
    declined = [m for m in warnings_logged() if "compiled backend does not support" in m]
    assert len(declined) == 1 and reason in declined[0]


def test_recompile_limit_switches_to_eager_from_the_next_call(warnings_logged):
    eager = fit("eager", ScaledByHook())
    model = ScaledByHook()
    # torch's own patch(): pytest 9.2's monkeypatch undo deletes a torch config entry for good
    with torch._dynamo.config.patch(recompile_limit=1):
        t, record = fit("auto", model)  # call 1 compiled (scale 1), call 2 would re-trace: eager from there
    assert_same_run(_as_run(eager), (t, model, record))
    declined = [m for m in warnings_logged() if "compiled backend does not support" in m]
    assert len(declined) == 1 and "re-traced" in declined[0]


def _as_run(fitted):
    t, record = fitted
    return t, t.lightning_module, record


class ClipsItself(LoggedRegressor):
    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        self.clip_gradients(optimizer, gradient_clip_val=0.01, gradient_clip_algorithm="value")


def test_hooks_between_optimizer_steps_keep_the_executor_eager(warnings_logged):
    eager = fit("eager", ClipsItself())
    model = ClipsItself()
    t, record = fit("auto", model)
    assert_same_run(_as_run(eager), (t, model, record))
    declined = [m for m in warnings_logged() if "compiled backend does not support" in m]
    assert len(declined) == 1 and "ClipsItself.configure_gradient_clipping" in declined[0]


class Evaluated(LoggedRegressor):
    def validation_step(self, batch, batch_idx):
        x, y = batch
        prediction = self.net(x)
        self.log("val_loss", torch.nn.functional.mse_loss(prediction, y))
        self.log("val_max", prediction.max(), reduce_fx="max")
        return prediction


def test_validation_logs_on_the_compiled_backend_equal_eager():
    x, y = regression_data(n=56)  # 3 host calls of 16 samples and a last batch of 8 (run on the host)
    results = []
    for backend in ("eager", "compiled"):
        opts = poptorch.Options().openpopBackend(backend)
        t = trainer(accelerator="ipu", devices=1, strategy=IPUStrategy(device_iterations=4, inference_opts=opts))
        results.append(t.validate(Evaluated(), loader(x, y, batch_size=4), verbose=False)[0])
    assert results[0].keys() == results[1].keys() == {"val_loss", "val_max"}
    for name in results[0]:
        assert results[1][name] == pytest.approx(results[0][name], rel=1e-6), name


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["16-mixed", "bf16-mixed"])
def test_mixed_precision_compiles_and_equals_eager(precision):
    """precision="16-mixed" / "bf16-mixed": the program enters the precision's autocast (and, on a
    CPU whose half matmuls are slow, its float32-compute function mode: a stepwise program) around
    each traced micro-batch, as the eager step enters it; 16-mixed's automatic loss scaling skips the same steps,
    and the step scheduler counts the skipped steps in their place on both backends."""
    runs = []
    for backend in ("eager", "compiled"):
        model = LoggedRegressor(schedule=True)
        t, record = fit(backend, model, precision=precision)
        runs.append((t, model, record))
    assert_same_run(*runs)  # (forced "compiled" raises where it cannot run the model)


class FineTuned(pl.LightningModule):
    """A backbone frozen for the first epoch (Lightning's ``BaseFinetuning``), its parameters in
    the optimizer from the start."""

    def __init__(self):
        super().__init__()
        self.backbone = make_net(hidden=8)[:2]
        self.head = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.head(self.backbone(x)), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


@pytest.mark.slow
def test_fine_tuning_that_unfreezes_a_backbone_compiles_and_equals_eager():
    from lightning.pytorch.callbacks import BaseFinetuning

    class Unfreeze(BaseFinetuning):
        def freeze_before_training(self, pl_module):
            self.freeze(pl_module.backbone)

        def finetune_function(self, pl_module, current_epoch, optimizer):
            if current_epoch == 1:
                self.make_trainable(pl_module.backbone)

    runs = {}
    for backend in ("eager", "compiled"):  # (compiled is forced: a declined program would raise)
        model = FineTuned()
        frozen = [p.detach().clone() for p in model.backbone.parameters()]
        x, y = regression_data(n=32)
        opts = poptorch.Options().openpopBackend(backend, compile_after=0.0)
        t = trainer(accelerator="ipu", devices=1, max_epochs=2, callbacks=[Unfreeze()],
                    strategy=IPUStrategy(device_iterations=4, training_opts=opts))
        t.fit(model, loader(x, y, batch_size=4))
        (executor,) = t.strategy.poptorch_models.values()
        assert executor._dispatch.compiled.last == backend
        assert not all(torch.equal(p, q) for p, q in zip(model.backbone.parameters(), frozen))  # trained in epoch 1
        runs[backend] = [p.detach().clone() for p in model.parameters()], float(t.callback_metrics["train_loss"])
    for ours, theirs in zip(runs["compiled"][0], runs["eager"][0]):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    assert runs["compiled"][1] == pytest.approx(runs["eager"][1], rel=1e-5)
