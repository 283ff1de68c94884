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
    reduced over the micro-batches and logged once per host call (``logs.py``). The executor
    back-propagates, reduces gradients (Mean over accumulation and replicas, as DDP with
    gradient accumulation does) and steps the optimizer; Lightning's own backward and optimizer
    step are no-ops (``precision.py``). During the run ``trainer.accumulate_grad_batches`` reads 1
    (the executor accumulates, Lightning must not); it is restored at the end.

Manual optimization (``self.automatic_optimization = False``, any number of optimizers)
    runs the step eagerly on the host, once per device iteration and replica, with Lightning's
    ``manual_backward`` and ``optimizer.step()``; replicas meet as DDP ranks do (gradients
    averaged at each ``manual_backward``, each ``optimizer.step()`` applied once): ``lockstep.py``.

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
import contextlib
import functools
import os
import re
import time
from typing import Any, Dict, List, Optional

import torch

from openpop import errors as openpop_errors
from openpop.enums import OutputMode
from openpop.models import inferenceModel, trainingModel
from openpop.options import Options
from openpop.runtime.geometry import BatchGeometry
from openpop.runtime.outputs import OutputCollector
from openpop.runtime.plan import PIPELINE_DI, PIPELINE_GA
from openpop.runtime.trace import TraceSession
from openpop.strategies import ShardedExecution

from . import instances, lockstep, run_options
from ._framework import module, pl
from .accelerator import DEVICE_TYPE
from .data import micro_batch_size, to_openpop_loader
from .logs import StepLogs
from .optimizer_steps import PerStepHooks
from .precision import LBFGS_AUTOMATIC, IPUPrecision
from .report import StageProfile
from .steps import (StepCall, StepModule, batch_signature, leading_size, lightning_training_output, run_on_host,
                    split_on_host)

_states = module("trainer.states")
RunningStage, TrainerFn = _states.RunningStage, _states.TrainerFn
MisconfigurationException = module("utilities.exceptions").MisconfigurationException
_signature_utils = module("utilities.signature_utils")
_rank_zero = module("utilities.rank_zero")

ACCUMULATION_CHANGED = ("The `IPUAccelerator` does not support `accumulate_grad_batches` changing between epochs. "
                        "Remove the `GradientAccumulationScheduler` or give it a single value, e.g. "
                        "`Trainer(accumulate_grad_batches=k)`.")
SHARDED_FALLBACK_TRAINING = (
    "The model is split into {fwd} pipeline stages and poptorch.PipelinedExecution needs at least {needed} "
    "micro-batches per optimizer step to train through them, but accumulate_grad_batches is {have}. openpop runs "
    "it with poptorch.ShardedExecution instead (the same results, stages run one after another). To pipeline, "
    "set Trainer(accumulate_grad_batches={needed}) or more.")
SHARDED_FALLBACK_INFERENCE = (
    "The model is split into {fwd} pipeline stages and poptorch.PipelinedExecution needs device_iterations >= "
    "{fwd} for inference, but it is {have}. openpop runs it with poptorch.ShardedExecution instead (the same "
    "results). To pipeline, set IPUStrategy(device_iterations={fwd}) or more.")
CHECKPOINT_EVERY_ROUNDED = (
    "ModelCheckpoint(every_n_train_steps={every}) is not a multiple of device_iterations={di}: global_step "
    "advances by {di} per host call, so only steps that are multiples of both are saved. Use a multiple of {di}.")
USER_OPTIONS_FROZEN = (
    "IPUStrategy({name}=...) is frozen (a poptorch.DataLoader or a model already uses it), so openpop cannot "
    "configure it in place: the run uses a copy with {changes}. Set these on your options before building a "
    "DataLoader with them, and the run uses your object itself.")
MAX_STEPS_ROUNDED = ("Trainer(max_steps={max_steps}) is not a multiple of device_iterations={di}: every host call "
                     "runs {di} optimizer steps, so training stops after {rounded} steps.")
AUTOREPORT_TRACED_CALLS = 2  # host calls per stage recorded into trace.json / report.html
_STAGE_NAMES = {RunningStage.TRAINING: "training", RunningStage.VALIDATING: "validation",
                RunningStage.SANITY_CHECKING: "validation", RunningStage.TESTING: "test",
                RunningStage.PREDICTING: "predict"}
