"""``IPUStrategy``: Lightning's training, validation, test and predict loops on openpop's executor.

What a Lightning batch is
    One item of the (converted) dataloader: a combined batch, one *host call*. Training runs it
    through ``poptorch.trainingModel``: ``device_iterations`` optimizer steps, each over
    ``accumulate_grad_batches x devices`` micro-batches of the loader's ``batch_size``.
    Validation, test and predict run it through ``poptorch.inferenceModel``
    (``device_iterations x devices`` micro-batches). All executors share the LightningModule's
    weights. ``batch_idx``, ``val_check_interval``, ``limit_*_batches`` and ``log_every_n_steps``
    count host calls, as with PopTorch.

What a step is
    An optimizer step. ``trainer.global_step`` grows by ``device_iterations`` per host call and
    ``interval="step"`` LR schedulers step after each optimizer step, so a run with
    ``device_iterations=DI`` equals a CPU run whose batches are DI times smaller (see
    ``optimizer_steps.py``). ``max_steps`` is checked between host calls: set it to a multiple
    of ``device_iterations``.

How ``training_step`` runs
    Per micro-batch, eagerly, inside the executor (``steps.py``); ``self.log`` values are
    reduced over the micro-batches and logged once per host call (``logs.py``). When the
    executor's compiled backend runs the host call, the step is traced into its program
    (``compiled_steps.py``) and the per-step work into the program's inputs (``optimizer_steps.py``). The executor
    back-propagates, reduces gradients (Mean over accumulation and replicas, as DDP with
    gradient accumulation does) and steps the optimizer; Lightning's own backward and optimizer
    step are no-ops (``precision.py``). During the run ``trainer.accumulate_grad_batches`` reads 1
    (the executor accumulates, Lightning must not); it is restored at the end.

Manual optimization (``self.automatic_optimization = False``, any number of optimizers)
    runs the step eagerly on the host, once per device iteration and replica, with Lightning's
    ``manual_backward`` and ``optimizer.step()``; replicas meet as DDP ranks do (gradients
    averaged at each ``manual_backward``, each ``optimizer.step()`` applied once):
    ``manual_optimization.py``.

Outputs
    Training: the step's output structure as the training output mode returns it (default
    ``Final``: the last step), with ``loss`` reduced to a scalar. Inference: every micro-batch's
    outputs concatenated along dim 0 (``OutputMode.All``), e.g. ``predict`` returns one row per
    sample.

Model parallelism
    ``poptorch.BeginBlock`` / ``poptorch.Block`` annotations split the model into pipeline stages
    on virtual IPUs (``devices`` replicas of that). When the default ``PipelinedExecution`` cannot
    pipeline (training needs ``accumulate_grad_batches >= 2 * stages - 1``, inference needs
    ``device_iterations >= stages``) and the options did not choose an execution strategy, the
    model runs with ``ShardedExecution`` (same results) and one warning says how to pipeline.
"""
import time
from typing import Any, Optional

import torch
from typing_extensions import override

from openpop.errors import PipelineDepthError
from openpop.models import inferenceModel, trainingModel
from openpop.options import Options
from openpop.runtime.geometry import BatchGeometry

from . import instances, manual_optimization, messages, run_options, trainer_checks
from ._framework import module, pl
from .accelerator import DEVICE_TYPE
from .data import micro_batch_size, to_openpop_loader
from .logs import StepLogs
from .optimizer_steps import PerStepHooks
from .precision import LBFGS_AUTOMATIC, IPUPrecision
from .stage_runner import STAGE_NAMES, StageRunner
from .steps import StepCall, StepModule, leading_size, lightning_training_output, run_in_chunks

_states = module("trainer.states")
RunningStage, TrainerFn = _states.RunningStage, _states.TrainerFn
MisconfigurationException = module("utilities.exceptions").MisconfigurationException
_rank_zero = module("utilities.rank_zero")

_LOADER_HOOKS = {RunningStage.TRAINING: "train_dataloader", RunningStage.VALIDATING: "val_dataloader",
                 RunningStage.SANITY_CHECKING: "val_dataloader", RunningStage.TESTING: "test_dataloader",
                 RunningStage.PREDICTING: "predict_dataloader"}
_STEP_METHODS = {RunningStage.VALIDATING: "validation_step", RunningStage.SANITY_CHECKING: "validation_step",
                 RunningStage.TESTING: "test_step", RunningStage.PREDICTING: "predict_step"}
_EVALUATION_STAGES = {TrainerFn.VALIDATING: RunningStage.VALIDATING, TrainerFn.TESTING: RunningStage.TESTING,
                      TrainerFn.PREDICTING: RunningStage.PREDICTING}


