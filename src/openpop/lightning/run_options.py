"""The ``poptorch.Options`` each Lightning stage runs with.

Derived from the Trainer and the strategy:

* ``device_iterations``      <- ``IPUStrategy(device_iterations=...)`` (training and inference)
* ``replication_factor``     <- ``Trainer(devices=...)``
* gradient accumulation      <- ``Trainer(accumulate_grad_batches=...)`` (training only; Lightning
  itself then does not accumulate: the strategy ``handles_gradient_accumulation``)
* ``random_seed``            <- ``seed_everything`` (``PL_GLOBAL_SEED``), recorded without
  re-seeding torch
* ``broadcastBuffers(False)`` so BatchNorm-like models run with several replicas (each replica
  keeps its own running statistics and the host sees replica 0's, as with DDP)

User ``training_opts`` / ``inference_opts`` win: every setting they set through a setter (even
to its default value) or changed from the default ``poptorch.Options()`` is kept as given. Inference never accumulates gradients, so a shared
options object with ``gradientAccumulation(k)`` is used with 1 for inference.
"""
import os
from typing import Optional

from openpop.enums import AutoStage
from openpop.options import Options
from openpop.strategies import PipelinedExecution


def derive(user: Optional[Options], *, training: bool, device_iterations: int, replicas: int,
           accumulation: int) -> Options:
    defaults = Options()
    options = user.clone() if user is not None else Options()

    def unset(group, default_group, name):
        return not group.explicitlySet(name) and getattr(group, name) == getattr(default_group, name)

    if unset(options, defaults, "device_iterations"):
        options.deviceIterations(device_iterations)
    if unset(options, defaults, "replication_factor"):
        options.replicationFactor(replicas)
    if training:
        if unset(options.Training, defaults.Training, "gradient_accumulation"):
            options.Training.gradientAccumulation(accumulation)
    elif options.Training.gradient_accumulation != 1:
        options.Training.gradientAccumulation(1)
    if unset(options, defaults, "broadcast_buffers"):
        options.broadcastBuffers(False)
    seed = os.environ.get("PL_GLOBAL_SEED")
    if seed is not None and not options.exists("random_seed"):
        options.createOrSet(random_seed=int(seed))  # not randomSeed(): it would re-seed torch mid-run
    if user is None or options.show_compilation_progress_bar == defaults.show_compilation_progress_bar:
        options.showCompilationProgressBar(False)  # Lightning has its own progress display
    return options


def user_chose_execution_strategy(options: Options) -> bool:
    """False for the default ``PipelinedExecution()`` (AutoStage.SameAsIpu, no explicit stages)."""
    strategy = options._execution_strategy
    return not (type(strategy) is PipelinedExecution and not strategy.stages
                and strategy.auto_stage == AutoStage.SameAsIpu)


def user_set_loss_scaling(options: Optional[Options]) -> bool:
    if options is None:
        return False
    return options.Training.automaticLossScalingSettings != Options().Training.automaticLossScalingSettings