_LOADER_HOOKS = {RunningStage.TRAINING: "train_dataloader", RunningStage.VALIDATING: "val_dataloader",
                 RunningStage.SANITY_CHECKING: "val_dataloader", RunningStage.TESTING: "test_dataloader",
                 RunningStage.PREDICTING: "predict_dataloader"}
_STEP_METHODS = {RunningStage.VALIDATING: "validation_step", RunningStage.SANITY_CHECKING: "validation_step",
                 RunningStage.TESTING: "test_step", RunningStage.PREDICTING: "predict_step"}


class IPUStrategy(pl.strategies.ParallelStrategy):
    """Lightning's loops on openpop's virtual IPUs (see the module docstring)."""

    strategy_name = "ipu_strategy"

    def __init__(
        self,
        accelerator=None,
        device_iterations: int = 1,
        autoreport: bool = False,
        autoreport_dir: Optional[str] = None,
        parallel_devices: Optional[List[Any]] = None,
        cluster_environment=None,
        checkpoint_io=None,
        precision_plugin=None,
        training_opts: Optional[Options] = None,
        inference_opts: Optional[Options] = None,
    ) -> None:
        if isinstance(device_iterations, bool) or not isinstance(device_iterations, int) or device_iterations < 1:
            raise ValueError(f"IPUStrategy(device_iterations={device_iterations!r}): device_iterations is the number "
                             "of optimizer steps (or inference batches) one host call runs and must be an int >= 1.")
        for name, opts in (("training_opts", training_opts), ("inference_opts", inference_opts)):
            if opts is not None and not isinstance(opts, Options):
                raise TypeError(f"IPUStrategy({name}=...) must be a poptorch.Options, not {type(opts).__name__}.")
        if parallel_devices is not None:
            parallel_devices = [torch.device(DEVICE_TYPE, d) if isinstance(d, int) else d for d in parallel_devices]
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                         cluster_environment=cluster_environment, checkpoint_io=checkpoint_io,
                         precision_plugin=precision_plugin)
        self.device_iterations = device_iterations
        self.autoreport = autoreport
        self.autoreport_dir = autoreport_dir
        self._user_training_opts = training_opts
        self._user_inference_opts = inference_opts
        self._training_opts: Optional[Options] = None
        self._inference_opts: Optional[Options] = None
        self.poptorch_models: Dict[Any, Any] = {}
        self._step_module: Optional[StepModule] = None
        self._per_step: Optional[PerStepHooks] = None
        self._restore_accumulation: Optional[int] = None
        self._signatures: Dict[int, Any] = {}
        self._micro_sizes: Dict[int, int] = {}
        self._combined_sizes: Dict[int, int] = {}
        self._takes_batch_idx: Dict[str, bool] = {}
        self._eval_micro: Optional[int] = None  # batch_size of the last evaluation loader converted
        self._profiles: Dict[str, StageProfile] = {}
        self._traces: Dict[str, TraceSession] = {}  # stage name -> torch.profiler trace + HTML report
        self._warned_sharded = False

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(cls.strategy_name, cls, description="openpop's IPU strategy", override=True)

    # ------------------------------------------------------------------ Strategy basics
    @property
    def root_device(self) -> torch.device:
        """Where batches and host-side weights live (the virtual IPUs map onto it)."""
        return torch.device("cpu")

    def model_to_device(self) -> None:
        if self.lightning_module is not None:
            self.lightning_module.to(self.root_device)

    # Under poprun (or torchrun) each instance is one Lightning process: world_size = instances,
    # global_rank = instance index (Lightning's TorchElasticEnvironment reads them from torchrun's
    # variables); a process's replicas are reduced inside the executor, processes through
    # torch.distributed (instances.py). Alone, these are the one-process answers.
    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    def setup_environment(self) -> None:
        super().setup_environment()
        instances.join(self.world_size)

    def reduce(self, tensor, group=None, reduce_op="mean"):
        return instances.reduce(tensor, reduce_op)

    def barrier(self, name: Optional[str] = None) -> None:
        instances.barrier()

    def broadcast(self, obj, src: int = 0):
        return instances.broadcast(obj, src)

    def all_gather(self, tensor, group=None, sync_grads: bool = False):
        return instances.all_gather(tensor)

    @property
    def handles_gradient_accumulation(self) -> bool:
        return True  # accumulate_grad_batches becomes the executor's gradient accumulation

    @property
    def distributed_sampler_kwargs(self) -> Dict[str, Any]:
        return {"num_replicas": 1, "rank": 0}

    # ------------------------------------------------------------------ options
    @property
    def replication_factor(self) -> int:
        """The replicas of the current stage (training or inference options), as in Lightning 2.0;
        before the run, what the options will say."""
        options = self._current_options()
        if options is None:  # before the run: the training options it will have
            options = self.training_opts
        return options.replication_factor

    def _current_options(self) -> Optional[Options]:
        trainer = getattr(self.lightning_module, "_trainer", None) if self.lightning_module is not None else None
        stage = trainer.state.stage if trainer is not None else None
        inference = stage is not None and stage != RunningStage.TRAINING
        first, second = ((self._inference_opts, self._training_opts) if inference
                         else (self._training_opts, self._inference_opts))
        return first if first is not None else second

    @property
    def training_opts(self) -> Options:
        """The options training runs with: the user's ``training_opts`` object, configured in
        place (see ``run_options.py``), or openpop's."""
        if self._training_opts is None:
            return self._stage_options(training=True, in_place=False)
        return self._training_opts

    @property
    def inference_opts(self) -> Options:
        """The options validation, test and predict run with (see ``training_opts``)."""
        if self._inference_opts is None:
            return self._stage_options(training=False, in_place=False)
        return self._inference_opts

    def _stage_options(self, training: bool, in_place: bool) -> Options:
        trainer = getattr(self.lightning_module, "_trainer", None) if self.lightning_module is not None else None
        accumulation = trainer.accumulate_grad_batches if trainer is not None else 1
        if self._restore_accumulation is not None:  # during the run the Trainer reads 1
            accumulation = self._restore_accumulation
        user = self._user_training_opts if training else self._user_inference_opts
        plugin = self.precision_plugin
        options, changes = run_options.stage_options(
            user, training=training, device_iterations=self.device_iterations,
            replicas=len(self.parallel_devices) if self.parallel_devices else 1, accumulation=accumulation,
            loss_scaling=isinstance(plugin, IPUPrecision) and plugin.wants_loss_scaling, in_place=in_place,
            shared=not training and user is not None and user is self._user_training_opts)
        if changes:
            _rank_zero.rank_zero_warn(USER_OPTIONS_FROZEN.format(
                name="training_opts" if training else "inference_opts", changes=", ".join(changes)))
        return options

    # ------------------------------------------------------------------ setup / teardown
    def setup(self, trainer) -> None:
        lightning_module = self.lightning_module
        self._check_configuration(trainer)
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
        self._training_opts = self._stage_options(training=True, in_place=True)
        self._inference_opts = self._stage_options(training=False, in_place=True)
        self._step_module = StepModule(lightning_module)
        self.poptorch_models = {}
        self._signatures, self._micro_sizes, self._combined_sizes, self._profiles = {}, {}, {}, {}
        self._takes_batch_idx = {}
        if fn == TrainerFn.FITTING:
            if automatic_training:
                optimizer = self.optimizers[0]
                if isinstance(self.precision_plugin, IPUPrecision):
                    self.precision_plugin.prepare_optimizer(optimizer, self._training_opts)
                self.poptorch_models[RunningStage.TRAINING] = trainingModel(
                    self._step_module, self._training_opts, optimizer)
                self._per_step = PerStepHooks(trainer, optimizer, self.precision_plugin,
                                              self._training_opts.device_iterations,
                                              self._training_opts.Training.gradient_accumulation)
            if trainer.enable_validation:
                executor = inferenceModel(self._step_module, self._inference_opts)
                self.poptorch_models[RunningStage.VALIDATING] = executor
                self.poptorch_models[RunningStage.SANITY_CHECKING] = executor
            self._warn_max_steps(trainer)
        else:
            stage = {TrainerFn.VALIDATING: RunningStage.VALIDATING, TrainerFn.TESTING: RunningStage.TESTING,
                     TrainerFn.PREDICTING: RunningStage.PREDICTING}[fn]
            self.poptorch_models[stage] = inferenceModel(self._step_module, self._inference_opts)
        _rank_zero.rank_zero_info(
            f"IPU available: True (openpop virtual IPUs on {self.root_device.type}), using: "
            f"{self.replication_factor} IPUs")

    def _check_configuration(self, trainer) -> None:
        callbacks = module("callbacks")
        for callback in trainer.callbacks:
            if isinstance(callback, callbacks.GradientAccumulationScheduler):
                if len(set(callback.scheduling.values())) > 1:
                    raise RuntimeError(ACCUMULATION_CHANGED)

    def _warn_max_steps(self, trainer) -> None:
        di = self._training_opts.device_iterations
        if trainer.max_steps is not None and trainer.max_steps > 0 and trainer.max_steps % di:
            rounded = -(-trainer.max_steps // di) * di
            _rank_zero.rank_zero_warn(MAX_STEPS_ROUNDED.format(max_steps=trainer.max_steps, di=di, rounded=rounded))
        for callback in trainer.checkpoint_callbacks:
            every = getattr(callback, "_every_n_train_steps", 0) or 0
            if every > 0 and every % di:
                _rank_zero.rank_zero_warn(CHECKPOINT_EVERY_ROUNDED.format(every=every, di=di))

    def teardown(self) -> None:
        if self._per_step is not None:
            self._per_step.remove()
            self._per_step = None
        for profile in self._profiles.values():
            profile.unhook()
        for trace in self._traces.values():
            trace.close()
        self._traces = {}
        destroyed = set()
        for executor in self.poptorch_models.values():
            if id(executor) not in destroyed:
                destroyed.add(id(executor))
                executor.destroy()
        self._step_module = None
        if self._restore_accumulation is not None and self.lightning_module is not None:
            self.lightning_module.trainer.accumulate_grad_batches = self._restore_accumulation
            self._restore_accumulation = None
        super().teardown()

    # ------------------------------------------------------------------ data
    def process_dataloader(self, dataloader):
        stage = self.lightning_module.trainer.state.stage
        training = stage == RunningStage.TRAINING
        options = self._training_opts if training else self._inference_opts
        if options is None:
            options = self._stage_options(training=training, in_place=False)
        converted = to_openpop_loader(dataloader, options, training, _LOADER_HOOKS.get(stage, "train_dataloader"))
        if not training:
            self._eval_micro = micro_batch_size(converted) or getattr(dataloader, "batch_size", None)
        return converted

    # ------------------------------------------------------------------ stage hooks
    def on_train_start(self) -> None:
        self._start_profile(RunningStage.TRAINING)

    def on_validation_start(self) -> None:
        stage = self.lightning_module.trainer.state.stage
        self._refresh_weights(stage)
        self._start_profile(stage)

    def on_test_start(self) -> None:
        self._refresh_weights(RunningStage.TESTING)
        self._start_profile(RunningStage.TESTING)

    def on_predict_start(self) -> None:
        self._refresh_weights(RunningStage.PREDICTING)
        self._start_profile(RunningStage.PREDICTING)

    def on_train_end(self) -> None:
        self._write_profile(RunningStage.TRAINING)

    def on_validation_end(self) -> None:
        self._write_profile(self.lightning_module.trainer.state.stage)

    def on_test_end(self) -> None:
        self._write_profile(RunningStage.TESTING)

    def on_predict_end(self) -> None:
        self._write_profile(RunningStage.PREDICTING)

    def _refresh_weights(self, stage) -> None:
        """Weights may have changed outside a training executor (manual optimization, a loaded
        checkpoint, user code): evaluation starts from the host's values."""
        executor = self.poptorch_models.get(stage)
        if executor is not None and executor.isCompiled():
            executor.copyWeightsToDevice()

    # ------------------------------------------------------------------ steps
    def training_step(self, *args: Any, **kwargs: Any):
        lightning_module = self.lightning_module
        trainer = lightning_module.trainer
        if trainer.accumulate_grad_batches != 1:  # set to 1 in setup: someone changed it since
            raise RuntimeError(ACCUMULATION_CHANGED)
        if not lightning_module.automatic_optimization:
            return self._manual_training_step(args, kwargs)
        call = self._call("training_step", self._training_opts, args, kwargs, training=True)
        call.batch_idx = trainer.fit_loop.epoch_loop.batch_idx
        result = self._host_call(RunningStage.TRAINING, call, args[0])
        return lightning_training_output(call, result)

    def validation_step(self, *args: Any, **kwargs: Any):
        return self._inference_step(self.lightning_module.trainer.state.stage, args, kwargs)

    def test_step(self, *args: Any, **kwargs: Any):
        return self._inference_step(RunningStage.TESTING, args, kwargs)

    def predict_step(self, *args: Any, **kwargs: Any):
        return self._inference_step(RunningStage.PREDICTING, args, kwargs)

    def _call(self, method: str, options: Options, args, kwargs, training: bool) -> StepCall:
        takes_batch_idx = self._takes_batch_idx.get(method)
        if takes_batch_idx is None:
            step = getattr(self.lightning_module, method)
            takes_batch_idx = _signature_utils.is_param_in_hook_signature(step, "batch_idx", min_args=2)
            self._takes_batch_idx[method] = takes_batch_idx
        pass_batch_idx = len(args) > 1 and takes_batch_idx
        return StepCall(method, BatchGeometry.from_options(options), args, kwargs, StepLogs(self.lightning_module),
                        self.precision_plugin, training=training, pass_batch_idx=pass_batch_idx)

    def _inference_step(self, stage, args, kwargs):
        method = _STEP_METHODS[stage]
        call = self._call(method, self._inference_opts, args, kwargs, training=False)
        batch = args[0]
        size = leading_size(batch)
        per_call = call.geometry.batches_per_call
        compiled_size = self._combined_sizes.get(id(self.poptorch_models.get(stage)))
        if size is not None and (size % per_call != 0 or (compiled_size is not None and size < compiled_size)):
            # The loader's incomplete last batch: on the host, without recompiling for its shape.
            return self._host_inference(stage, call, batch, size)
        return self._host_call(stage, call, batch)

    def _host_inference(self, stage, call: StepCall, batch, size: int):
        """An incomplete last batch: run it on the host in micro-batches of the loader's size."""
        executor = self.poptorch_models.get(stage)
        micro = self._micro_sizes.get(id(executor)) or self._eval_micro or max(1, size // call.geometry.batches_per_call)
        chunks = [_slice(batch, start, min(start + micro, size)) for start in range(0, size, micro)]
        collector = OutputCollector(OutputMode.All, 1, BatchGeometry(device_iterations=len(chunks)))
        self._step_module.call = call
        try:
            with call.logs.installed():
                for position, chunk in enumerate(chunks):
                    collector.add(0, self._step_module(chunk, torch.tensor([position], dtype=torch.int32)))
        finally:
            self._step_module.call = None
        self._flush_logs(stage, call)
        return collector.result()

    def _manual_training_step(self, args, kwargs):
        """Manual optimization: the step runs on the host once per device iteration (and replica,
        replicas in lockstep as DDP ranks: ``lockstep.py``)."""
        options = self._training_opts
        call = self._call("training_step", options, args, kwargs, training=False)
        call.batch_idx = self.lightning_module.trainer.fit_loop.epoch_loop.batch_idx
        geometry = call.geometry
        batch = args[0]
        for path, tensor in _tensors(batch):
            geometry.check_divisible(path, tensor)
        mode = OutputMode.Final if options.defaultOutputMode() else OutputMode(options.output_mode)
        self._step_module.call = call
        started = time.perf_counter()
        try:
            with call.logs.installed():
                if geometry.replication_factor == 1:
                    result = run_on_host(self._step_module, call, batch, geometry, mode, options.output_return_period)
                else:
                    result = self._manual_replicas(call, batch, geometry, mode, options.output_return_period)
        finally:
            self._step_module.call = None
        self._flush_logs(RunningStage.TRAINING, call)
        self._record(RunningStage.TRAINING, None, time.perf_counter() - started, batch)
        return result

    def _manual_replicas(self, call: StepCall, batch, geometry: BatchGeometry, mode, period):
        lightning_module = self.lightning_module
        collector = OutputCollector(mode, period, geometry)
        micro_batches = dict(split_on_host(batch, geometry))
        replicas = geometry.replication_factor

        def apply_step(optimizer):
            self.precision_plugin._after_closure(lightning_module, optimizer)
            optimizer.step()

        saved = [(lo, lo._on_before_step, lo._on_after_step) for lo in self._lightning_optimizers]
        for lo, before, after in saved:  # Lightning counts each step once, not once per replica
            lo._on_before_step = _first_replica_only(before)
            lo._on_after_step = _first_replica_only(after)
        # One shared scheduler stands for every replica's copy (each DDP rank steps its own once).
        schedulers = [config.scheduler for config in self.lightning_module.trainer.lr_scheduler_configs]
        for scheduler in schedulers:
            scheduler.step = _first_replica_only(scheduler.step)
        try:
            for d in range(geometry.device_iterations):
                positions = [geometry.input_position(m) for m in geometry.micro_batches(steps=d, replicas=replicas)]
                steps = [functools.partial(self._step_module, micro_batches[p], torch.tensor([p], dtype=torch.int32))
                         for p in positions]
                outputs = lockstep.Lockstep(lightning_module, replicas).run(steps, apply_step)
                if collector.wants(d, 0):
                    for r, output in enumerate(outputs):
                        collector.add(r, output)
        finally:
            for lo, before, after in saved:
                lo._on_before_step, lo._on_after_step = before, after
            for scheduler in schedulers:
                del scheduler.step  # back to the class's method
        return collector.result()

    def backward(self, closure_loss, optimizer, *args: Any, **kwargs: Any):
        result = super().backward(closure_loss, optimizer, *args, **kwargs)
        replicas = lockstep.current()
        if replicas is not None:
            replicas.meet("backward")  # DDP's gradient all-reduce
        return result

    def optimizer_step(self, optimizer, closure, model=None, **kwargs: Any):
        replicas = lockstep.current()
        if replicas is None:
            return super().optimizer_step(optimizer, closure, model, **kwargs)
        result = closure()
        replicas.meet("step", optimizer)  # applied once, with the averaged gradients
        return result

    # ------------------------------------------------------------------ host calls
    def _host_call(self, stage, call: StepCall, batch):
        step_module = self._step_module
        step_module.call = call
        positions = call.positions()
        try:
            with call.logs.installed():  # also around the compile pass, whose logs are discarded
                executor = self._compiled_executor(stage, batch, positions)
                profile = self._profiles.get(_STAGE_NAMES[stage])
                if profile is not None:
                    profile.hook_blocks(executor, self._step_module)
                per_step = self._per_step if stage == RunningStage.TRAINING else None
                started = time.perf_counter()
                with per_step.host_call() if per_step is not None else contextlib.nullcontext():
                    result = executor(batch, positions)
                seconds = time.perf_counter() - started
        finally:
            step_module.call = None
        self._flush_logs(stage, call)
        self._record(stage, executor, seconds, batch)
        return result

    def _flush_logs(self, stage, call: StepCall) -> None:
        if stage == RunningStage.PREDICTING:
            call.logs.flush_to_loggers(step=int(call.batch_idx))
        else:
            call.logs.flush()

    def _compiled_executor(self, stage, batch, positions):
        """The stage's executor, compiled for this batch's structure and shapes.

        New shapes compile again (PopTorch would refuse). When the default PipelinedExecution
        cannot pipeline this model, it is replaced by ShardedExecution (once, with a warning)."""
        executor = self.poptorch_models[stage]
        signature = batch_signature(batch)
        if executor.isCompiled() and self._signatures.get(id(executor)) == signature:
            return executor
        if executor.isCompiled():
            executor.destroy()
        try:
            executor.compile(batch, positions)
        except openpop_errors.Error as error:
            fwd = _unmet_pipelining(error)
            training = stage == RunningStage.TRAINING
            options = self._training_opts if training else self._inference_opts
            if fwd is None or run_options.user_chose_execution_strategy(options):
                raise
            executor = self._sharded(stage, executor, training, fwd)
            executor.compile(batch, positions)
        self._signatures[id(executor)] = signature
        size = leading_size(batch)
        if size is not None:
            self._micro_sizes[id(executor)] = size // BatchGeometry.from_options(executor.options).batches_per_call
            self._combined_sizes[id(executor)] = size
        return executor

    def _sharded(self, stage, executor, training: bool, fwd: int):
        executor.destroy()
        options = (self._training_opts if training else self._inference_opts).clone()
        options.setExecutionStrategy(ShardedExecution())
        if not self._warned_sharded:
            self._warned_sharded = True
            if training:
                have = options.Training.gradient_accumulation
                message = SHARDED_FALLBACK_TRAINING.format(fwd=fwd, needed=2 * fwd - 1, have=have)
            else:
                message = SHARDED_FALLBACK_INFERENCE.format(fwd=fwd, have=options.device_iterations)
            _rank_zero.rank_zero_warn(message)
        if training:
            self._training_opts = options
            replacement = trainingModel(self._step_module, options, executor._optimizer)
        else:
            self._inference_opts = options
            replacement = inferenceModel(self._step_module, options)
        for key, value in list(self.poptorch_models.items()):
            if value is executor:
                self.poptorch_models[key] = replacement
        return replacement

    # ------------------------------------------------------------------ autoreport
    def _start_profile(self, stage) -> None:
        if not self.autoreport:
            return
        name = _STAGE_NAMES[stage]
        if name not in self._profiles:
            directory = self.autoreport_dir or self.lightning_module.trainer.default_root_dir
            self._profiles[name] = StageProfile(name, str(directory))
            self._traces[name] = TraceSession(  # the stage's first host calls, next to profile.json
                os.path.join(str(directory), name), calls=range(AUTOREPORT_TRACED_CALLS),
                accepts=lambda executor, stage=stage: executor is self.poptorch_models.get(stage))

    def _record(self, stage, executor, seconds: float, batch) -> None:
        profile = self._profiles.get(_STAGE_NAMES[stage])
        if profile is not None:
            profile.record_call(executor, seconds, leading_size(batch) or 0)

    def _write_profile(self, stage) -> None:
        trace = self._traces.pop(_STAGE_NAMES.get(stage), None)
        if trace is not None:
            trace.close()
        profile = self._profiles.get(_STAGE_NAMES.get(stage))
        if profile is None:
            return
        executor = self.poptorch_models.get(stage)
        optimizer = self.optimizers[0] if stage == RunningStage.TRAINING and self.optimizers else None
        path = profile.write(executor, self._step_module or self.lightning_module, optimizer)
        if path is not None:
            _rank_zero.rank_zero_info(f"openpop profile report written to {path}")


def _first_replica_only(function):
    def wrapped(*args, **kwargs):
        if lockstep.replica() == 0:
            return function(*args, **kwargs)
        return None
    return wrapped


def _unmet_pipelining(error) -> Optional[int]:
    """The forward stage count if ``error`` is PopTorch's "cannot pipeline" error, else None."""
    text = str(error)
    if PIPELINE_GA.split("(")[0] in text:
        match = re.search(r"model with (\d+) pipeline stages", text)
        return int(match.group(1)) if match else None
    if PIPELINE_DI.split("(")[0] in text:
        match = re.search(r"pipeline stages \((\d+)\)", text)
        return int(match.group(1)) if match else None
    return None


def _slice(batch, start: int, stop: int):
    from torch.utils import _pytree as pytree
    leaves, spec = pytree.tree_flatten(batch)
    return pytree.tree_unflatten([leaf[start:stop] if isinstance(leaf, torch.Tensor) and leaf.dim() > 0 else leaf
                                  for leaf in leaves], spec)


def _tensors(batch):
    from torch.utils import _pytree as pytree
    leaves, _ = pytree.tree_flatten(batch)
    return [(f"batch[{i}]", leaf) for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