class IPUStrategy(pl.strategies.ParallelStrategy):
    """Lightning's strategy for ``accelerator="ipu"``: the Trainer's loops on openpop's virtual IPUs.

    One Lightning batch is one host call of ``batch_size x device_iterations x devices x
    accumulate_grad_batches`` samples, and each of its ``device_iterations`` optimizer steps is
    a step in Lightning's sense. ``Trainer(accelerator="ipu", devices=N)`` makes one; pass it
    explicitly to set the arguments below.

    Args:
        accelerator: Lightning's accelerator (default: ``IPUAccelerator``).
        device_iterations (int): Optimizer steps per host call (default 1).
        autoreport (bool): Write a profile of each stage's first host calls (default False).
        autoreport_dir (str): Where (default: the Trainer's ``default_root_dir``).
        parallel_devices (list): Lightning's; the replicas' devices.
        cluster_environment: Lightning's.
        checkpoint_io: Lightning's.
        precision_plugin: Lightning's (default: ``IPUPrecision`` for the Trainer's precision).
        training_opts (poptorch.Options): Options for training; they win over what the Trainer
            implies, which fills in only what they leave unset.
        inference_opts (poptorch.Options): Options for validation, test and predict.

    Raises:
        ValueError: ``device_iterations`` is not an integer of at least 1.
        TypeError: Options that are not ``poptorch.Options``.
    """

    strategy_name = "ipu_strategy"

    def __init__(
        self,
        accelerator=None,
        device_iterations: int = 1,
        autoreport: bool = False,
        autoreport_dir: Optional[str] = None,
        parallel_devices: Optional[list[Any]] = None,
        cluster_environment=None,
        checkpoint_io=None,
        precision_plugin=None,
        training_opts: Optional[Options] = None,
        inference_opts: Optional[Options] = None,
    ) -> None:
        if isinstance(device_iterations, bool) or not isinstance(device_iterations, int) or device_iterations < 1:
            raise ValueError(messages.DEVICE_ITERATIONS.format(value=device_iterations))
        for name, opts in (("training_opts", training_opts), ("inference_opts", inference_opts)):
            if opts is not None and not isinstance(opts, Options):
                raise TypeError(messages.OPTIONS_TYPE.format(name=name, type=type(opts).__name__))
        if parallel_devices is not None:
            parallel_devices = [torch.device(DEVICE_TYPE, d) if isinstance(d, int) else d for d in parallel_devices]
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                         cluster_environment=cluster_environment, checkpoint_io=checkpoint_io,
                         precision_plugin=precision_plugin)
        self.device_iterations = device_iterations
        self.autoreport = autoreport
        self.autoreport_dir = autoreport_dir
        self._options = run_options.StrategyOptions(training_opts, inference_opts)
        self._runners: dict[Any, StageRunner] = {}  # RunningStage -> its runner (built in setup)
        self._step_module: Optional[StepModule] = None
        self._restore_accumulation: Optional[int] = None
        self._warned_sharded = False
        self._manual_instances = None  # GlobalReplication of manual steps under poprun

    @classmethod
    @override
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(cls.strategy_name, cls, description="openpop's IPU strategy", override=True)

    @property
    def poptorch_models(self) -> dict[Any, Any]:
        """``RunningStage`` -> the stage's ``trainingModel`` / ``inferenceModel`` (as in Lightning)."""
        return {stage: runner.executor for stage, runner in self._runners.items() if runner.executor is not None}

    # ------------------------------------------------------------------ Strategy basics
    @property
    @override
    def root_device(self) -> torch.device:
        """Where batches and host-side weights live (the virtual IPUs map onto it)."""
        return torch.device("cpu")

    @override
    def model_to_device(self) -> None:
        if self.lightning_module is not None:
            self.lightning_module.to(self.root_device)

    # Under poprun (or torchrun) each instance is one Lightning process: world_size = instances,
    # global_rank = instance index (Lightning's TorchElasticEnvironment reads them from torchrun's
    # variables); a process's replicas are reduced inside the executor, processes through
    # torch.distributed (instances.py). Alone, these are the one-process answers.
    @property
    @override
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        instances.join(self.world_size)

    @override
    def reduce(self, tensor, group=None, reduce_op="mean"):
        return instances.reduce(tensor, reduce_op)

    @override
    def barrier(self, name: Optional[str] = None) -> None:
        instances.barrier()

    @override
    def broadcast(self, obj, src: int = 0):
        return instances.broadcast(obj, src)

    @override
    def all_gather(self, tensor, group=None, sync_grads: bool = False):
        return instances.all_gather(tensor)

    @property
    @override
    def handles_gradient_accumulation(self) -> bool:
        return True  # accumulate_grad_batches becomes the executor's gradient accumulation

    @property
    @override
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": 1, "rank": 0}

    # ------------------------------------------------------------------ options
    @property
    def replication_factor(self) -> int:
        """The replicas of the current stage (training or inference options), as in Lightning 2.0;
        before the run, what the training options will say."""
        trainer = getattr(self.lightning_module, "_trainer", None) if self.lightning_module is not None else None
        stage = trainer.state.stage if trainer is not None else None
        options = self._options.current(inference=stage is not None and stage != RunningStage.TRAINING)
        return (options if options is not None else self.training_opts).replication_factor

    @property
    def training_opts(self) -> Options:
        """The options training runs with: the user's ``training_opts`` object, configured in
        place (see ``run_options.py``), or openpop's."""
        return self._stage_options(training=True)

    @property
    def inference_opts(self) -> Options:
        """The options validation, test and predict run with (see ``training_opts``)."""
        return self._stage_options(training=False)

    def _stage_options(self, training: bool, in_place: bool = False) -> Options:
        """The run's options of that kind; before the run (or ``in_place`` in ``setup``), derived
        from the user's, the Trainer's and the precision plugin's settings."""
        if not in_place and self._options.of(training) is not None:
            return self._options.of(training)
        trainer = getattr(self.lightning_module, "_trainer", None) if self.lightning_module is not None else None
        accumulation = trainer.accumulate_grad_batches if trainer is not None else 1
        if self._restore_accumulation is not None:  # during the run the Trainer reads 1
            accumulation = self._restore_accumulation
        plugin = self.precision_plugin
        return self._options.derive(
            training=training, in_place=in_place, device_iterations=self.device_iterations,
            replicas=len(self.parallel_devices) if self.parallel_devices else 1, accumulation=accumulation,
            loss_scaling=isinstance(plugin, IPUPrecision) and plugin.wants_loss_scaling)

    # ------------------------------------------------------------------ setup / teardown
    @override
    def setup(self, trainer) -> None:
        lightning_module = self.lightning_module
        trainer_checks.check_accumulation_schedule(trainer)
        if isinstance(self.precision_plugin, IPUPrecision):
            self.precision_plugin.adapt_to_module(lightning_module)
        super().setup(trainer)  # configure_optimizers may read training_opts: they answer without change
        fn = trainer.state.fn
        automatic_training = fn == TrainerFn.FITTING and lightning_module.automatic_optimization
        if automatic_training and isinstance(self.optimizers[0], torch.optim.LBFGS):
            raise MisconfigurationException(LBFGS_AUTOMATIC)
        # From here the executor accumulates; Lightning must see every batch as a full step.
        self._restore_accumulation = trainer.accumulate_grad_batches
        trainer.accumulate_grad_batches = 1
        self._options.training = self._stage_options(training=True, in_place=True)
        self._options.inference = self._stage_options(training=False, in_place=True)
        self._step_module = StepModule(lightning_module)
        if fn == TrainerFn.FITTING:
            training = StageRunner("training", training=True)  # manual optimization: no executor
            if automatic_training:
                training.executor, training.per_step = self._automatic_training(trainer, self.optimizers[0])
            self._runners = {RunningStage.TRAINING: training}
            if trainer.enable_validation:
                validation = StageRunner("validation", training=False,
                                         executor=inferenceModel(self._step_module, self._options.inference))
                self._runners[RunningStage.VALIDATING] = self._runners[RunningStage.SANITY_CHECKING] = validation
            trainer_checks.warn_about_rounded_steps(trainer, self._options.training.device_iterations)
        else:
            stage = _EVALUATION_STAGES[fn]
            self._runners = {stage: StageRunner(STAGE_NAMES[stage], training=False,
                                                executor=inferenceModel(self._step_module, self._options.inference))}
        _rank_zero.rank_zero_info(
            f"IPU available: True (openpop virtual IPUs on {self.root_device.type}), using: "
            f"{self.replication_factor} IPU{'' if self.replication_factor == 1 else 's'}")

    def _automatic_training(self, trainer, optimizer):
        """The training executor and the per-optimizer-step hooks around its host calls."""
        if isinstance(self.precision_plugin, IPUPrecision):
            self.precision_plugin.prepare_optimizer(optimizer, self._options.training)
        executor = trainingModel(self._step_module, self._options.training, optimizer)
        per_step = PerStepHooks(trainer, optimizer, self.precision_plugin, self._options.training.device_iterations,
                                self._options.training.Training.gradient_accumulation,
                                executor.skippedSteps)
        return executor, per_step

    @override
    def teardown(self) -> None:
        for runner in dict.fromkeys(self._runners.values()):  # validation's is also the sanity check's
            runner.close()  # poptorch_models keeps answering with the destroyed executors, as in Lightning
        self._step_module = None
        self._manual_instances = None  # a later fit joins again (its model and optimizers are new)
        if self._restore_accumulation is not None and self.lightning_module is not None:
            self.lightning_module.trainer.accumulate_grad_batches = self._restore_accumulation
            self._restore_accumulation = None
        super().teardown()

    # ------------------------------------------------------------------ data
    @override
    def process_dataloader(self, dataloader):
        stage = self.lightning_module.trainer.state.stage
        training = stage == RunningStage.TRAINING
        options = self._stage_options(training)
        converted = to_openpop_loader(dataloader, options, training, _LOADER_HOOKS.get(stage, "train_dataloader"))
        runner = self._runners.get(stage)
        if runner is not None and not training:
            runner.loader_micro_size = micro_batch_size(converted) or getattr(dataloader, "batch_size", None)
        return converted

    @override
    def batch_to_device(self, batch: Any, device: Optional[torch.device] = None, dataloader_idx: int = 0) -> Any:
        """Float tensors cast to float16 under ``"16-mixed"`` with a ``model.half()`` model (and to
        the dtype of ``"16-true"`` / ``"bf16-true"``), integer ones untouched, as Lightning 2.0's
        IPU strategy did (``IPUPrecision.convert_batch``); then the module's batch transfer hooks,
        onto ``root_device`` (the host: the executor places micro-batches on the virtual IPUs)."""
        plugin = self.precision_plugin
        if isinstance(plugin, IPUPrecision):
            batch = plugin.convert_batch(batch, self.lightning_module)
        return super().batch_to_device(batch, device, dataloader_idx)

    # ------------------------------------------------------------------ stage hooks
    @override
    def on_train_start(self) -> None:
        self._stage_starts(RunningStage.TRAINING)

    @override
    def on_validation_start(self) -> None:
        self._stage_starts(self.lightning_module.trainer.state.stage)

    @override
    def on_test_start(self) -> None:
        self._stage_starts(RunningStage.TESTING)

    @override
    def on_predict_start(self) -> None:
        self._stage_starts(RunningStage.PREDICTING)

    @override
    def on_train_end(self) -> None:
        self._write_profile(RunningStage.TRAINING)

    @override
    def on_validation_end(self) -> None:
        self._write_profile(self.lightning_module.trainer.state.stage)

    @override
    def on_test_end(self) -> None:
        self._write_profile(RunningStage.TESTING)

    @override
    def on_predict_end(self) -> None:
        self._write_profile(RunningStage.PREDICTING)

    # ------------------------------------------------------------------ steps
    @override
    def training_step(self, *args: Any, **kwargs: Any):
        lightning_module = self.lightning_module
        trainer = lightning_module.trainer
        if trainer.accumulate_grad_batches != 1:  # set to 1 in setup: someone changed it since
            raise RuntimeError(trainer_checks.ACCUMULATION_CHANGED)
        if not lightning_module.automatic_optimization:
            return self._manual_training_step(args, kwargs)
        call = self._call("training_step", self._options.training, args, kwargs, training=True)
        call.batch_idx = trainer.fit_loop.epoch_loop.batch_idx
        result = self._host_call(RunningStage.TRAINING, call, args[0])
        return lightning_training_output(call, result)

    @override
    def validation_step(self, *args: Any, **kwargs: Any):
        return self._inference_step(self.lightning_module.trainer.state.stage, args, kwargs)

    @override
    def test_step(self, *args: Any, **kwargs: Any):
        return self._inference_step(RunningStage.TESTING, args, kwargs)

    @override
    def predict_step(self, *args: Any, **kwargs: Any):
        return self._inference_step(RunningStage.PREDICTING, args, kwargs)

    def _call(self, method: str, options: Options, args, kwargs, training: bool) -> StepCall:
        pass_batch_idx = len(args) > 1 and self._step_module.takes_batch_idx(method)
        return StepCall(method, BatchGeometry.from_options(options), args, kwargs, StepLogs(self.lightning_module),
                        self.precision_plugin, training=training, pass_batch_idx=pass_batch_idx)

    def _inference_step(self, stage, args, kwargs):
        call = self._call(_STEP_METHODS[stage], self._options.inference, args, kwargs, training=False)
        batch, runner = args[0], self._runners[stage]
        size = leading_size(batch)
        if not runner.is_incomplete(size, call.geometry.batches_per_call):
            return self._host_call(stage, call, batch)
        # The loader's incomplete last batch: on the host, without recompiling for its shape.
        with self._step_module.running(call):
            result = run_in_chunks(self._step_module, batch, size, runner.host_micro_size(size, call.geometry))
        self._flush_logs(stage, call)
        return result

    def _manual_training_step(self, args, kwargs):
        call = self._call("training_step", self._options.training, args, kwargs, training=False)
        call.batch_idx = self.lightning_module.trainer.fit_loop.epoch_loop.batch_idx
        started = time.perf_counter()
        if self._manual_instances is None and self.world_size > 1:  # under poprun: instance 0's model everywhere
            self._manual_instances = manual_optimization.instances_of(
                self.lightning_module, list(self.optimizers), self.world_size, self.global_rank)
        result = manual_optimization.training_step(
            self._step_module, call, args[0], self._options.training, precision_plugin=self.precision_plugin,
            lightning_optimizers=self._lightning_optimizers,
            schedulers=[config.scheduler for config in self.lightning_module.trainer.lr_scheduler_configs],
            instances=self._manual_instances)
        self._flush_logs(RunningStage.TRAINING, call)
        self._runners[RunningStage.TRAINING].record(time.perf_counter() - started, args[0])
        return result

    @override
    def backward(self, closure_loss, optimizer, *args: Any, **kwargs: Any):
        result = super().backward(closure_loss, optimizer, *args, **kwargs)
        manual_optimization.meet_after_backward(self.lightning_module)
        return result

    @override
    def optimizer_step(self, optimizer, closure, model=None, **kwargs: Any):
        if manual_optimization.in_lockstep():
            return manual_optimization.lockstep_optimizer_step(optimizer, closure)
        return super().optimizer_step(optimizer, closure, model, **kwargs)

    # ------------------------------------------------------------------ host calls
    def _host_call(self, stage, call: StepCall, batch):
        runner = self._runners[stage]
        positions = call.positions()
        with self._step_module.running(call):  # also around the compile pass, whose logs are discarded
            self._compile(runner, batch, positions)
            result, seconds = runner.run(batch, positions, self._step_module)
        self._flush_logs(stage, call)
        runner.record(seconds, batch)
        return result

    def _flush_logs(self, stage, call: StepCall) -> None:
        if stage == RunningStage.PREDICTING:
            call.logs.flush_to_loggers(step=int(call.batch_idx))
        else:
            call.logs.flush()

    def _compile(self, runner: StageRunner, batch, positions) -> None:
        """Compile the runner's executor for this batch. When the default PipelinedExecution
        cannot pipeline the model, ShardedExecution replaces it (with one warning per strategy)."""
        try:
            runner.compile(batch, positions)
        except PipelineDepthError as error:
            options = self._options.of(runner.training)
            if run_options.user_chose_execution_strategy(options):
                raise
            runner.executor = self._sharded(runner, options, error.stages)
            runner.compile(batch, positions)

    def _sharded(self, runner: StageRunner, options: Options, stages: int):
        runner.executor.destroy()
        options, message = run_options.sharded_fallback(options, training=runner.training, stages=stages)
        if not self._warned_sharded:
            self._warned_sharded = True
            _rank_zero.rank_zero_warn(message)
        if runner.training:
            self._options.training = options
            return trainingModel(self._step_module, options, runner.executor.getOptimizer())
        self._options.inference = options
        return inferenceModel(self._step_module, options)

    # ------------------------------------------------------------------ autoreport
    def _stage_starts(self, stage) -> None:
        runner = self._runners.get(stage)
        if runner is None:
            return
        if not runner.training:  # weights may have changed since its last call (training, a checkpoint, user code)
            runner.refresh_weights()
        if self.autoreport:
            runner.start_profile(str(self.autoreport_dir or self.lightning_module.trainer.default_root_dir))

    def _write_profile(self, stage) -> None:
        runner = self._runners.get(stage)
        if runner is None:
            return
        optimizer = self.optimizers[0] if runner.training and self.optimizers else None
        try:
            path = runner.write_profile(self._step_module or self.lightning_module, optimizer)
        except Exception as exc:  # a failed report is a warning: the run's result stands
            _rank_zero.rank_zero_warn(messages.PROFILE_WRITE_FAILED.format(stage=runner.name, reason=exc))
            return
        if path is not None:
            _rank_zero.rank_zero_info(f"openpop profile report written to {path}")
