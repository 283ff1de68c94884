"""``PoplarExecutor``: PopTorch's model wrapper. One host call runs ``device_iterations``
optimizer steps (training) or batches (inference), each over ``gradient_accumulation x replicas``
micro-batches, then returns the outputs chosen by the output mode.

Compiling (the first call) traces one micro-batch into an ``Executable`` (``executable.py``)
and opens a ``DeviceSession`` (``session.py``: placement, replicas, locks). Each host call then
goes to ``dispatch.py``, which runs it on a backend (``backend_contract.py``): the eager one
(``eager.py``: the schedule runs each step's micro-batches, a ``GradientReduction`` turns their
gradients into the step's, the optimizer applies it) or the compiled one (``compiled/``), which
see the executor only through a read-only ``CallView`` (``call_view.py``).
"""
import inspect
import time

import torch

from .. import errors
from ..enums import ConnectionType, MeanReductionStrategy
from ..log import logger
from . import messages
from .anchors import AnchoredTensors
from .args import BoundInputs, InputSignature, prepare_tensors
from .backend_contract import DECLINED
from .call_view import CallView
from .compile_cache import CompileCache
from .compiled.onednn_matmuls import setting_from_env as gemm_setting_from_env
from .compiled.passes import disabled as disabled_passes
from .dispatch import Dispatch
from .distributed_reduce import GlobalReplication, check_job_replicas
from .executable import Executable, trace_model
from .executor_timings import ExecutorTimings
from .executor_weights import ExecutorWeights
from .host_memory import retain_freed_memory, setting_from_env
from .precision import RunPrecision
from .progress import CompilationProgress
from .saved import read_saved_executor, write_saved_executor
from .schedules import schedule_for
from .session import DeviceSession, move_optimizer_state
from .settings import RunSettings, executor_options
from .weights import CopiedWeights, SharedWeights, registered_tensors
from .wrapping import training_wrapper_of, unwrap, wrap


def _optim():
    from .. import optim  # openpop.optim imports the runtime (optimizer checks): import it when used
    return optim


