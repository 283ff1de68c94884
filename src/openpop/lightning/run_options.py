"""The ``poptorch.Options`` each Lightning stage runs with.

What the Trainer and the strategy give a stage's options, for every setting they leave unset:

* ``device_iterations``      <- ``IPUStrategy(device_iterations=...)`` (training and inference)
* ``replication_factor``     <- ``Trainer(devices=...)``
* gradient accumulation      <- ``Trainer(accumulate_grad_batches=...)`` (training only; Lightning
  itself then does not accumulate: the strategy ``handles_gradient_accumulation``)
* automatic loss scaling     <- ``precision="16-mixed"`` (training only, see ``precision.py``)
* ``broadcastBuffers(False)`` with several replicas, so BatchNorm-like models run (each replica
  keeps its own running statistics and the host sees replica 0's, as with DDP)
* ``random_seed``            <- ``seed_everything`` (``PL_GLOBAL_SEED``), recorded without
  re-seeding torch; the compilation progress bar off (Lightning has its own progress display)

User ``training_opts`` / ``inference_opts`` win: every setting they set through a setter (even
to its default value) or changed from the default ``poptorch.Options()`` is kept as given.

Which object runs. As in Lightning 2.0, the strategy runs with the user's own ``Options``
object (``trainer.strategy.training_opts is training_opts``): the settings above are filled in
place, before anything freezes it. Two cases run a copy instead: the object is already frozen
(a ``poptorch.DataLoader`` or an earlier model uses it) and the run needs one of the settings
above that it lacks (one warning names them); or one object is given as both ``training_opts``
and ``inference_opts`` with gradient accumulation, which inference runs with 1 (silently: an
inference model never accumulates).
"""
import os
from typing import Optional

from openpop.enums import AutoStage
from openpop.options import Options
from openpop.strategies import PipelinedExecution, ShardedExecution

from ._framework import module

_rank_zero = module("utilities.rank_zero")

USER_OPTIONS_FROZEN = (
    "IPUStrategy({name}=...) is frozen (a poptorch.DataLoader or a model already uses it), so openpop cannot "
    "configure it in place: the run uses a copy with {changes}. Set these on your options before building a "
    "DataLoader with them, and the run uses your object itself.")
SHARDED_FALLBACK_TRAINING = (
    "The model is split into {fwd} pipeline stages and poptorch.PipelinedExecution needs at least {needed} "
    "micro-batches per optimizer step to train through them, but accumulate_grad_batches is {have}. openpop runs "
    "it with poptorch.ShardedExecution instead (the same results, stages run one after another). To pipeline, "
    "set Trainer(accumulate_grad_batches={needed}) or more.")
SHARDED_FALLBACK_INFERENCE = (
    "The model is split into {fwd} pipeline stages and poptorch.PipelinedExecution needs device_iterations >= "
    "{fwd} for inference, but it is {have}. openpop runs it with poptorch.ShardedExecution instead (the same "
    "results). To pipeline, set IPUStrategy(device_iterations={fwd}) or more.")


class StrategyOptions:
    """An ``IPUStrategy``'s options: the user's ``training_opts`` / ``inference_opts`` and, from
    ``setup``, the ones the run uses (``training`` / ``inference``; a ``ShardedExecution`` copy
    after a pipelining fallback)."""

    def __init__(self, training: Optional[Options], inference: Optional[Options]):
        self.user_training, self.user_inference = training, inference
        self.training: Optional[Options] = None
        self.inference: Optional[Options] = None

    def of(self, training: bool) -> Optional[Options]:
        return self.training if training else self.inference

    def current(self, inference: bool) -> Optional[Options]:
        """The running stage's options, else the other kind's; None before ``setup``."""
        first, second = (self.inference, self.training) if inference else (self.training, self.inference)
        return first if first is not None else second

    def derive(self, *, training: bool, in_place: bool, **settings) -> Options:
        """``stage_options`` for the user's object of that kind (``settings``: its keywords), with
        one warning when a frozen user object runs as a copy."""
        user = self.user_training if training else self.user_inference
        options, changes = stage_options(user, training=training, in_place=in_place, **settings,
                                         shared=not training and user is not None and user is self.user_training)
        if changes:
            _rank_zero.rank_zero_warn(USER_OPTIONS_FROZEN.format(
                name="training_opts" if training else "inference_opts", changes=", ".join(changes)))
        return options


def is_frozen(options: Options) -> bool:
    return bool(options.__dict__.get("_is_frozen", False))


