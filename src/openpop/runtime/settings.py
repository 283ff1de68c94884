"""``RunSettings``: what the runtime needs from ``poptorch.Options``, read once, typed and frozen;
``executor_options``: the executor's own copy of the options.

The executor builds it from its own (frozen) copy of the options when it is created; the rest
of the runtime reads these fields and never the options' private parts (``_Popart``, the
execution strategy's class).
"""
from dataclasses import dataclass

from .. import errors
from ..enums import ConnectionType, MeanReductionStrategy, OutputMode, ReductionType
from ..ipu_only_settings import log_ipu_only_settings
from .geometry import BatchGeometry


@dataclass(frozen=True)
class RunSettings:
    training: bool
    #: How a host call's combined batch splits into micro-batches.
    geometry: BatchGeometry
    #: The execution strategy (``openpop.strategies``): block -> stage lookups for the plan.
    strategy: object
    #: The strategy pipelines its stages (``PipelinedExecution``, not ``ShardedExecution`` or phased).
    pipelined_strategy: bool
    #: Pipelined training recomputes forward passes in backward (PopART ``autoRecomputation`` != 0).
    recompute: bool
    #: ``Mean`` or ``Sum`` over a step's ``GA x R`` micro-batches (and over processes).
    reduction: ReductionType
    #: How the mean is taken: ``Post`` (after accumulation) or ``Running``.
    mean_strategy: MeanReductionStrategy
    #: Automatic loss scaling (``Training.setAutomaticLossScaling(True)``).
    automatic_loss_scaling: bool
    #: A failed training call leaves weights, optimizer and buffers as before (``transaction.py``).
    rollback_failed_calls: bool
    #: Which outputs a host call returns, and every how many steps for ``EveryN``.
    output_mode: OutputMode
    output_return_period: int
    #: ``Options.anchorTensor``: ``{short name: [long name, mode, period]}``.
    anchored_tensors: dict
    #: Explicit torch devices for the virtual IPUs (``Options.setDeviceMap``); empty: automatic.
    device_map: tuple[str, ...]
    #: Buffers (other than normalisation statistics) must stay equal across replicas.
    broadcast_buffers: bool
    #: Round the IPU count up to a power of two instead of refusing it.
    auto_round_num_ipus: bool
    connection_type: ConnectionType
    show_compilation_progress_bar: bool
    #: Buffers ``copyNamedBuffersToDevice`` may upload.
    updatable_named_buffers: tuple[str, ...]
    #: ``cycleCount()`` is available (PopART ``instrumentWithHardwareCycleCounter``).
    cycle_counter: bool
    #: ``Options.relaxOptimizerAttributesChecks``.
    relax_optimizer_checks: bool
    #: Poplar engine options (PopART ``engineOptions``): ``autoReport.*`` asks for a profile.
    engine_options: dict

    @classmethod
    def from_options(cls, options, training: bool) -> "RunSettings":
        popart = options._Popart.options
        strategy = options._execution_strategy
        recompute_setting = popart.get("autoRecomputation")
        return cls(
            training=training,
            geometry=BatchGeometry.from_options(options),
            strategy=strategy,
            pipelined_strategy=strategy.pipelines,
            recompute=recompute_setting is None or int(recompute_setting) != 0,
            reduction=ReductionType(options.Training.accumulation_and_replication_reduction_type),
            mean_strategy=MeanReductionStrategy(options.Training.meanAccumulationAndReplicationReductionStrategy),
            automatic_loss_scaling=bool(options.Training.automaticLossScalingSettings.get("enabled", False)),
            rollback_failed_calls=bool(options.Training.rollback_failed_calls),
            output_mode=OutputMode(options.output_mode),
            output_return_period=options.output_return_period,
            anchored_tensors=options.anchored_tensors,
            device_map=tuple(options.device_map),
            broadcast_buffers=bool(options.broadcast_buffers),
            auto_round_num_ipus=bool(options.auto_round_num_ipus),
            connection_type=ConnectionType(options.connection_type),
            show_compilation_progress_bar=bool(options.show_compilation_progress_bar),
            updatable_named_buffers=tuple(options.updatable_named_buffers),
            cycle_counter=bool(popart.get("instrumentWithHardwareCycleCounter", False)),
            relax_optimizer_checks=bool(options.relax_optimizer_attributes_checks),
            engine_options=dict(popart.get("engineOptions", {}) or {}),
        )

    @property
    def mean(self) -> bool:
        return self.reduction == ReductionType.Mean

    @property
    def running_mean(self) -> bool:
        return self.mean and self.mean_strategy == MeanReductionStrategy.Running


def executable_cache_path(options):
    """The executable cache directory ``options`` enable (``enableExecutableCaching``, PopART's
    ``cachePath`` with ``enableEngineCaching``), or None."""
    popart = options._Popart.options
    return popart.get("cachePath") if popart.get("enableEngineCaching") else None


def executable_cache_chosen(options) -> bool:
    """Whether ``options`` say where the executable cache is or that there is none
    (``enableExecutableCaching(path or None)``, ``POPTORCH_CACHE_DIR``, PopART's
    ``enableEngineCaching``); otherwise openpop's default cache applies."""
    return "enableEngineCaching" in options._Popart.options


def executor_options(options, training: bool, model, optimizer):
    """The executor's own frozen copy of the user's ``options`` (frozen too, as in use), with the
    defaults a training or inference model implies, and its optimizer (SGD unless given), checked."""
    from .. import optim
    from ..options import Options
    if options is None:
        options = Options()
    if not isinstance(options, Options):
        raise errors.createPoptorchError(errors.OPTIONS_TYPE.format(type=type(options)))
    run_options = options.clone()
    if training:
        if run_options.defaultOutputMode():
            run_options.outputMode(OutputMode.Final)
        if optimizer is None:
            optimizer = optim.SGD(model.parameters(), lr=0.01)
        optim.validate_optimizer(optimizer, bool(run_options.relax_optimizer_attributes_checks))
        optim.checks.check_parameters_belong(optimizer, model)
        if (optim.uses_float16_accumulators(optimizer)
                and run_options.Training.meanAccumulationAndReplicationReductionStrategy
                != MeanReductionStrategy.Running):
            run_options.Training.setMeanAccumulationAndReplicationReductionStrategy(MeanReductionStrategy.Running)
    else:
        if optimizer is not None:
            raise AssertionError(errors.INFERENCE_OPTIMIZER)
        if run_options.defaultOutputMode():
            run_options.outputMode(OutputMode.All)
        if run_options.Training.gradient_accumulation != 1:
            message = errors.INFERENCE_GRAD_ACCUM
            if run_options._execution_strategy.pipelines:
                message += errors.INFERENCE_GRAD_ACCUM_PIPELINE
            raise errors.createPoptorchError(message)
    options._freeze()
    run_options._freeze()
    log_ipu_only_settings(run_options)
    return run_options, optimizer
