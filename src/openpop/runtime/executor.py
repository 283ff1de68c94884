"""``PoplarExecutor``: one host call runs device_iterations optimizer steps (training) or
device_iterations batches (inference), each over gradient_accumulation x replicas micro-batches,
then returns the outputs chosen by the output mode.

Local replicas that share replica 0's devices run one after another on its weights, so their
gradient all-reduce is exact: the same sum as accumulating over ``GA * R`` micro-batches.
Replicas the device map puts on other devices (several GPUs) get their own weights there
(``replicas.py``): gradients are summed onto replica 0, which steps and broadcasts.
"""
import contextlib
import copy
import datetime
import inspect
import time

import torch

from .. import errors
from ..atomic_file import atomic_write
from ..enums import ConnectionType, MeanReductionStrategy, OutputMode
from ..log import logger
from . import context, trace
from .anchors import AnchoredTensors
from .args import BoundInputs, CallerTensors, InputSignature, prepare_tensors
from .geometry import BatchGeometry
from .gradients import GradientReduction
from .devices import DevicePlacement, SameDeviceOps, reset_boundary_frames, resolve_device_map
from .distributed_reduce import GlobalReplication
from .losses import LossTracker
from .precision import RunPrecision
from .progress import CompilationProgress
from .pipeline import (ConcurrentMicroBatches, DeviceLocks, Recomputation, concurrency_wanted,
                       recomputation_enabled)
from .replicas import ReplicaModels
from .transaction import HostCallRollback
from .plan import BlockRecorder, build_plan
from .outputs import OutputCollector, flatten_output
from .weights import (BufferSnapshot, CopiedWeights, NormStatistics, ReplicaBuffers, SharedWeights,
                      bump_weights_version, registered_tensors, weights_version)
from .wrapping import training_wrapper_of, unwrap, wrap


def _optim():
    from .. import optim  # the optimizers import the runtime's helpers lazily; avoid a cycle
    return optim


class _Compiled:
    """What the compile pass learnt about the model; dropped by ``destroy()``."""

    def __init__(self):
        self.signature = None
        self.loss_index = None        # position of the loss among the flattened outputs
        self.track_losses = False     # the loss is not returned as-is: find it on every call
        self.training_flags = []      # (module, mode) as they were when compiled
        self.weights = None
        self.replica_buffers = None
        self.compile_seconds = 0.0
        self.uploaded_version = 0
        self.optimizer_snapshot = None  # constant optimizer attributes as compiled
        self.plan = None                # blocks -> stages -> IPUs (plan.py)
        self.placement = None           # set when virtual IPUs live on non-host devices
        self.concurrent = False         # micro-batches overlap across devices
        self.thread_pool = None         # workers for concurrent micro-batches
        self.device_locks = None        # pipeline.DeviceLocks while micro-batches run concurrently
        self.replicas = None            # ReplicaModels when local replicas have their own devices
        self.anchors = None             # AnchoredTensors (Options.anchorTensor)
        self.multi_device = False       # the plan spans several torch devices
        self.trainable = []             # parameters that receive gradients
        self.recompute = False          # checkpoint BeginBlock modules in backward
        self.global_replication = None  # distributed_reduce.GlobalReplication with several processes
        self.rollback = None            # transaction.HostCallRollback (training)