class PoplarExecutor(ExecutorWeights, ExecutorTimings):
    """Runs a ``torch.nn.Module`` with PopTorch's execution semantics."""

    def __init__(self, model, options, training: bool, poptorch_version: str, optimizer=None,
                 user_model=None):
        host_memory = setting_from_env()  # (OPENPOP_HOST_MEMORY: a bad value fails before the options freeze)
        gemm_setting_from_env()  # (OPENPOP_CPU_GEMM, the compiled backend's: likewise)
        disabled_passes()  # (OPENPOP_DISABLE_PASSES: an unknown pass name, likewise)
        run_options, optimizer = executor_options(options, training, model, optimizer)
        compile_cache = CompileCache.from_options(run_options)  # an unusable cache dir fails here, early
        self._user_model = user_model if user_model is not None else model
        self._model = model
        self._options = run_options
        self._settings = RunSettings.from_options(run_options, training)
        self._training = training
        self._optimizer = optimizer
        self._geometry = self._settings.geometry
        self._poptorch_version = poptorch_version
        self._executable = None  # Executable, once compiled
        self._session = None     # DeviceSession, once compiled
        self._schedule = None
        self._processes = None   # GlobalReplication or SingleProcess (training), once compiled
        self._warned = set()
        self._signature = inspect.signature(model.forward)
        self._precision = RunPrecision(run_options)
        self._dispatch = Dispatch(run_options)
        self._view = CallView(self)  # what the backends see of this executor
        self._compile_seconds = 0.0
        self._optimizer_snapshot = None  # constant optimizer attributes as compiled (training)
        self._compile_cache = compile_cache  # for compile_cache_for() around torch.compile
        if training:
            wrap(self._user_model, self)
        retain_freed_memory(host_memory, training)  # (process-wide: once the executor is sure to exist)

    # ------------------------------------------------------------------ properties
    @property
    def model(self):
        """The user's model this executor runs (``poptorch.trainingModel(model)``'s ``model``)."""
        return self._user_model

    @property
    def options(self):
        """The ``poptorch.Options`` the executor runs with (frozen)."""
        return self._options

    @property
    def training(self) -> bool:
        """True for a ``trainingModel``, False for an ``inferenceModel``."""
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
        """Whether the model has been compiled (by ``compile()`` or its first call).

        Returns:
            bool: True once compiled, False before and after ``destroy()``.
        """
        return self._executable is not None

    def compile(self, *args, **kwargs) -> None:
        """Compile the model for these inputs without running it.

        The compile traces one micro-batch to find the loss and the blocks and to check the
        model; weights, buffers, random generators and the inputs are left as they were. With the
        compiled backend forced (``Options.openpopBackend("compiled")``) the compiled program is
        built here too. A second call only warns.

        Args:
            *args: The inputs, as for a call of the model (the whole host call's batch).
            **kwargs: Keyword inputs.
        """
        if self._executable is not None:
            logger.warning(errors.COMPILE_IGNORED)
            return
        inputs = BoundInputs(self._signature, args, kwargs)
        callers = prepare_tensors(inputs, self._warned)
        self._compile(inputs, callers)

    def _compile(self, inputs: BoundInputs, ahead_callers=None) -> None:
        """Trace the model and build the executable. From ``compile()`` (``ahead_callers`` given) the
        compiled backend, when it runs the calls, compiles its program here too; from a host call
        that call compiles it and finishes the progress bar (``compiled/backend.py``)."""
        from ..compile_hooks import run_post_compile_hooks, run_pre_compile_hooks
        self._check_batch_dims(inputs)
        self._check_updatable_buffers()
        check_job_replicas(self._options)  # under poprun: replicas add up to --num-replicas
        if self._training:
            self._claim_model()
        started = time.perf_counter()
        run_pre_compile_hooks()
        bar = CompilationProgress() if self._settings.show_compilation_progress_bar else None
        model, settings = self._model, self._settings
        weights = SharedWeights(model) if self._training else CopiedWeights(model, torch.device("cpu"))
        # A compiled program from the executable cache needs no values from the trace (shapes_only.py)
        shapes_only = self._compile_cache is not None and self._dispatch.compiled.selection.wants_compiled()
        traced = trace_model(model, inputs, settings, self._precision, weights, shapes_only)
        with weights.active():
            anchors = AnchoredTensors(settings.anchored_tensors, model, settings.output_mode,
                                      settings.output_return_period, self._training)
        executable = Executable(
            signature=InputSignature(inputs), plan=traced.plan, layout=traced.layout, weights=weights,
            replica_buffers=traced.replica_buffers, anchors=anchors, loss_index=traced.loss_index,
            track_losses=traced.track_losses, training_flags=tuple((m, m.training) for m in model.modules()),
            parameters=tuple(model.parameters()),
            stateful_buffers=traced.stateful_buffers)
        with weights.active():
            session = DeviceSession(model, executable, settings)
        move_optimizer_state(self._optimizer)
        if self._training:
            self._optimizer_snapshot = _optim().snapshot(self._optimizer, **self._snapshot_options())
            # Global replication (distributed_reduce.py): same model everywhere, instance 0's weights.
            self._processes = GlobalReplication.from_options(self._options)
            self._processes.join(model, self._optimizer)
        self._executable, self._session = executable, session
        self._schedule = schedule_for(settings, executable, session, self._precision)
        compiled = self._dispatch.compiled
        backend_seconds = compiled.compile_seconds
        if compiled.selection.wants_compiled() and settings.connection_type != ConnectionType.Never:
            if ahead_callers is None:
                compiled.take_progress(bar)
                bar = None
            else:
                self._compile_ahead(inputs, ahead_callers)
        if bar is not None:
            bar.finish()
        run_post_compile_hooks()
        # (the backend's compile counts in compileSeconds() as the backend's)
        self._compile_seconds = time.perf_counter() - started - (compiled.compile_seconds - backend_seconds)

    def _compile_ahead(self, inputs: BoundInputs, callers) -> None:
        """The compiled backend's program compiled now; a failure leaves the executor uncompiled."""
        try:
            self._session.move_inputs(inputs, callers)
            self._dispatch.compile_ahead(self._view, inputs, self._executable)
        except BaseException:
            self._executable = self._session = self._schedule = None
            raise

    def _claim_model(self) -> None:
        """A destroyed training executor that runs again wraps its model again, unless another
        training executor has wrapped it meanwhile."""
        wrapper = training_wrapper_of(self._user_model)
        if wrapper is None:
            wrap(self._user_model, self)
        elif wrapper is not self:
            raise RuntimeError(errors.ALREADY_WRAPPED)

    def _check_batch_dims(self, inputs: BoundInputs) -> None:
        for path, tensor in inputs.named_tensors():
            self._geometry.check_divisible(path, tensor)

    # ------------------------------------------------------------------ running
    def __call__(self, *args, **kwargs):
        if not kwargs:  # a call like the last compiled one: few checks (compiled/repeat_call.py)
            result = self._dispatch.repeat(self._view, args)
            if result is not DECLINED:
                return result
        if self._settings.connection_type == ConnectionType.Never:
            raise AssertionError(errors.OFFLINE_CALL)
        inputs = BoundInputs(self._signature, args, kwargs)
        callers = prepare_tensors(inputs, self._warned)
        if self._executable is None:
            self._compile(inputs)
        else:
            self._executable.signature.check(inputs)
        session = self._session
        if not session.attached:
            self.attachToDevice()
        session.move_inputs(inputs, callers)
        if not self._training:
            session.upload_weights_if_stale()
        result = self._dispatch.run(self._view, inputs, self._executable)
        callers.write_back()
        return result

    # ------------------------------------------------------------------ compiled?
    def _require_compiled(self):
        if self._executable is None:
            raise errors.createPoptorchError(errors.NO_EXECUTABLE)

    # ------------------------------------------------------------------ optimizer
    def setOptimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Use another optimizer, or the same one with new hyper-parameters, from the next call.

        Hyper-parameters are read from the optimizer at every step anyway, so an LR scheduler
        works without this call; scripts that call it behave as on PopTorch. A fresh optimizer
        object takes over the state (momentum, Adam's moments) of the one it replaces.

        Args:
            optimizer (torch.optim.Optimizer): Over the model's parameters only.

        Raises:
            AssertionError: Called on an inference model.
            ValueError: The new optimizer changes an attribute that was constant when the model
                compiled, or has float16 accumulators without a running mean.
        """
        if not self._training:
            raise AssertionError(errors.SET_OPTIMIZER_INFERENCE)
        optim = _optim()
        optim.validate_optimizer(optimizer, self._settings.relax_optimizer_checks)
        optim.checks.check_parameters_belong(optimizer, self._model)
        if (self._executable is not None and optim.uses_float16_accumulators(optimizer)
                and self._settings.mean_strategy != MeanReductionStrategy.Running):
            raise ValueError(errors.OPTIMIZER_NEEDS_RUNNING_MEAN)
        if self._executable is not None:
            changes = optim.constant_attribute_changes(self._optimizer_snapshot, optimizer)
            if changes:
                raise optim.constant_attribute_error(changes)
        if optimizer is not self._optimizer and not optimizer.state:
            # A fresh optimizer object keeps the state the model has accumulated so far.
            for param, state in self._optimizer.state.items():
                optimizer.state[param] = state
        self._optimizer = optimizer

    def getOptimizer(self):
        """openpop extension: the optimizer the next step applies (the last ``setOptimizer``'s).

        Returns:
            torch.optim.Optimizer: None for an inference model.
        """
        return self._optimizer

    def skippedSteps(self) -> int:
        """openpop extension: how many optimizer steps automatic loss scaling has skipped so far
        (their gradients were not finite); 0 without it."""
        return getattr(self._precision.dynamic, "skipped_steps", 0)

    def _snapshot_options(self):
        return {"force_variable": ["loss_scaling"] if self._settings.automatic_loss_scaling else ()}

    # ------------------------------------------------------------------ device
    def isAttachedToDevice(self) -> bool:
        """Whether the executor holds its device.

        Returns:
            bool: True between compile (or ``attachToDevice``) and ``detachFromDevice``.
        """
        return self._session is not None and self._session.attached

    def detachFromDevice(self) -> None:
        """Release the device. Weights on GPUs come back to the user's model on the CPU; the next
        call attaches again.

        Raises:
            poptorch.Error: Not compiled, or not attached.
        """
        self._require_compiled()
        if not self._session.attached:
            raise errors.createPoptorchError(errors.NOT_ATTACHED)
        self._session.detach(self._optimizer)

    def attachToDevice(self) -> None:
        """Take the device again after ``detachFromDevice``; the weights are copied to it.

        Raises:
            poptorch.Error: Not compiled, or already attached.
            AssertionError: The options say ``ConnectionType.Never``.
        """
        self._require_compiled()
        if self._settings.connection_type == ConnectionType.Never:
            raise AssertionError(errors.ATTACH_OFFLINE)
        if self._session.attached:
            raise errors.createPoptorchError(errors.ALREADY_ATTACHED)
        self._session.attach(self._optimizer)

    def destroy(self) -> None:
        """Release the device and forget the compiled model. A training executor also unwraps the
        user's model, which can then be wrapped again; calling this executor again compiles anew.
        """
        if self._session is not None:
            self._session.close(self._optimizer)
        self._executable = self._session = self._schedule = self._processes = None
        self._dispatch.reset()
        if self._training:
            unwrap(self._user_model, self)

    # ------------------------------------------------------------------ export
    def compileAndExport(self, filename: str, *args, export_model: bool = True, **kwargs) -> None:
        """Compile for these inputs, then ``save`` (openpop has no separate executable to export)."""
        if self._executable is None:
            self.compile(*args, **kwargs)
        self.save(filename, export_model=export_model)

    def save(self, filename: str, export_model: bool = True, save_rng_state: bool = True) -> None:
        """Write what ``poptorch.load`` needs to rebuild this executor: options, the model (its
        structure and weights) with its optimizer, and the RNG state. Written atomically."""
        self._require_compiled()
        if self._training:
            self._executable.weights.download()
        write_saved_executor(
            filename, poptorch_version=self._poptorch_version, training=self._training, options=self._options,
            model=self._user_model if export_model else None, optimizer=self._optimizer if export_model else None,
            rng_state=self.rng_state if save_rng_state else None)

    def loadExecutable(self, filename: str) -> None:
        """Adopt a file written by ``save``: its RNG state (openpop recompiles on demand)."""
        saved = read_saved_executor(filename, self._poptorch_version)
        if saved["training"] != self._training:
            kind = "training" if saved["training"] else "inference"
            raise errors.createPoptorchError(messages.SAVED_KIND.format(filename=filename, kind=kind))
        if saved["rng_state"] is not None:
            torch.random.set_rng_state(torch.tensor(saved["rng_state"][1:], dtype=torch.uint8))

    # ------------------------------------------------------------------ introspection
    def executionPlan(self):
        """openpop extension: the ``ExecutionPlan`` (blocks, stages, IPUs, devices) built at
        compile, or None before compile."""
        return None if self._executable is None else self._executable.plan

    def getAnchoredTensor(self, short_name: str):
        """The tensor anchored as ``short_name`` (``Options.anchorTensor``) by the last call."""
        memory = self._executable.anchors.memory if self._executable is not None else {}
        if short_name not in memory:
            raise AssertionError(errors.NO_ANCHORED_TENSOR.format(name=short_name))
        return memory[short_name]

    def getTensorNames(self):
        """The names of the model's parameters and buffers, which ``Options.anchorTensor`` can name.

        Returns:
            list of str: Parameter names, then buffer names.
        """
        self._require_compiled()
        params, buffers = registered_tensors(self._user_model)
        return list(params) + list(buffers)

    @property
    def rng_state(self):
        """The host's random state as PopTorch gives it: the initial seed, then torch's generator
        state as a list of integers. Assigning a list read from here restores that state.
        """
        self._require_compiled()
        return [torch.initial_seed()] + torch.random.get_rng_state().tolist()

    @rng_state.setter
    def rng_state(self, state):
        self._require_compiled()
        torch.random.set_rng_state(torch.tensor(state[1:], dtype=torch.uint8))

