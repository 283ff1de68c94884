"""User ``training_opts`` / ``inference_opts``: the run uses the user's own objects (configured
in place, as Lightning 2.0 did), and ``strategy.replication_factor`` follows the stage."""
import warnings

import pytest
import torch

import poptorch

from helpers.lightning_models import IPUStrategy, Regressor, loader, pl, regression_data, trainer

pytestmark = pytest.mark.usefixtures("one_thread")


class ReplicasPerStage(pl.Callback):
    """``trainer.strategy.replication_factor`` as each stage's batches start."""

    def __init__(self):
        self.seen = set()

    def on_train_batch_start(self, trainer, *args):
        self.seen.add(("train", trainer.strategy.replication_factor))

    def on_validation_batch_start(self, trainer, *args):
        self.seen.add(("validate", trainer.strategy.replication_factor))

    def on_test_batch_start(self, trainer, *args):
        self.seen.add(("test", trainer.strategy.replication_factor))

    def on_predict_batch_start(self, trainer, *args):
        self.seen.add(("predict", trainer.strategy.replication_factor))


def test_user_options_are_the_objects_the_run_uses_and_replicas_follow_the_stage():
    training_opts = poptorch.Options().replicationFactor(8)
    inference_opts = poptorch.Options().replicationFactor(7).autoRoundNumIPUs(True)
    strategy = IPUStrategy(device_iterations=2, training_opts=training_opts, inference_opts=inference_opts)
    probe = ReplicasPerStage()
    run = trainer(accelerator="ipu", devices=1, strategy=strategy, max_epochs=1, callbacks=[probe])
    assert run.strategy.replication_factor == 8  # before the run: the training options'
    x, y = regression_data(n=224)
    model = Regressor()
    run.fit(model, loader(x, y, batch_size=2), loader(x, y, batch_size=2))

    assert run.strategy.training_opts is training_opts and run.strategy.inference_opts is inference_opts
    # configured in place: what the user left unset comes from the strategy
    assert training_opts.device_iterations == 2 and inference_opts.device_iterations == 2
    assert (training_opts.replication_factor, inference_opts.replication_factor) == (8, 7)
    assert probe.seen == {("train", 8), ("validate", 7)}
    assert run.global_step == 224 // (2 * 2 * 8) * 2
    assert run.strategy.replication_factor == 8  # after fit: the training options'

    # frozen by the first run, with nothing left to configure: the same objects again, silently
    with warnings.catch_warnings():
        warnings.filterwarnings("error", ".*is frozen.*")
        run.test(model, loader(x, y, batch_size=2))
        run.predict(model, loader(x, y, batch_size=2))
    assert run.strategy.inference_opts is inference_opts
    assert probe.seen == {("train", 8), ("validate", 7), ("test", 7), ("predict", 7)}


def test_setup_per_trainer_function_reports_the_stage_replicas():
    """Lightning 2.0's check, without running: 8 while training, 7 for every inference stage."""
    from lightning.pytorch.trainer.states import RunningStage, TrainerFn

    training_opts = poptorch.Options().replicationFactor(8)
    inference_opts = poptorch.Options().replicationFactor(7)
    strategy = IPUStrategy(training_opts=training_opts, inference_opts=inference_opts)
    run = trainer(accelerator="ipu", devices=1, strategy=strategy)
    model = Regressor()
    strategy.connect(model)
    model.trainer = run
    run.state.fn = TrainerFn.FITTING
    run.strategy.setup(run)
    run.state.stage = RunningStage.TRAINING
    assert run.strategy.replication_factor == 8
    run.state.stage = RunningStage.VALIDATING
    assert run.strategy.replication_factor == 7
    run.strategy.teardown()
    for fn, stage in ((TrainerFn.VALIDATING, RunningStage.VALIDATING), (TrainerFn.TESTING, RunningStage.TESTING),
                      (TrainerFn.PREDICTING, RunningStage.PREDICTING)):
        run.state.fn, run.state.stage = fn, stage
        run.strategy.setup(run)
        assert run.strategy.replication_factor == 7
        run.strategy.teardown()


def test_frozen_user_options_that_lack_a_setting_run_as_a_copy_with_one_warning():
    """Options a poptorch.DataLoader froze before fit cannot take devices=2: the run uses a copy."""
    training_opts = poptorch.Options().deviceIterations(2)
    x, y = regression_data(n=64)
    poptorch.DataLoader(training_opts, torch.utils.data.TensorDataset(x, y), batch_size=2)  # freezes them
    run = trainer(accelerator="ipu", devices=2, strategy=IPUStrategy(training_opts=training_opts), max_epochs=1)
    with pytest.warns(UserWarning, match=r"IPUStrategy\(training_opts=...\) is frozen .* a copy with "
                                         r"replicationFactor\(2\), broadcastBuffers\(False\)"):
        run.fit(Regressor(), loader(x, y, batch_size=2))
    used = run.strategy.training_opts
    assert used is not training_opts and training_opts.replication_factor == 1
    assert (used.device_iterations, used.replication_factor) == (2, 2)
    assert run.global_step == 64 // 8 * 2


def test_one_object_for_both_stages_with_accumulation_infers_with_a_copy():
    """Graphcore's tutorial passes the same options as training_opts and inference_opts:
    training uses them; inference, which never accumulates, a copy with gradientAccumulation(1)."""
    options = poptorch.Options().deviceIterations(2)
    options.Training.gradientAccumulation(2)
    run = trainer(accelerator="ipu", devices=1, max_epochs=1,
                  strategy=IPUStrategy(training_opts=options, inference_opts=options))
    x, y = regression_data(n=64)
    run.fit(Regressor(), loader(x, y, batch_size=2), loader(x, y, batch_size=2))
    assert run.strategy.training_opts is options and options.Training.gradient_accumulation == 2
    inference = run.strategy.inference_opts
    assert inference is not options
    assert (inference.device_iterations, inference.Training.gradient_accumulation) == (2, 1)