class PoplarExecutor:
    """Runs a ``torch.nn.Module`` with PopTorch's execution semantics."""

    def __init__(self, model, options, training: bool, poptorch_version: str, optimizer=None,
                 user_model=None):
        from ..options import Options
        if options is None:
            options = Options()
        if not isinstance(options, Options):
            raise errors.createPoptorchError(
                f"Invalid type: 'options' is of type {type(options)} (Expected poptorch.Options)")
        run_options = options.clone()
        if training:
            if run_options.defaultOutputMode():
                run_options.outputMode(OutputMode.Final)
            if optimizer is None:
                optimizer = _optim().SGD(model.parameters(), lr=0.01)
            _optim().validate_optimizer(optimizer, _relaxed_checks(run_options))
            _optim().checks.check_parameters_belong(optimizer, model)
            if (_optim().uses_float16_accumulators(optimizer)
                    and run_options.Training.meanAccumulationAndReplicationReductionStrategy
                    != MeanReductionStrategy.Running):
                run_options.Training.setMeanAccumulationAndReplicationReductionStrategy(
                    MeanReductionStrategy.Running)
        else:
            assert optimizer is None, "An inference model cannot have an optimizer"
            if run_options.defaultOutputMode():
                run_options.outputMode(OutputMode.All)
            if run_options.Training.gradient_accumulation != 1:
                message = errors.INFERENCE_GRAD_ACCUM
                if type(run_options._execution_strategy).__name__ == "PipelinedExecution":
                    message += errors.INFERENCE_GRAD_ACCUM_PIPELINE
                raise errors.createPoptorchError(message)
        options._freeze()
        run_options._freeze()

        self._user_model = user_model if user_model is not None else model
        self._model = model
        self._options = run_options
        self._training = training
        self._optimizer = optimizer
        self._geometry = BatchGeometry.from_options(run_options)
        self._poptorch_version = poptorch_version
        self._compiled = None
        self._attached = False
        self._warned = set()
        self._signature = inspect.signature(model.forward)
        self._perf = {"input": [], "input_complete": [], "output": [], "output_complete": []}
        self._precision = RunPrecision(run_options)
        self._last_run_seconds = None
        if training:
            wrap(self._user_model, self)

    # ------------------------------------------------------------------ properties
    @property
    def model(self):
        return self._user_model

    @property
    def options(self):
        return self._options

    @property
    def training(self) -> bool:
        return self._training

    def __getattr__(self, name):
        # Only reached for names the executor itself does not define.
        if name.startswith("__") or name in ("_user_model", "_model"):
            raise AttributeError(name)
        return getattr(self._user_model, name)

    def __repr__(self):
        from ..ops import module_repr
        return module_repr(self._user_model)

    # ------------------------------------------------------------------ compile
    def isCompiled(self) -> bool:
        return self._compiled is not None

    def compile(self, *args, **kwargs) -> None:
        if self._compiled is not None:
            logger.warning(errors.COMPILE_IGNORED)
            return
        inputs = BoundInputs(self._signature, args, kwargs)
        prepare_tensors(inputs, self._warned)
        self._compile(inputs)

    def _compile(self, inputs: BoundInputs) -> None:
        from ..ops import run_post_compile_hooks, run_pre_compile_hooks
        self._check_batch_dims(inputs)
        if self._training:
            self._claim_model()
        started = time.perf_counter()
        run_pre_compile_hooks()
        bar = self._progress_bar()
        compiled = _Compiled()
        if self._training:
            compiled.weights = SharedWeights(self._model)
        else:
            compiled.weights = CopiedWeights(self._model, torch.device("cpu"))
            compiled.uploaded_version = weights_version(self._user_model)
        self._trace(inputs, compiled)
        with compiled.weights.active():
            compiled.anchors = AnchoredTensors(self._options.anchored_tensors, self._model,
                                               self._options.output_mode, self._options.output_return_period,
                                               self._training)
            self._place(compiled)
        compiled.signature = InputSignature(inputs)
        compiled.training_flags = [(m, m.training) for m in self._model.modules()]
        compiled.trainable = [p for p in self._model.parameters() if p.requires_grad]
        if self._training:
            compiled.optimizer_snapshot = _optim().snapshot(self._optimizer, **self._snapshot_options())
            # Global replication (distributed_reduce.py): same model everywhere, instance 0's weights.
            compiled.global_replication = GlobalReplication.from_options(self._options)
            if compiled.global_replication is not None:
                compiled.global_replication.join(self._model, self._optimizer)
        if bar is not None:
            bar.finish()
        run_post_compile_hooks()
        compiled.compile_seconds = time.perf_counter() - started
        self._compiled = compiled
        self._attached = True

    def _claim_model(self) -> None:
        """A destroyed training executor that runs again wraps its model again, unless another
        training executor has wrapped it meanwhile."""
        wrapper = training_wrapper_of(self._user_model)
        if wrapper is None:
            wrap(self._user_model, self)
        elif wrapper is not self:
            raise RuntimeError(errors.ALREADY_WRAPPED)

    def _progress_bar(self):
        return CompilationProgress() if self._options.show_compilation_progress_bar else None

    def _check_batch_dims(self, inputs: BoundInputs) -> None:
        for name, value in inputs.arguments.items():
            for path, tensor in _named_tensors(name, value):
                self._geometry.check_divisible(path, tensor)

    def _trace(self, inputs: BoundInputs, compiled: _Compiled) -> None:
        """Run one micro-batch to discover the loss and check the model, leaving no trace:
        weights, buffers, the RNG and the caller's tensors are as before."""
        geometry = self._geometry
        leaves = list(inputs.leaves)
        for pos in inputs.tensor_positions:
            tensor = leaves[pos]
            micro = tensor if tensor.dim() == 0 else geometry.split(tensor)[0, 0, 0]
            leaves[pos] = micro.clone()
        args, kwargs = inputs.rebuild(leaves)
        rng = torch.random.get_rng_state()
        with compiled.weights.active():
            snapshot = BufferSnapshot(compiled.weights.buffers())
            params_before, buffers_before = registered_tensors(self._model)
            tracker = LossTracker() if self._training else None
            recorder = BlockRecorder(self._model)
            statistics = NormStatistics()
            try:
                with context.running(self._training, tracing=True) as ctx, \
                        torch.set_grad_enabled(self._training), statistics:
                    ctx.block_recorder = recorder
                    ctx.checkpoints = recorder.checkpoints
                    with self._precision.forward(self._model, tracing=True):
                        if tracker is not None:
                            ctx.loss_tracker = tracker
                            with tracker:
                                output = self._model(*args, **kwargs)
                        else:
                            output = self._model(*args, **kwargs)
                params_after, buffers_after = registered_tensors(self._model)
                # Normalisation kernels do not bump their statistics' versions: the record tells.
                norm_statistics = {id(b) for b in statistics.of(self._model)}
                other_buffers_mutated = any(id(b) not in norm_statistics for b in snapshot.mutated())
            finally:
                recorder.close()
                snapshot.restore()
                torch.random.set_rng_state(rng)
        compiled.plan = build_plan(recorder, self._options._execution_strategy, self._options, self._training)
        _check_registered_unchanged(params_before, params_after, "Parameter")
        _check_registered_unchanged(buffers_before, buffers_after, "Buffer")
        if (norm_statistics or other_buffers_mutated) and geometry.replication_factor > 1:
            # Normalisation statistics may always differ between replicas, as on PopTorch.
            if self._options.broadcast_buffers and other_buffers_mutated:
                raise errors.createPoptorchError(errors.BROADCAST_BUFFERS)
            compiled.replica_buffers = ReplicaBuffers(compiled.weights.buffers(),
                                                      geometry.replication_factor)
        if tracker is not None:
            loss = tracker.final_loss()
            flat, _ = flatten_output(output)
            index = next((i for i, leaf in enumerate(flat) if leaf is loss), None)
            compiled.loss_index = index
            compiled.track_losses = index is None

    def _place(self, compiled: _Compiled) -> None:
        """Map the plan's virtual IPUs to devices, log the allocation, place the weights."""
        plan = compiled.plan
        device_map = resolve_device_map(plan.ipus_per_replica, self._geometry.replication_factor,
                                        self._options.device_map)
        plan.device_map = device_map
        if len(plan.blocks) > 1:
            logger.info("\n%s", plan.allocation_table())
        compiled.recompute = self._training and plan.pipelined and recomputation_enabled(self._options)
        replicas = self._geometry.replication_factor
        replicas_apart = replicas > 1 and not device_map.replicas_share_devices()
        compiled.concurrent = ((plan.pipelined or replicas_apart)
                               and concurrency_wanted(len(device_map.all_devices())))
        compiled.multi_device = any(len(device_map.distinct_devices(r)) > 1 for r in range(replicas))
        if device_map.is_host_only and not (compiled.multi_device or compiled.concurrent or replicas_apart):
            return
        ipu_of_module = {}
        for block in plan.blocks:
            for name in block.modules:
                ipu_of_module.setdefault(name, block.ipu)

        def device_of_module(replica, name):
            while name not in ipu_of_module and "." in name:
                name = name.rsplit(".", 1)[0]
            return device_map.device(ipu_of_module.get(name, 0), replica)

        if replicas_apart:
            # Copied while the model is still on the host: no second copy on replica 0's devices.
            compiled.replicas = ReplicaModels(self._model, replicas, device_of_module)
            compiled.replica_buffers = None  # each replica keeps its own buffers
        compiled.placement = DevicePlacement(self._model, lambda name: device_of_module(0, name))
        compiled.placement.place()
        if compiled.concurrent:
            compiled.device_locks = DeviceLocks()
        self._move_optimizer_state()

    def _move_optimizer_state(self) -> None:
        """Optimizer state follows its parameter's device."""
        if self._optimizer is None:
            return
        for param, state in self._optimizer.state.items():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.dim() > 0 and value.device != param.device:
                    state[key] = value.to(param.device)

    # ------------------------------------------------------------------ running
    def __call__(self, *args, **kwargs):
        if self._options.connection_type == ConnectionType.Never:
            raise AssertionError(errors.OFFLINE_CALL)
        inputs = BoundInputs(self._signature, args, kwargs)
        callers = prepare_tensors(inputs, self._warned)
        if self._compiled is None:
            self._compile(inputs)
        else:
            self._compiled.signature.check(inputs)
        if not self._attached:
            self.attachToDevice()
        compiled = self._compiled
        if compiled.placement is not None and compiled.replicas is None:
            # (With replicas apart, each micro-batch goes to its replica's device as it enters.)
            self._move_inputs_to_first_device(inputs, compiled.placement.device_of_module(""), callers)
        if not self._training and weights_version(self._user_model) != compiled.uploaded_version:
            self._upload_weights()
        # The model runs in the train/eval mode it was compiled in, as a compiled graph would.
        changed = [(module, module.training) for module, mode in compiled.training_flags
                   if module.training != mode]
        for module, _ in changed:
            module.training = not module.training
        if compiled.replicas is not None:
            compiled.replicas.sync_attributes()
        started = time.perf_counter()
        same_device = SameDeviceOps() if compiled.multi_device else contextlib.nullcontext()
        host_call = self._host_call(compiled) if self._training else contextlib.nullcontext()
        try:
            if compiled.placement is not None:
                compiled.placement.install_hooks(compiled.device_locks)
            if compiled.replicas is not None:
                compiled.replicas.install_hooks(compiled.device_locks)
            with host_call, compiled.weights.active(), context.running(self._training), \
                    self._recomputation(compiled), same_device, self._precision.running(self._model):
                if self._training:
                    result = self._run_training(inputs, compiled, host_call)
                else:
                    with torch.no_grad():
                        result = self._run_inference(inputs, compiled)
        finally:
            for module, mode in changed:
                module.training = mode
            if compiled.placement is not None:
                compiled.placement.remove_hooks()
                reset_boundary_frames()
            if compiled.replicas is not None:
                compiled.replicas.remove_hooks()
            if self._training:
                # Even a failed call may have stepped the optimizer: sharing models must re-sync.
                bump_weights_version(self._user_model)
        self._last_run_seconds = time.perf_counter() - started
        callers.write_back()
        return result

    def _host_call(self, compiled: _Compiled):
        """A training call is all or nothing: rolled back if it raises (transaction.py)."""
        if compiled.rollback is None:
            compiled.rollback = HostCallRollback(
                self._options.Training.rollback_failed_calls, steps=self._geometry.device_iterations,
                models=compiled.replicas.models if compiled.replicas is not None else [self._model],
                trainable=compiled.trainable, replica_buffers=compiled.replica_buffers,
                loss_scaler=self._precision.dynamic, generators=self._precision.generators,
                devices=compiled.plan.device_map.all_devices())
        return compiled.rollback.call(self._optimizer)

    def _recomputation(self, compiled: _Compiled):
        """Checkpointing of every replica's recomputation units for one host call."""
        if not compiled.recompute:
            return contextlib.nullcontext()
        models = compiled.replicas.models if compiled.replicas is not None else [self._model]
        with contextlib.ExitStack() as stack:  # unwinds what was entered if one fails
            for model in models:
                stack.enter_context(Recomputation(model, compiled.plan.recomputation_units, compiled.device_locks,
                                                  gpu=not compiled.plan.device_map.is_host_only))
            return stack.pop_all()

    def _replica_model(self, compiled: _Compiled, replica: int):
        return self._model if compiled.replicas is None else compiled.replicas.model(replica)

    @staticmethod
    def _move_inputs_to_first_device(inputs: BoundInputs, device, callers: CallerTensors):
        """One host-to-device copy of the combined batch per call, not one per micro-batch."""
        for pos in inputs.tensor_positions:
            tensor = inputs.leaves[pos]
            if tensor.device != device:
                on_device = tensor.to(device, non_blocking=device.type == "cuda")
                callers.replaced(pos, tensor, on_device)
                inputs.leaves[pos] = on_device

    def _micro_batches(self, inputs: BoundInputs):
        """Per input leaf, a ``[DI, GA, R_in, micro, ...]`` view (or the 0-d value itself)."""
        split = []
        for pos in inputs.tensor_positions:
            tensor = inputs.leaves[pos]
            split.append((pos, tensor if tensor.dim() == 0 else self._geometry.split(tensor)))
        return split

    def _micro_args(self, inputs, split, leaves, d, g, chunk):
        for pos, view in split:
            leaves[pos] = view if view.dim() == 0 else view[d, g, chunk]
        return inputs.rebuild(leaves)

    @trace.host_call
    def _run_inference(self, inputs: BoundInputs, compiled: _Compiled):
        geometry = self._geometry
        collector = OutputCollector(self._options.output_mode, self._options.output_return_period, geometry)
        split = self._micro_batches(inputs)
        leaves = list(inputs.leaves)
        replicas = geometry.replication_factor
        perf = _PerfRecorder()
        anchors = compiled.anchors
        anchors.start_call()
        for d in range(geometry.device_iterations):
            perf.start()
            keep = collector.wants(d, 0)
            for r in range(replicas):
                if compiled.replica_buffers is not None:
                    compiled.replica_buffers.switch_to(r)
                args, kwargs = self._micro_args(inputs, split, leaves, d, 0, geometry.input_chunk_of_replica(r))
                model = self._replica_model(compiled, r)
                with self._precision.forward(model), trace.span("forward"):
                    output = model(*args, **kwargs)
                if keep:
                    collector.add(r, output)
            if anchors:
                self._record_anchors(compiled, d)
            perf.computed()
        if compiled.replica_buffers is not None:
            compiled.replica_buffers.switch_to(0)
        anchors.finish_call()
        with trace.span("output_collection"):
            result = collector.result()
        self._perf = perf.finish()
        return result

    @trace.host_call
    def _run_training(self, inputs: BoundInputs, compiled: _Compiled, host_call):
        geometry = self._geometry
        optimizer = self._optimizer
        collector = OutputCollector(self._options.output_mode, self._options.output_return_period, geometry)
        split = self._micro_batches(inputs)
        leaves = list(inputs.leaves)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        trainable = compiled.trainable
        gradients = GradientReduction(self._options, geometry, params, _optim().loss_scaling_of(optimizer),
                                      dynamic=self._precision.loss_scaler(optimizer))
        replicas = geometry.replication_factor
        perf = _PerfRecorder()
        anchors = compiled.anchors
        anchors.start_call()
        for d in range(geometry.device_iterations):
            perf.start()
            for p in trainable:
                p.grad = None
            gradients.start_step()
            if compiled.global_replication is not None:  # may overlap the all-reduce with the last backward
                compiled.global_replication.start_step(trainable, geometry.micro_batches_per_step, overlap=(
                    compiled.replicas is None and not (compiled.concurrent and compiled.replica_buffers is None)))
            if compiled.replicas is not None:
                compiled.replicas.broadcast()  # replica 0's weights as they are now, host edits included
                compiled.replicas.zero_grad()
            if compiled.concurrent and compiled.replica_buffers is None:
                self._concurrent_micro_batches(compiled, inputs, split, d, gradients, collector)
            else:
                # Replicas with their own weights accumulate their own gradients: no running mean
                # over all of them, so their micro-batches take the order-free backward.
                backward = gradients.backward if compiled.replicas is None else gradients.backward_unordered
                for g in range(geometry.gradient_accumulation):
                    keep = collector.wants(d, g)
                    for r in range(replicas):
                        if compiled.replica_buffers is not None:
                            compiled.replica_buffers.switch_to(r)
                        chunk = geometry.input_chunk_of_replica(r)
                        args, kwargs = self._micro_args(inputs, split, leaves, d, g, chunk)
                        with trace.span("forward"):
                            output, loss = self._forward_with_loss(compiled, args, kwargs, self._replica_model(compiled, r))
                        with trace.span("backward"):
                            backward(loss)
                        if keep:
                            collector.add(r, output)
            if compiled.replicas is not None:
                compiled.replicas.reduce_gradients()
            if compiled.global_replication is not None:  # all-reduce with the other processes' replicas
                compiled.global_replication.all_reduce(trainable)
            with trace.span("gradient_reduction"):
                apply = gradients.finish_step()
            if apply:
                with trace.span("optimizer_step"):
                    host_call.update(d, self._precision.optimizer_step, optimizer)
            if anchors:
                self._record_anchors(compiled, d)
            perf.computed()
        for p in trainable:
            p.grad = None
        if compiled.replica_buffers is not None:
            compiled.replica_buffers.switch_to(0)
        anchors.finish_call()
        with trace.span("output_collection"):
            result = collector.result()
        self._perf = perf.finish()
        return result

    def _concurrent_micro_batches(self, compiled, inputs, split, d, gradients, collector):
        """One step's micro-batches with up to ``pipeline_stages`` per replica device set in
        flight (several devices)."""
        geometry = self._geometry
        order = [(g, r) for g in range(geometry.gradient_accumulation) for r in range(geometry.replication_factor)]
        multi_device = compiled.multi_device
        locks = compiled.device_locks
        visits = [compiled.plan.device_visits(r) for r in range(geometry.replication_factor)]
        locks.start_step([visits[r] for _, r in order])
        own_weights = compiled.replicas is not None
        trained = gradients.leaves_of(compiled.replicas.models if own_weights else [self._model])

        def task(index):
            g, r = order[index]
            try:
                locks.begin_micro_batch(index)
                leaves = list(inputs.leaves)
                args, kwargs = self._micro_args(inputs, split, leaves, d, g, geometry.input_chunk_of_replica(r))
                # Torch function modes are per thread: enter SameDeviceOps here, not only in __call__.
                same_device = SameDeviceOps() if multi_device else contextlib.nullcontext()
                with context.running(self._training), same_device:
                    with trace.span("forward"):
                        output, loss = self._forward_with_loss(compiled, args, kwargs, self._replica_model(compiled, r))
                    locks.end_micro_batch()  # the forward is done: later micro-batches may pass
                    with trace.span("backward"):
                        gradients.backward_in_order(loss, index, trained[r if own_weights else 0], own_weights)
            finally:
                # A forward abandoned part-way (its hooks removed under it) must not keep a lock.
                locks.release_all()
                reset_boundary_frames()
                gradients.release_turn(index)
            return output

        if compiled.thread_pool is None:
            replica_sets = geometry.replication_factor if compiled.replicas is not None else 1
            compiled.thread_pool = ConcurrentMicroBatches(compiled.plan.pipeline_stages * replica_sets)
        outputs = compiled.thread_pool.run(len(order), task)
        for (g, r), output in zip(order, outputs):
            if collector.wants(d, g):
                collector.add(r, output)

    def _record_anchors(self, compiled: _Compiled, step: int) -> None:
        if compiled.replica_buffers is not None:
            compiled.replica_buffers.switch_to(0)  # anchored buffers are replica 0's, as the host's
        compiled.anchors.record(step, self._geometry.device_iterations)

    def _forward_with_loss(self, compiled: _Compiled, args, kwargs, model):
        if not compiled.track_losses:
            with self._precision.forward(model):
                output = model(*args, **kwargs)
            return output, flatten_output(output)[0][compiled.loss_index]
        tracker = LossTracker()
        context.current().loss_tracker = tracker
        with self._precision.forward(model), tracker:
            output = model(*args, **kwargs)
        return output, tracker.final_loss()

    # ------------------------------------------------------------------ weights
    def _require_compiled(self):
        if self._compiled is None:
            raise errors.createPoptorchError(errors.NO_EXECUTABLE)

    def copyWeightsToHost(self) -> None:
        self._require_compiled()
        self._compiled.weights.download()

    def copyWeightsToDevice(self) -> None:
        self._require_compiled()
        self._upload_weights()

    def _upload_weights(self) -> None:
        """Host weights to the device copies, and on to every replica with its own devices."""
        compiled = self._compiled
        compiled.weights.upload()
        compiled.uploaded_version = weights_version(self._user_model)
        if compiled.replicas is not None:
            with compiled.weights.active():
                compiled.replicas.broadcast(buffers=True)

    def copyWeightsToHostIfNeeded(self) -> bool:
        """With shared weights the host is never stale; copied weights change only by training."""
        return False

    def copyNamedBuffersToDevice(self) -> None:
        names = self._options.updatable_named_buffers
        if not names:
            raise errors.createPoptorchError(errors.NO_UPDATABLE_BUFFERS)
        self._require_compiled()
        buffers = dict(self._model.named_buffers(remove_duplicate=False))
        unknown = [name for name in names if name not in buffers]
        if unknown:
            raise errors.createPoptorchError(errors.UNKNOWN_UPDATABLE_BUFFERS.format(
                unknown=", ".join(unknown), buffers=", ".join(buffers) or "none"))
        weights = self._compiled.weights
        if not weights.shares_host_tensors:
            weights.upload_buffers(names)
        if self._compiled.replicas is not None:
            with weights.active():
                self._compiled.replicas.broadcast(buffers=True)

    def load_state_dict(self, state_dict, strict: bool = True):
        result = self._user_model.load_state_dict(state_dict, strict=strict)
        if self._compiled is not None and self._attached:
            self.copyWeightsToDevice()
        return result

    # ------------------------------------------------------------------ optimizer
    def setOptimizer(self, optimizer: torch.optim.Optimizer) -> None:
        assert self._training, "setOptimizer is only available on a training model"
        optim = _optim()
        optim.validate_optimizer(optimizer, _relaxed_checks(self._options))
        optim.checks.check_parameters_belong(optimizer, self._model)
        if (self._compiled is not None and optim.uses_float16_accumulators(optimizer)
                and self._options.Training.meanAccumulationAndReplicationReductionStrategy
                != MeanReductionStrategy.Running):
            raise ValueError(
                "Invalid optimizer: the new optimizer would require changing "
                "options.Training.meanAccumulationAndReplicationReductionStrategy to "
                "poptorch.MeanReductionStrategy.Running but the executable is already compiled.")
        if self._compiled is not None:
            changes = optim.constant_attribute_changes(self._compiled.optimizer_snapshot, optimizer)
            if changes:
                raise optim.constant_attribute_error(changes)
        if optimizer is not self._optimizer and not optimizer.state:
            # A fresh optimizer object keeps the state the model has accumulated so far.
            for param, state in self._optimizer.state.items():
                optimizer.state[param] = state
        self._optimizer = optimizer

    def _snapshot_options(self):
        automatic = self._options.Training.automaticLossScalingSettings.get("enabled", False)
        return {"force_variable": ["loss_scaling"] if automatic else ()}

    # ------------------------------------------------------------------ device
    def isAttachedToDevice(self) -> bool:
        return self._attached

    def detachFromDevice(self) -> None:
        self._require_compiled()
        if not self._attached:
            raise errors.createPoptorchError(errors.NOT_ATTACHED)
        if self._training:
            self._compiled.weights.download()
            if self._compiled.placement is not None:
                self._compiled.placement.restore()
                self._move_optimizer_state()
        if self._compiled.replicas is not None:
            self._compiled.replicas.release()
        self._attached = False

    def attachToDevice(self) -> None:
        self._require_compiled()
        assert self._options.connection_type != ConnectionType.Never, \
            "Trying to attach to an offline device (ConnectionType.Never)"
        if self._attached:
            raise errors.createPoptorchError(errors.ALREADY_ATTACHED)
        if self._training and self._compiled.placement is not None:
            self._compiled.placement.place()
            self._move_optimizer_state()
        if self._compiled.replicas is not None:
            self._compiled.replicas.place()
        self._upload_weights()
        self._attached = True

    def destroy(self) -> None:
        if self._compiled is not None and self._training:
            self._compiled.weights.download()
            if self._compiled.placement is not None:
                self._compiled.placement.restore()
                self._move_optimizer_state()
        if self._compiled is not None and self._compiled.thread_pool is not None:
            self._compiled.thread_pool.shutdown()
        self._compiled = None
        self._attached = False
        if self._training:
            unwrap(self._user_model, self)

    # ------------------------------------------------------------------ export
    def compileAndExport(self, filename: str, *args, export_model: bool = True, **kwargs) -> None:
        """Compile for these inputs, then ``save`` (openpop has no separate executable to export)."""
        if self._compiled is None:
            self.compile(*args, **kwargs)
        self.save(filename, export_model=export_model)

    def save(self, filename: str, export_model: bool = True, save_rng_state: bool = True) -> None:
        """Write what ``poptorch.load`` needs to rebuild this executor: options, the model (its
        structure and weights) with its optimizer, and the RNG state. Written atomically."""
        self._require_compiled()
        if self._training:
            self._compiled.weights.download()
        saved = {
            "format": SAVED_EXECUTOR_FORMAT,
            "poptorch_version": self._poptorch_version,
            "training": self._training,
            "options": self._options,
            "model": self._user_model if export_model else None,
            "optimizer": self._optimizer if export_model else None,
            "rng_state": self.rng_state if save_rng_state else None,
        }
        atomic_write(filename, lambda stream: torch.save(saved, stream))

    def loadExecutable(self, filename: str) -> None:
        """Adopt a file written by ``save``: its RNG state (openpop recompiles on demand)."""
        saved = read_saved_executor(filename, self._poptorch_version)
        if saved["training"] != self._training:
            kind = "training" if saved["training"] else "inference"
            raise errors.createPoptorchError(
                f"{filename} holds a {kind} model: load it into a matching poptorch model.")
        if saved["rng_state"] is not None:
            torch.random.set_rng_state(torch.tensor(saved["rng_state"][1:], dtype=torch.uint8))

    # ------------------------------------------------------------------ introspection
    def compilationTime(self) -> datetime.timedelta:
        if self._compiled is None:
            raise errors.createPoptorchError(errors.COMPILE_TIME_NOT_COMPILED)
        if not self._options.show_compilation_progress_bar:
            raise errors.createPoptorchError(errors.COMPILE_TIME_NO_BAR)
        return datetime.timedelta(seconds=self._compiled.compile_seconds)

    def compileSeconds(self):
        """openpop extension: seconds the compile pass took (None before compile); unlike
        ``compilationTime()`` it does not need the progress bar option."""
        return None if self._compiled is None else self._compiled.compile_seconds

    def executionPlan(self):
        """openpop extension: the ``ExecutionPlan`` (blocks, stages, IPUs, devices) built at
        compile, or None before compile."""
        return None if self._compiled is None else self._compiled.plan

    def cycleCount(self) -> int:
        """Wall time of the last host call in cycles of a 1.85 GHz IPU clock (there is no IPU)."""
        if not self._options._Popart.options.get("instrumentWithHardwareCycleCounter", False):
            raise errors.createPoptorchError(errors.CYCLE_COUNT_DISABLED)
        if self._last_run_seconds is None:
            raise errors.createPoptorchError(errors.CYCLE_COUNT_NOT_RUN)
        return int(self._last_run_seconds * 1.85e9)

    def getPerfCounters(self):
        """Per-step timestamps (seconds since the epoch) of the last host call, by input tensor."""
        return copy.deepcopy(self._perf)

    def _latency(self, start_key, end_key):
        starts = self._perf[start_key][0] if self._perf[start_key] else []
        ends = self._perf[end_key][0] if self._perf[end_key] else []
        durations = [e - s for s, e in zip(starts, ends)]
        if not durations:
            return (0.0, 0.0, 0.0)
        return (min(durations), max(durations), sum(durations) / len(durations))

    def getHostIpuLatency(self):
        return self._latency("input", "input_complete")

    def getComputeLatency(self):
        return self._latency("input_complete", "output")

    def getIpuHostLatency(self):
        return self._latency("output", "output_complete")

    def getLatency(self):
        return self._latency("input", "output_complete")

    def getAnchoredTensor(self, short_name: str):
        """The tensor anchored as ``short_name`` (``Options.anchorTensor``) by the last call."""
        memory = self._compiled.anchors.memory if self._compiled is not None else {}
        assert short_name in memory, "No tensor with name " + short_name + " found."
        return memory[short_name]

    def getTensorNames(self):
        self._require_compiled()
        params, buffers = registered_tensors(self._user_model)
        return list(params) + list(buffers)

    @property
    def rng_state(self):
        self._require_compiled()
        return [torch.initial_seed()] + torch.random.get_rng_state().tolist()

    @rng_state.setter
    def rng_state(self, state):
        self._require_compiled()
        torch.random.set_rng_state(torch.tensor(state[1:], dtype=torch.uint8))


