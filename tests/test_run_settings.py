"""RunSettings.from_options: every field the runtime reads, from the options that set it."""
import dataclasses

import pytest

import poptorch
from openpop.runtime.settings import RunSettings


def test_defaults():
    settings = RunSettings.from_options(poptorch.Options(), training=True)
    assert settings.training
    assert settings.pipelined_strategy  # PipelinedExecution (AutoStage.SameAsIpu) by default
    assert settings.recompute
    assert settings.mean and not settings.running_mean
    assert settings.reduction == poptorch.ReductionType.Mean
    assert settings.mean_strategy == poptorch.MeanReductionStrategy.Post
    assert not settings.automatic_loss_scaling
    assert settings.rollback_failed_calls
    assert settings.output_mode == poptorch.OutputMode.Default
    assert settings.device_map == ()
    assert settings.broadcast_buffers
    assert settings.connection_type == poptorch.ConnectionType.Always
    assert not settings.cycle_counter
    assert settings.engine_options == {}
    assert settings.geometry.micro_batches_per_step == 1


def test_every_option_reaches_its_field():
    opts = poptorch.Options().deviceIterations(3).replicationFactor(2)
    opts.Training.gradientAccumulation(4)
    opts.Training.accumulationAndReplicationReductionType(poptorch.ReductionType.Sum)
    opts.Training.setMeanAccumulationAndReplicationReductionStrategy(poptorch.MeanReductionStrategy.Running)
    opts.Training.setAutomaticLossScaling(True)
    opts.outputMode(poptorch.OutputMode.EveryN, 3)
    opts.broadcastBuffers(False)
    opts.setExecutionStrategy(poptorch.ShardedExecution())
    opts._Popart.set("autoRecomputation", 0)
    opts._Popart.set("instrumentWithHardwareCycleCounter", True)
    opts._Popart.set("engineOptions", {"autoReport.directory": "report"})
    opts.connectionType(poptorch.ConnectionType.OnDemand)
    opts.showCompilationProgressBar(False)
    settings = RunSettings.from_options(opts, training=False)
    assert not settings.training
    assert (settings.geometry.device_iterations, settings.geometry.gradient_accumulation,
            settings.geometry.replication_factor) == (3, 4, 2)
    assert settings.reduction == poptorch.ReductionType.Sum and not settings.mean and not settings.running_mean
    assert settings.mean_strategy == poptorch.MeanReductionStrategy.Running
    assert settings.automatic_loss_scaling
    assert (settings.output_mode, settings.output_return_period) == (poptorch.OutputMode.EveryN, 3)
    assert not settings.broadcast_buffers
    assert not settings.pipelined_strategy  # ShardedExecution runs its stages one after the other
    assert isinstance(settings.strategy, poptorch.ShardedExecution)
    assert not settings.recompute
    assert settings.cycle_counter
    assert settings.engine_options == {"autoReport.directory": "report"}
    assert settings.connection_type == poptorch.ConnectionType.OnDemand
    assert not settings.show_compilation_progress_bar


def test_settings_are_frozen():
    settings = RunSettings.from_options(poptorch.Options(), training=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.recompute = False


@pytest.mark.parametrize("strategy, pipelines", [
    (poptorch.PipelinedExecution(), True),
    (poptorch.ShardedExecution(), False),
    (poptorch.SerialPhasedExecution("0"), False),
])
def test_strategies_say_whether_they_pipeline(strategy, pipelines):
    assert strategy.pipelines is pipelines