def _unset(group, default_group, name: str) -> bool:
    return not group.explicitlySet(name) and getattr(group, name) == getattr(default_group, name)


def fill_in(options: Options, *, training: bool, device_iterations: int, replicas: int, accumulation: int,
            loss_scaling: bool) -> list[str]:
    """Give ``options`` (not frozen) the settings it leaves unset, in place.

    Returns the changes that alter the run, as the setter calls that made them (for messages)."""
    defaults = Options()
    changes = []

    def change(label: str, setter, value) -> None:
        setter(value)
        changes.append(f"{label}({value!r})")

    if _unset(options, defaults, "device_iterations") and options.device_iterations != device_iterations:
        change("deviceIterations", options.deviceIterations, device_iterations)
    if _unset(options, defaults, "replication_factor") and options.replication_factor != replicas:
        change("replicationFactor", options.replicationFactor, replicas)
    training_group = options.Training
    if training:
        if _unset(training_group, defaults.Training, "gradient_accumulation") \
                and training_group.gradient_accumulation != accumulation:
            change("Training.gradientAccumulation", training_group.gradientAccumulation, accumulation)
        if loss_scaling and not user_set_loss_scaling(options):
            change("Training.setAutomaticLossScaling", training_group.setAutomaticLossScaling, True)
    elif training_group.gradient_accumulation != 1:
        change("Training.gradientAccumulation", training_group.gradientAccumulation, 1)
    if options.replication_factor > 1 and _unset(options, defaults, "broadcast_buffers") \
            and options.broadcast_buffers:
        change("broadcastBuffers", options.broadcastBuffers, False)
    return changes


def fill_in_records(options: Options) -> None:
    """Settings that do not change results: the seed, recorded only, and the progress bar."""
    seed = os.environ.get("PL_GLOBAL_SEED")
    if seed is not None and not options.exists("random_seed"):
        options.createOrSet(random_seed=int(seed))  # not randomSeed(): it would re-seed torch mid-run
    if _unset(options, Options(), "show_compilation_progress_bar"):
        options.showCompilationProgressBar(False)


def stage_options(user: Optional[Options], *, training: bool, device_iterations: int, replicas: int,
                  accumulation: int, loss_scaling: bool, in_place: bool, shared: bool = False):
    """``(options, changes)``: what a stage runs with (see the module docstring).

    ``in_place=False`` never modifies ``user`` (the answer before the run starts); ``shared``:
    ``user`` is also the other stage's options. ``changes`` is non-empty when a frozen user
    object could not take settings the run needs, so a copy with them runs."""
    settings = dict(training=training, device_iterations=device_iterations, replicas=replicas,
                    accumulation=accumulation, loss_scaling=loss_scaling)
    if user is None:
        options = Options()
        fill_in(options, **settings)
        fill_in_records(options)
        return options, []
    if in_place and not shared and not is_frozen(user):
        fill_in(user, **settings)
        fill_in_records(user)
        return user, []
    copy = user.clone()
    changes = fill_in(copy, **settings)
    if not changes:
        return user, []
    fill_in_records(copy)
    return copy, ([] if shared or not in_place else changes)


def user_chose_execution_strategy(options: Options) -> bool:
    """False for the default ``PipelinedExecution()`` (AutoStage.SameAsIpu, no explicit stages)."""
    strategy = options._execution_strategy
    return not (type(strategy) is PipelinedExecution and not strategy.stages
                and strategy.auto_stage == AutoStage.SameAsIpu)


def sharded_fallback(options: Options, *, training: bool, stages: int) -> tuple[Options, str]:
    """A copy of ``options`` with ``ShardedExecution``, for a model of ``stages`` forward stages
    the default ``PipelinedExecution`` cannot pipeline, and the warning that says how to pipeline."""
    options = options.clone()
    options.setExecutionStrategy(ShardedExecution())
    if training:
        have = options.Training.gradient_accumulation
        return options, SHARDED_FALLBACK_TRAINING.format(fwd=stages, needed=2 * stages - 1, have=have)
    return options, SHARDED_FALLBACK_INFERENCE.format(fwd=stages, have=options.device_iterations)


def user_set_loss_scaling(options: Optional[Options]) -> bool:
    if options is None:
        return False
    training = options.Training
    return training.explicitlySet("automaticLossScalingSettings") or \
        training.automaticLossScalingSettings != Options().Training.automaticLossScalingSettings