SAVED_EXECUTOR_FORMAT = "openpop-executor-1"


def read_saved_executor(filename: str, poptorch_version: str) -> dict:
    """Read a file written by ``PoplarExecutor.save``, checking it is one."""
    try:
        saved = torch.load(filename, weights_only=False)
    except FileNotFoundError:
        raise
    except Exception as exc:  # torch raises several types for foreign or corrupt files
        raise errors.createPoptorchError(f"{filename} is not a file saved by poptorch: {exc}") from exc
    if not isinstance(saved, dict) or saved.get("format") != SAVED_EXECUTOR_FORMAT:
        raise errors.createPoptorchError(f"{filename} is not a file saved by openpop's PoplarExecutor.save().")
    if saved["poptorch_version"] != poptorch_version:
        raise errors.createPoptorchError(
            f"PopTorch version mismatch: {filename} was saved by {saved['poptorch_version']} and this is "
            f"{poptorch_version}. Save it again with this version.")
    return saved


class _PerfRecorder:
    """Timestamps per device iteration: input start/complete, output start/complete."""

    def __init__(self):
        self.starts = []
        self.computed_at = []

    def start(self):
        self.starts.append(time.time())

    def computed(self):
        self.computed_at.append(time.time())

    def finish(self):
        done = time.time()
        return {"input": [list(self.starts)], "input_complete": [list(self.starts)],
                "output": [list(self.computed_at)], "output_complete": [[done] * len(self.starts)]}


def _relaxed_checks(options) -> bool:
    return bool(options.relax_optimizer_attributes_checks)


def _named_tensors(name, value):
    if isinstance(value, torch.Tensor):
        yield name, value
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _named_tensors(f"{name}[{index}]", item)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _named_tensors(f"{name}[{key!r}]", item)


def _check_registered_unchanged(before, after, kind):
    for name, tensor in before.items():
        if name not in after:
            text = errors.BUFFER_REMOVED if kind == "Buffer" else errors.PARAMETER_REMOVED
            raise errors.createPoptorchError(text.format(name=name))
        if after[name] is not tensor:
            text = errors.BUFFER_REASSIGNED if kind == "Buffer" else errors.PARAMETER_REASSIGNED
            raise errors.createPoptorchError(text.format(name=name))
