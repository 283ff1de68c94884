"""``poptorch.Options``: every setting of a run, validated, frozen once in use.

Each options object keeps its settings in ``_values`` (created from the constructor's
defaults). Settings are read as attributes (``opts.device_iterations``) and written
through ``set()`` - also by plain assignment, ``opts.replication_factor = 4``.
``set()`` only accepts known keys with the default's type; ``createOrSet()`` may add
keys that have no default (``random_seed``, ``ipu_id``, ...). ``_freeze()`` makes
the object and its groups read-only; ``clone()`` / ``copy.deepcopy`` give an
unfrozen deep copy.

The runtime reads them once, through ``runtime.settings.RunSettings.from_options`` (and the
precision, geometry and distributed groups through their own ``from_options``).

Integer counts (``device_iterations``, ``replication_factor``, ``gradient_accumulation``,
``input_group_size``, ``output_return_period``, process count and id, ``ipu_id``) are checked
by ``set()``/``createOrSet()`` whichever setter, assignment or file sets them: an int, not a
bool, of at least 1 (0 for ids). PopTorch leaves that to the backend; openpop's first call
would otherwise fail far from the cause.
"""
import copy
import json
import os
import re
import warnings
from typing import Any, Callable, Optional

import torch

from . import enums, errors
from .enums import CommGroupType, ConnectionType, OutputMode, ReductionType, SyncPattern
from .errors import FROZEN_OPTIONS, ConfigFileError
from .log import logger
from .strategies import PipelinedExecution, _IExecutionStrategy

_NO_REPEAT_LIMIT = 2**64 - 1
_SEED_RANGE = (-2**63, 2**64 - 1)  # what torch.manual_seed takes


def _warn_deprecated(what: str, reason: str) -> None:
    message = f"{what} is deprecated: {reason}"
    warnings.warn(message, DeprecationWarning, stacklevel=3)
    logger.warning(message)


class OptionsDict:
    """A validated, freezable set of named settings (see the module docstring)."""

    def __init__(self, **defaults: Any) -> None:
        object.__setattr__(self, "_is_frozen", False)
        object.__setattr__(self, "_explicit", set())  # names given a value through set()
        # Creating _values ends construction: private attributes must exist by now.
        object.__setattr__(self, "_values", dict(defaults))

    # --- reading and writing -------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails: options values, or an error.
        values = self.__dict__.get("_values")
        if name.startswith("_") or values is None:
            raise AttributeError(name)
        if name not in values:
            raise AttributeError(errors.INVALID_ATTRIBUTE.format(name=name))
        return values[name]

    def __setattr__(self, name: str, value: Any) -> None:
        if not name.startswith("_"):
            self.set(**{name: value})
            return
        if name == "__class__":  # popdist swaps a group's class for a subclass of its own
            self._check_not_frozen()
            object.__setattr__(self, name, value)
            return
        if "_values" in self.__dict__:
            if name not in self.__dict__:
                raise AttributeError(
                    errors.INVALID_PRIVATE_ATTRIBUTE.format(name=name))
            self._check_not_frozen()
        object.__setattr__(self, name, value)

    # option -> check(option, value) run by set() and createOrSet(), before anything changes.
    _value_checks: dict[str, Callable[[str, Any], None]] = {}

    def set(self, **kwargs: Any) -> None:
        self._check_not_frozen()
        for option, value in kwargs.items():
            if not self.exists(option):
                raise AssertionError(errors.INVALID_OPTION % (option, self._values.keys()))
            expected = type(self._values[option])
            if not isinstance(value, expected):
                raise AssertionError(errors.UNEXPECTED_OPTION_TYPE % (type(value), option, expected))
            self._check_value(option, value)
        self._values.update(kwargs)
        self._explicit.update(kwargs)

    def _check_value(self, option: str, value: Any) -> None:
        check = self._value_checks.get(option)
        if check is not None:
            check(option, value)

    def explicitlySet(self, option: str) -> bool:
        """openpop extension: whether ``option`` was given a value (even its default) through a
        setter, as opposed to holding its default. Integrations use it so user choices win."""
        return isinstance(option, str) and option in self._explicit

    def createOrSet(self, **kwargs: Any) -> None:
        self._check_not_frozen()
        for option, value in kwargs.items():
            if self.exists(option):
                self.set(**{option: value})
            else:
                self._check_value(option, value)
                self._values[option] = value

    def exists(self, option: str) -> bool:
        return isinstance(option, str) and option in self._values

    def deleteIfExists(self, option: str) -> None:
        self._check_not_frozen()
        if isinstance(option, str):
            self._values.pop(option, None)

    def toDict(self) -> dict[str, Any]:
        return dict(self._values)

    # --- freezing and copying -------------------------------------------------------
    def _check_not_frozen(self) -> None:
        if self.__dict__.get("_is_frozen", False):
            raise AttributeError(FROZEN_OPTIONS)

    def _freeze(self) -> None:
        object.__setattr__(self, "_is_frozen", True)
        for value in self.__dict__.values():
            if isinstance(value, (OptionsDict, _PopartOptions)):
                value._freeze()

    def __deepcopy__(self, memo: dict) -> "OptionsDict":
        duplicate = type(self).__new__(type(self))
        memo[id(self)] = duplicate
        for name, value in self.__dict__.items():
            object.__setattr__(duplicate, name, copy.deepcopy(value, memo))
        object.__setattr__(duplicate, "_is_frozen", False)
        return duplicate

    def __repr__(self) -> str:
        values = ", ".join(f"{k}={v!r}" for k, v in self._values.items())
        return f"{type(self).__name__}({values})"


class _PopartOptions:
    """Free-form PopART session options (advanced users): ``set(key, value)`` stores
    any key; openpop keeps them and reports them in ``Options.toDict()``."""

    def __init__(self) -> None:
        self._is_frozen = False
        self.options: dict[str, Any] = {}
        self.set("instrumentWithHardwareCycleCounter", False)
        self.set("rearrangeAnchorsOnHost", False)

    def set(self, key: str, value: Any) -> "_PopartOptions":
        if self._is_frozen:
            raise AttributeError(FROZEN_OPTIONS)
        self.options[key] = value
        return self

    def setEngineOptions(self, options: dict[str, Any]) -> "_PopartOptions":
        errors.check_type(options, dict, "_PopartOptions.setEngineOptions", "options")
        return self.set("engineOptions", dict(options))

    def setPatterns(self, patterns: dict[str, bool], level: int = 2) -> "_PopartOptions":
        errors.check_type(level, int, "_PopartOptions.setPatterns", "level")
        errors.check_type(patterns, dict, "_PopartOptions.setPatterns", "patterns")
        self.set("patterns_level", level)
        return self.set("patterns", dict(patterns))

    def _freeze(self) -> None:
        self._is_frozen = True

    def __deepcopy__(self, memo: dict) -> "_PopartOptions":
        duplicate = type(self).__new__(type(self))
        memo[id(self)] = duplicate
        duplicate.__dict__.update(copy.deepcopy(self.__dict__, memo))
        duplicate._is_frozen = False
        return duplicate

    def __repr__(self) -> str:
        values = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"_PopartOptions({values})"


class _JitOptions(OptionsDict):
    """Options of PyTorch's JIT (``Options.Jit``); only the deprecated ``traceModel``."""

    def traceModel(self, trace_model: bool) -> "_JitOptions":
        _warn_deprecated("poptorch.Options.Jit.traceModel",
                         "tracing is no longer used: the model is always run through the dispatcher")
        if trace_model:
            raise ValueError(errors.TRACE_MODEL_TRUE)
        return self


_AUTOCAST_DTYPES = {torch.bfloat16: torch.bfloat16, torch.float16: torch.float16,
                    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "torch.bfloat16": torch.bfloat16,
                    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
                    "torch.float16": torch.float16, "torch.half": torch.float16}


def _is_real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _count(setter: str, minimum: int = 1) -> Callable[[str, Any], None]:
    """A value check for an integer count option (set through ``setter``): an int (not a bool)
    of at least ``minimum``. A 0 or negative count would only fail later, inside a run."""

    def check(option: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(errors.INTEGER_AT_LEAST.format(setter=setter, option=option, minimum=minimum, value=value))

    return check


class _PrecisionOptions(OptionsDict):
    """Numerical precision settings (``Options.Precision``).

    The settings are PopART options stored in ``Options._Popart``; openpop adds
    read-only views of them: ``partials_type`` ("float" or "half"),
    ``floating_point_exceptions`` and ``stochastic_rounding`` (bools). openpop's own
    mixed-precision setting (``autocast``) is stored here as ``autocast_enabled`` and
    ``autocast_dtype``. What each setting does on CPUs/GPUs: ``openpop.runtime.precision``.
    """

    def __init__(self, popart_options: _PopartOptions) -> None:
        self._popart_options = popart_options
        super().__init__(autocast_enabled=False, autocast_dtype=torch.bfloat16)

    def autocast(self, enabled: bool = True, dtype: torch.dtype = torch.bfloat16) -> "_PrecisionOptions":
        """openpop extension: run the model's forward under ``torch.autocast`` with ``dtype``
        (``torch.bfloat16``, the default, or ``torch.float16``; the names "bfloat16"/"bf16" and
        "float16"/"fp16"/"half" are accepted too): fp32 weights, low-precision compute."""
        if not isinstance(enabled, bool):
            raise ValueError(errors.AUTOCAST_ENABLED.format(enabled=enabled))
        resolved = _AUTOCAST_DTYPES.get(dtype) if isinstance(dtype, (torch.dtype, str)) else None
        if resolved is None:
            raise ValueError(errors.AUTOCAST_DTYPE.format(dtype=dtype))
        self.set(autocast_enabled=enabled, autocast_dtype=resolved)
        return self

    def setPartialsType(self, dtype: torch.dtype) -> "_PrecisionOptions":
        """Data type of matmul/convolution partial results: ``torch.float`` or ``torch.half``."""
        if dtype in (torch.float, torch.float32):
            type_name = "float"
        elif dtype in (torch.half, torch.float16):
            type_name = "half"
        else:
            raise ValueError(errors.PARTIALS_TYPE_SETTER)
        self._popart_options.set("partialsTypeMatMuls", type_name)
        self._popart_options.set("convolutionOptions", {"partialsType": type_name})
        return self

    def enableFloatingPointExceptions(self, enabled: bool) -> "_PrecisionOptions":
        """Raise an error on division by zero, invalid operations and overflow."""
        if not isinstance(enabled, bool):
            raise AssertionError(errors.FLOATING_POINT_EXCEPTIONS_BOOL)
        self._popart_options.set("enableFloatingPointChecks", enabled)
        return self

    def enableStochasticRounding(self, enabled: bool) -> "_PrecisionOptions":
        """Round float16/bfloat16 weight updates stochastically (unbiased)."""
        if not isinstance(enabled, bool):
            raise AssertionError(errors.STOCHASTIC_ROUNDING_BOOL)
        self._popart_options.set("enableStochasticRounding", enabled)
        return self

    def halfFloatCasting(self, half_float_casting: enums.HalfFloatCastingBehavior) -> "_PrecisionOptions":
        """Deprecated, no effect: mixed float16/float32 ops follow PyTorch's promotion rules."""
        _warn_deprecated("poptorch.Options.Precision.halfFloatCasting",
                         "mixed-precision ops always follow PyTorch's type promotion")
        return self

    def runningStatisticsAlwaysFloat(self, value: bool) -> "_PrecisionOptions":
        """Deprecated, no effect: running statistics keep the type of the module's buffers."""
        _warn_deprecated("poptorch.Options.Precision.runningStatisticsAlwaysFloat",
                         "running statistics keep the dtype of the module's buffers")
        if not isinstance(value, bool):
            raise ValueError(errors.RUNNING_STATISTICS_FLOAT_BOOL)
        return self

    @property
    def partials_type(self) -> str:
        return self._popart_options.options.get("partialsTypeMatMuls", "float")

    @property
    def floating_point_exceptions(self) -> bool:
        return self._popart_options.options.get("enableFloatingPointChecks", False)

    @property
    def stochastic_rounding(self) -> bool:
        return self._popart_options.options.get("enableStochasticRounding", False)


class _TrainingOptions(OptionsDict):
    """Training settings (``Options.Training``)."""

    _value_checks = {"gradient_accumulation": _count("Options.Training.gradientAccumulation")}

    def __init__(self, popart_options: _PopartOptions) -> None:
        self._popart_options = popart_options
        super().__init__(
            gradient_accumulation=1,
            accumulation_and_replication_reduction_type=ReductionType.Mean,
            meanAccumulationAndReplicationReductionStrategy=enums.MeanReductionStrategy.Post,
            automaticLossScalingSettings={"enabled": False},
            rollback_failed_calls=True,
        )

    def gradientAccumulation(self, gradient_accumulation: int) -> "_TrainingOptions":
        """Micro-batches whose gradients are accumulated before each optimizer step."""
        self.set(gradient_accumulation=gradient_accumulation)
        return self

    def accumulationAndReplicationReductionType(self, reduction_type: ReductionType) -> "_TrainingOptions":
        """How gradients are combined over accumulation steps and replicas: Mean or Sum."""
        if (not isinstance(reduction_type, ReductionType)
                or reduction_type == ReductionType.NoReduction):
            raise ValueError(errors.REDUCTION_TYPE)
        self.set(accumulation_and_replication_reduction_type=reduction_type)
        return self

    def setMeanAccumulationAndReplicationReductionStrategy(
            self, mean_reduction_strategy: enums.MeanReductionStrategy) -> "_TrainingOptions":
        """When the mean is taken: Running, Post (default) or PostAndLoss."""
        self.set(meanAccumulationAndReplicationReductionStrategy=mean_reduction_strategy)
        return self

    def setAutomaticLossScaling(self, enabled: bool, *, growth_factor: Optional[float] = None,
                                backoff_factor: Optional[float] = None,
                                growth_interval: Optional[int] = None) -> "_TrainingOptions":
        """Dynamic loss scaling that grows and backs off, skipping steps with inf/NaN
        gradients (``openpop.runtime.loss_scaling``). The keyword arguments are openpop
        extras (defaults 2.0, 0.5 and 2000, as ``torch.amp.GradScaler``)."""
        if not isinstance(enabled, bool):
            raise AssertionError(errors.AUTOMATIC_LOSS_SCALING_BOOL)
        extras = {}
        if growth_factor is not None:
            if not _is_real(growth_factor) or not growth_factor > 1.0:
                raise ValueError(errors.LOSS_SCALING_GROWTH_FACTOR.format(growth_factor=growth_factor))
            extras["growth_factor"] = float(growth_factor)
        if backoff_factor is not None:
            if not _is_real(backoff_factor) or not 0.0 < backoff_factor < 1.0:
                raise ValueError(errors.LOSS_SCALING_BACKOFF_FACTOR.format(backoff_factor=backoff_factor))
            extras["backoff_factor"] = float(backoff_factor)
        if growth_interval is not None:
            if isinstance(growth_interval, bool) or not isinstance(growth_interval, int) or growth_interval < 1:
                raise ValueError(errors.LOSS_SCALING_GROWTH_INTERVAL.format(growth_interval=growth_interval))
            extras["growth_interval"] = growth_interval
        self.set(automaticLossScalingSettings={**self.automaticLossScalingSettings, "enabled": enabled,
                                               **extras})
        return self

    def rollbackFailedCalls(self, enabled: bool = True) -> "_TrainingOptions":
        """openpop extension. True (default): a training host call that raises is rolled back -
        parameters, buffers, optimizer state, loss scale and random generators are as before it.
        With ``deviceIterations`` > 1 that keeps one extra copy of the parameters and optimizer
        state. False: no copy; a failed call keeps the updates of the steps it completed and its
        error says how many (``openpop.runtime.transaction``)."""
        if not isinstance(enabled, bool):
            raise ValueError(errors.ROLLBACK_FAILED_CALLS_BOOL.format(enabled=enabled))
        self.set(rollback_failed_calls=enabled)
        return self

    def setConvolutionDithering(self, enabled: bool) -> "_TrainingOptions":
        self._popart_options.set("convolutionDithering", enabled)
        return self


class _DistributedOptions(OptionsDict):
    """Multi-process settings (``Options.Distributed``); read from
    ``OMPI_COMM_WORLD_SIZE`` / ``OMPI_COMM_WORLD_RANK`` at construction."""

    _value_checks = {"num_distributed_processes": _count("Options.Distributed.configureProcessId"),
                     "distributed_process_id": _count("Options.Distributed.configureProcessId", minimum=0)}

    def __init__(self) -> None:
        super().__init__(num_distributed_processes=1, distributed_process_id=0, ipuof_configs={})
        self.setEnvVarNames("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK")

    def disable(self) -> "_DistributedOptions":
        """Run as a single process, whatever the environment says."""
        self.set(num_distributed_processes=1, distributed_process_id=0)
        return self

    def setEnvVarNames(self, var_num_processes: str, var_process_id: str) -> "_DistributedOptions":
        """Read the process count and id from these environment variables (defaults 1 and 0)."""
        return self.configureProcessId(_environment_integer(var_process_id, "0"),
                                       _environment_integer(var_num_processes, "1"))

    def configureProcessId(self, process_id: int, num_processes: int) -> "_DistributedOptions":
        for option, value in (("distributed_process_id", process_id), ("num_distributed_processes", num_processes)):
            self._check_value(option, value)
        if process_id >= num_processes:
            raise ValueError(errors.PROCESS_ID_OUT_OF_RANGE.format(process_id=process_id, num_processes=num_processes))
        self.set(distributed_process_id=process_id, num_distributed_processes=num_processes)
        return self

    @property
    def processId(self) -> int:
        return self.distributed_process_id

    @property
    def numProcesses(self) -> int:
        return self.num_distributed_processes


def _environment_integer(name: str, default: str) -> int:
    errors.check_type(name, str, "Options.Distributed.setEnvVarNames", "the variable name")
    value = os.environ.get(name, default)
    try:
        return int(value)
    except ValueError:
        raise ValueError(errors.DISTRIBUTED_ENV_NOT_INTEGER.format(name=name, value=value)) from None


class TensorLocationSettings(OptionsDict):
    """Where a class of tensors is stored on an IPU system (memory hints, no effect
    on CPUs and GPUs, kept and reported)."""

    def minElementsForOffChip(self, min_elements: int) -> "TensorLocationSettings":
        errors.check_type(min_elements, int, "TensorLocationSettings.minElementsForOffChip", "min_elements")
        self.createOrSet(minElementsForOffChip=min_elements)
        return self

    def minElementsForReplicatedTensorSharding(self, min_elements: int) -> "TensorLocationSettings":
        errors.check_type(min_elements, int, "TensorLocationSettings.minElementsForReplicatedTensorSharding",
                          "min_elements")
        self.createOrSet(minElementsForReplicatedTensorSharding=min_elements)
        return self

    def useOnChipStorage(self, use: Optional[bool] = True) -> "TensorLocationSettings":
        """True: on-chip memory; False: off-chip; None: leave it unspecified."""
        if use is None:
            self.deleteIfExists("onChip")
        else:
            errors.check_type(use, bool, "TensorLocationSettings.useOnChipStorage", "use")
            self.createOrSet(onChip=int(use))
        return self

    def useReplicatedTensorSharding(self, use: bool = True) -> "TensorLocationSettings":
        errors.check_type(use, bool, "TensorLocationSettings.useReplicatedTensorSharding", "use")
        self.createOrSet(useReplicatedTensorSharding=int(use))
        return self

    def useIOTilesToLoad(self, use: bool = True) -> "TensorLocationSettings":
        errors.check_type(use, bool, "TensorLocationSettings.useIOTilesToLoad", "use")
        self.createOrSet(useIOTilesToLoad=int(use))
        return self

    def useIOTilesToStore(self, use: bool = True) -> "TensorLocationSettings":
        errors.check_type(use, bool, "TensorLocationSettings.useIOTilesToStore", "use")
        self.createOrSet(useIOTilesToStore=int(use))
        return self


class _TensorLocationOptions(OptionsDict):
    """Tensor placement hints (``Options.TensorLocations``); IPU memory only."""

    def numIOTiles(self, num_tiles: int) -> "_TensorLocationOptions":
        if not (isinstance(num_tiles, int) and 32 <= num_tiles <= 192 and num_tiles % 2 == 0):
            raise AssertionError(errors.NUM_IO_TILES)
        self.createOrSet(numIOTiles=num_tiles)
        return self

    def _set_location(self, key: str, location: TensorLocationSettings) -> "_TensorLocationOptions":
        errors.check_type(location, TensorLocationSettings, "_TensorLocationOptions._set_location", "location")
        self.createOrSet(**{key: location.toDict()})
        return self

    def setActivationLocation(self, location: TensorLocationSettings) -> "_TensorLocationOptions":
        return self._set_location("location_activation", location)

    def setWeightLocation(self, location: TensorLocationSettings) -> "_TensorLocationOptions":
        return self._set_location("location_weight", location)

    def setOptimizerLocation(self, location: TensorLocationSettings) -> "_TensorLocationOptions":
        return self._set_location("location_optimizer", location)

    def setAccumulatorLocation(self, location: TensorLocationSettings) -> "_TensorLocationOptions":
        return self._set_location("location_accumulator", location)


class Options(OptionsDict):
    """All the settings of a PopTorch run (``poptorch.Options``).

    Environment: ``POPTORCH_CACHE_DIR`` enables the executable cache at that path;
    ``POPTORCH_DEFAULT_OPTIONS`` is a JSON string applied with ``from_json``.
    """

    _value_checks = {
        "device_iterations": _count("Options.deviceIterations"),
        "replication_factor": _count("Options.replicationFactor"),
        "input_group_size": _count("Options.inputReplicaGrouping"),
        "output_return_period": _count("Options.outputMode"),
        "max_repeat_logs": _count("Options.maxRepeatLogs", minimum=0),
        "ipu_id": _count("Options.useIpuId", minimum=0),
    }

    def __init__(self) -> None:
        self._popart = _PopartOptions()
        self._training = _TrainingOptions(self._popart)
        self._precision = _PrecisionOptions(self._popart)
        self._distributed = _DistributedOptions()
        self._tensor_locations = _TensorLocationOptions()
        self._jit = _JitOptions()
        self._execution_strategy: _IExecutionStrategy = PipelinedExecution()
        super().__init__(
            replication_factor=1,
            input_group_size=1,
            input_cgt=CommGroupType.Consecutive,
            broadcast_buffers=True,
            device_iterations=1,
            log_dir=".",
            max_repeat_logs=4,
            auto_round_num_ipus=False,
            anchored_tensors={},
            output_mode=OutputMode.Default.value,
            output_return_period=1,
            connection_type=ConnectionType.Always.value,
            sync_pattern=SyncPattern.Full.value,
            available_memory_proportion={},
            show_compilation_progress_bar=True,
            relax_optimizer_attributes_checks=False,
            module_namescope_enabled=True,
            updatable_named_buffers=[],
            device_map=[],
            source_location_excludes=["openpop/", "poptorch/", "torch/", "site-packages/"],
            openpop_backend="auto",
            compile_after=30.0,
            compiled_unit="auto",
        )
        cache_dir = os.environ.get("POPTORCH_CACHE_DIR", "")
        if cache_dir:
            logger.info("POPTORCH_CACHE_DIR is set: setting cache path to %s", cache_dir)
            self.enableExecutableCaching(cache_dir)
        default_options = os.environ.get("POPTORCH_DEFAULT_OPTIONS", "")
        if default_options:
            logger.info("POPTORCH_DEFAULT_OPTIONS is set: applying %s", default_options)
            self._apply_json(default_options, "POPTORCH_DEFAULT_OPTIONS")

    # --- groups ---------------------------------------------------------------------
    @property
    def Training(self) -> _TrainingOptions:
        return self._training

    @property
    def Precision(self) -> _PrecisionOptions:
        return self._precision

    @property
    def Distributed(self) -> _DistributedOptions:
        return self._distributed

    @property
    def TensorLocations(self) -> _TensorLocationOptions:
        return self._tensor_locations

    @property
    def Jit(self) -> _JitOptions:
        return self._jit

    @property
    def _Popart(self) -> _PopartOptions:
        return self._popart

    # --- batching and replication ---------------------------------------------------
    def deviceIterations(self, device_iterations: int) -> "Options":
        """Optimizer steps (training) or batches (inference) per host call."""
        self.set(device_iterations=device_iterations)
        return self

    def replicationFactor(self, replication_factor: int) -> "Options":
        """Data-parallel replicas of the model (per process when distributed)."""
        self.set(replication_factor=replication_factor)
        return self

    def inputReplicaGrouping(self, input_group_size: int,
                             input_group_type: CommGroupType) -> "Options":
        """Replicas in one group receive the same input data."""
        if input_group_type == CommGroupType.All:
            raise ValueError(errors.INPUT_GROUP_TYPE_ALL)
        if input_group_type == CommGroupType.NoGrouping:
            input_group_size, input_group_type = 1, CommGroupType.Consecutive
        self._check_value("input_group_size", input_group_size)
        if input_group_size > self.replication_factor:
            raise ValueError(errors.INPUT_GROUP_SIZE_TOO_LARGE)
        if self.replication_factor % input_group_size != 0:
            raise ValueError(errors.INPUT_GROUP_SIZE_NOT_FACTOR)
        self.set(input_group_size=input_group_size, input_cgt=input_group_type)
        return self

    def broadcastBuffers(self, broadcast_buffers: bool = True) -> "Options":
        self.set(broadcast_buffers=broadcast_buffers)
        return self

    # --- outputs --------------------------------------------------------------------
    def outputMode(self, output_mode: OutputMode,
                   output_return_period: Optional[int] = None) -> "Options":
        """Which results a host call returns: All, Final, Sum or EveryN(period)."""
        errors.check_type(output_mode, OutputMode, "Options.outputMode", "output_mode")
        if output_mode == OutputMode.EveryN:
            if not (output_return_period and output_return_period > 0):
                raise AssertionError(errors.EVERY_N_PERIOD)
        elif output_return_period:
            logger.info("Anchor return period argument ignored with output_mode set to %s",
                        output_mode)
        self.set(output_mode=output_mode.value, output_return_period=output_return_period or 1)
        return self

    def defaultOutputMode(self) -> bool:
        """True while the output mode is still ``OutputMode.Default``."""
        return self.output_mode == OutputMode.Default

    def anchorMode(self, anchor_mode: OutputMode,
                   anchor_return_period: Optional[int] = None) -> "Options":
        """Deprecated name of ``outputMode``."""
        _warn_deprecated("poptorch.Options.anchorMode",
                         "Use outputMode instead, previous name was misleading")
        if not isinstance(anchor_mode, OutputMode) and getattr(anchor_mode, "name", None) in \
                OutputMode.__members__:
            anchor_mode = OutputMode[anchor_mode.name]  # a legacy AnchorMode member
        return self.outputMode(anchor_mode, anchor_return_period)

    def defaultAnchorMode(self) -> bool:
        """Deprecated name of ``defaultOutputMode``."""
        _warn_deprecated("poptorch.Options.defaultAnchorMode",
                         "Use outputMode instead, previous name was misleading")
        return self.defaultOutputMode()

    def anchorTensor(self, short_name: str, long_name: str,
                     output_mode: Optional[OutputMode] = None,
                     output_return_period: Optional[int] = 1) -> None:
        """Also return the tensor ``long_name``, read back with ``getAnchoredTensor(short_name)``."""
        if output_mode != OutputMode.EveryN:
            output_return_period = 1
        anchored = dict(self.anchored_tensors)
        anchored[short_name] = [long_name, output_mode is None, output_mode, output_return_period]
        self.set(anchored_tensors=anchored)

    # --- randomness, devices, connection ---------------------------------------------
    def randomSeed(self, random_seed: int) -> "Options":
        """Seed the run's random numbers; also seeds ``torch`` on the host."""
        errors.check_type(random_seed, int, "Options.randomSeed", "random_seed")
        if not _SEED_RANGE[0] <= random_seed <= _SEED_RANGE[1]:
            raise ValueError(errors.RANDOM_SEED_RANGE.format(random_seed=random_seed))
        self._check_not_frozen()
        torch.manual_seed(random_seed)
        self.createOrSet(random_seed=random_seed)
        return self

    def setExecutionStrategy(self, strategy: _IExecutionStrategy) -> "Options":
        errors.check_type(strategy, _IExecutionStrategy, "Options.setExecutionStrategy", "strategy",
                          fix=errors.EXECUTION_STRATEGY_FIX)
        self._execution_strategy = strategy
        return self

    def autoRoundNumIPUs(self, auto_round_num_ipus: bool = True) -> "Options":
        self.set(auto_round_num_ipus=auto_round_num_ipus)
        return self

    def useIpuModel(self, use_model: bool) -> "Options":
        self.createOrSet(use_model=use_model)
        return self

    def useIpuId(self, ipu_id: int) -> "Options":
        errors.check_type(ipu_id, int, "Options.useIpuId", "ipu_id")
        self.createOrSet(ipu_id=ipu_id)
        return self

    def useOfflineIpuTarget(self, ipu_version: int = 2) -> "Options":
        """Compile only (``ConnectionType.Never``) for IPU version 1, 2 or 21."""
        self._check_not_frozen()
        self.connectionType(ConnectionType.Never)
        self.createOrSet(ipu_version=ipu_version)
        return self

    def connectionType(self, connection_type: ConnectionType) -> "Options":
        errors.check_type(connection_type, ConnectionType, "Options.connectionType", "connection_type")
        self.set(connection_type=connection_type.value)
        return self

    def syncPattern(self, sync_pattern: SyncPattern) -> "Options":
        errors.check_type(sync_pattern, SyncPattern, "Options.syncPattern", "sync_pattern")
        self.set(sync_pattern=sync_pattern.value)
        return self

    def enableSyntheticData(self, enabled: bool) -> "Options":
        # PopART's SyntheticDataMode: 0 = Off, 2 = RandomNormal.
        self._popart.set("syntheticDataMode", 2 if enabled else 0)
        return self

    # --- caching, logging, profiling -------------------------------------------------
    def enableExecutableCaching(self, path: Optional[str]) -> "Options":
        """Cache compiled executables in ``path``; None disables the cache."""
        if path is None:
            self._popart.set("enableEngineCaching", False)
        else:
            self._popart.set("cachePath", path)
            self._popart.set("enableEngineCaching", True)
        return self

    def logDir(self, log_dir: str) -> "Options":
        self.set(log_dir=log_dir)
        return self

    def maxRepeatLogs(self, max_lines: Optional[int]) -> "Options":
        """How often one repeated log message is printed; None means no limit."""
        self.set(max_repeat_logs=_NO_REPEAT_LIMIT if max_lines is None else max_lines)
        return self

    def modelName(self, name: str) -> "Options":
        """Name of the profile report's subdirectory (default "training"/"inference")."""
        errors.check_type(name, str, "Options.modelName", "name")
        self.createOrSet(model_name=name)
        return self

    def logCycleCount(self, log_cycle_count: bool) -> "Options":
        self._popart.set("instrumentWithHardwareCycleCounter", log_cycle_count)
        return self

    def enableProfiling(self, profile_dir: Optional[str] = None) -> "Options":
        """Write a profile report to ``profile_dir`` (default: the current directory).

        Stored as ``_Popart.options["engineOptions"]["autoReport.directory"]``.
        """
        if profile_dir is not None:
            errors.check_type(profile_dir, (str, os.PathLike), "Options.enableProfiling", "profile_dir")
        env_engine_options = os.environ.get("POPLAR_ENGINE_OPTIONS", "")
        if any(k in env_engine_options
               for k in ("debug.allowOutOfMemory", "autoReport.directory", "autoReport.all")):
            logger.warning(errors.PROFILING_OVERRIDDEN)
        engine_options = dict(self._popart.options.get("engineOptions", {}))
        engine_options.update({"debug.allowOutOfMemory": "true",
                               "autoReport.directory": profile_dir or ".",
                               "autoReport.all": "true"})
        self._popart.setEngineOptions(engine_options)
        return self

    def enableStableNorm(self, enabled: bool) -> "Options":
        self._popart.set("enableStableNorm", enabled)
        return self

    def setAvailableMemoryProportion(self, available_memory_proportion: dict[str, float]) -> "Options":
        """Temporary-memory proportion per IPU, e.g. ``{"IPU0": 0.5}`` (stored as ``{0: 0.5}``)."""
        errors.check_type(available_memory_proportion, dict, "Options.setAvailableMemoryProportion",
                          "available_memory_proportion")
        per_ipu = {}
        for key, proportion in available_memory_proportion.items():
            if not isinstance(key, str) or not re.fullmatch(r"IPU\d+", key):
                raise AssertionError(errors.MEMORY_PROPORTION_KEYS % (key,))
            if not _is_real(proportion) or not 0 <= proportion <= 1:
                raise ValueError(errors.AVAILABLE_MEMORY_PROPORTION.format(value=proportion))
            per_ipu[int(key[3:])] = proportion
        self.createOrSet(available_memory_proportion=per_ipu)
        return self

    def showCompilationProgressBar(self, show: bool = True) -> "Options":
        self.set(show_compilation_progress_bar=show)
        return self

    def openpopBackend(self, backend: str, compile_after: Optional[float] = None,
                       unit: Optional[str] = None) -> "Options":
        """openpop extension: how host calls run. ``"eager"`` (the reference), ``"compiled"``
        (one compiled program per host call, ``runtime/compiled/``; an error naming the construct
        for a model it cannot compile) or ``"auto"`` (default; environment ``OPENPOP_BACKEND``):
        eager until eager host calls have taken ``compile_after`` seconds (default: the program's
        estimated compile time, ``runtime/compiled/compile_cost.py``; environment
        ``OPENPOP_COMPILE_AFTER``), then compiled where possible. ``unit``: what is compiled,
        ``"program"`` (the whole host call), ``"regions"`` (the model's blocks one by one, the host
        call run eagerly) or ``"auto"`` (default; environment ``OPENPOP_COMPILED_UNIT``: regions for models
        whose ops take milliseconds). See the README's "Compiled backend"."""
        from .runtime.compiled.selection import check_backend, check_unit
        check_backend(backend)
        if unit is not None:
            check_unit(unit)
        if compile_after is not None:
            if not _is_real(compile_after) or compile_after < 0:
                raise errors.createPoptorchError(errors.COMPILE_AFTER.format(compile_after=compile_after))
            self.set(compile_after=float(compile_after))
        if unit is not None:
            self.set(compiled_unit=unit)
        self.set(openpop_backend=backend)
        return self

    def relaxOptimizerAttributesChecks(self, relax: bool = True) -> "Options":
        """Unexpected optimizer attributes: warning (False, default) or debug message (True)."""
        self.set(relax_optimizer_attributes_checks=relax)
        return self

    def disableModuleNamescope(self) -> "Options":
        self.set(module_namescope_enabled=False)
        return self

    def updatableNamedBuffers(self, buffers: list[str]) -> "Options":
        """Names of buffers the host may update between runs."""
        self.set(updatable_named_buffers=_string_list(buffers, "Options.updatableNamedBuffers", "buffers"))
        return self

    def deviceMap(self, devices: list[str]) -> "Options":
        """openpop extension: the torch devices virtual IPUs run on, in the order
        ``replica * ipus_per_replica + ipu`` (reused round-robin). Empty (default): every CUDA
        GPU round-robin, else the CPU; the ``OPENPOP_DEVICE_MAP`` variable applies when empty."""
        _string_list(devices, "Options.deviceMap", "devices", (str, torch.device))
        self.set(device_map=[str(d) for d in devices])
        return self

    def sourceLocationExcludes(self, excludes: list[str]) -> "Options":
        """Replace the path fragments skipped when attributing ops to source lines."""
        self.set(source_location_excludes=_string_list(excludes, "Options.sourceLocationExcludes", "excludes"))
        return self

    def appendToLocationExcludes(self, *excludes: str) -> "Options":
        self.set(source_location_excludes=self.source_location_excludes
                 + _string_list(excludes, "Options.appendToLocationExcludes", "excludes"))
        return self

    # --- loading ----------------------------------------------------------------------
    def loadFromFile(self, filepath: str) -> "Options":
        """Apply a file of setter calls, one per line, written without ``options.``
        (``deviceIterations(4)``, ``setExecutionStrategy(poptorch.ShardedExecution())``). Lines
        may use ``poptorch`` (the whole API), ``torch`` and the enums by name. Blank lines and
        lines starting with # are skipped.

        All or nothing: every line is checked before any is applied (a syntax error changes
        nothing), and a line that raises undoes the lines before it (and the seeding of torch's
        random generators by ``randomSeed``); the error names the line.
        """
        with open(filepath, "rb") as config:
            content = config.read()
        lines = [(number, line.strip()) for number, line in enumerate(_decode_lines(content, filepath), start=1)]
        statements = []
        for number, line in lines:
            if not line or line.startswith("#"):
                continue
            try:
                statements.append((number, line, compile("options." + line, filepath, "exec")))
            except SyntaxError as error:
                raise ConfigFileError(
                    errors.CONFIG_FILE_SYNTAX_ERROR.format(number=number, msg=error.msg, line=line)) from None
        namespace = _config_namespace(self)
        saved = self._saved_settings()
        generators = _random_generator_states()
        for number, line, statement in statements:
            try:
                exec(statement, namespace)  # pylint: disable=exec-used
            except Exception as error:
                self._restore_settings(saved)
                _restore_random_generators(generators)
                if hasattr(error, "add_note"):
                    error.add_note(f"(applying line {number} of {filepath}: {line}; no line of the file "
                                   "was applied)")
                raise
        return self

    def _saved_settings(self):
        """Every group's settings, for ``_restore_settings`` to undo a partly applied change."""
        holders = [self, self._training, self._precision, self._distributed, self._tensor_locations, self._jit]
        return ([(holder, holder.__class__, copy.deepcopy(holder._values), set(holder._explicit))
                 for holder in holders],
                copy.deepcopy(self._popart.options), self._execution_strategy)

    def _restore_settings(self, saved) -> None:
        holders, popart_options, strategy = saved
        for holder, cls, values, explicit in holders:
            object.__setattr__(holder, "__class__", cls)
            object.__setattr__(holder, "_values", values)
            object.__setattr__(holder, "_explicit", explicit)
        self._popart.options = popart_options
        object.__setattr__(self, "_execution_strategy", strategy)

    def from_json(self, string: str) -> "Options":
        """Apply ``{"path.to.setter": value}``: a list value is passed as the arguments,
        a string "EnumName.Member" becomes that enum member (e.g. "OutputMode.All").

        All or nothing, as ``loadFromFile``: text that is not a JSON object is a ``ValueError``
        before anything changes, and a setting that raises undoes the ones before it."""
        return self._apply_json(string, "Options.from_json")

    def _apply_json(self, string: str, source: str) -> "Options":
        try:
            settings = json.loads(string)
        except (TypeError, ValueError, RecursionError) as exc:
            problem = errors.JSON_TOO_DEEP if isinstance(exc, RecursionError) else exc
            raise ValueError(errors.OPTIONS_JSON.format(source=source, error=problem,
                                                        text=errors.shorten(str(string)))) from None
        if not isinstance(settings, dict):
            raise ValueError(errors.OPTIONS_JSON_OBJECT.format(source=source, type=type(settings).__name__,
                                                               text=errors.shorten(string)))
        saved = self._saved_settings()
        generators = _random_generator_states()
        try:
            for path, value in settings.items():
                self._apply_json_setting(path, value)
        except Exception:
            self._restore_settings(saved)
            _restore_random_generators(generators)
            raise
        return self

    def _apply_json_setting(self, path: str, value: Any) -> None:
        *owners, name = path.split(".")
        target = self
        for owner in owners:
            target = getattr(target, owner)
        arguments = [_from_json_value(v) for v in value] if isinstance(value, list) \
            else [_from_json_value(value)]
        setter = getattr(target, name, None)
        if callable(setter):
            setter(*arguments)
        else:
            if len(arguments) != 1:
                raise AssertionError(errors.SINGLE_VALUE.format(path=path, value=value))
            setattr(target, name, arguments[0])

    # --- copying and serialisation ----------------------------------------------------
    def clone(self) -> "Options":
        """An unfrozen deep copy."""
        return copy.deepcopy(self)

    def toDict(self) -> dict[str, Any]:
        """Every setting in one flat dict: the strategy's backend options, the PopART
        options, then this object's, Training's, Precision's, Distributed's and
        TensorLocations' values. A key set by two of them is an error."""
        if self.defaultOutputMode():
            raise AssertionError(errors.OUTPUT_MODE_NOT_PICKED)
        merged = dict(self._execution_strategy.backendOptions())
        sources = [self._popart.options, self._values, self._training._values,
                   self._precision.toDict(), self._distributed._values,
                   self._tensor_locations._values]
        for source in sources:
            common = merged.keys() & source.keys()
            if common:
                raise AssertionError(errors.MERGE_COMMON_KEYS.format(common=sorted(common)))
            merged.update(copy.deepcopy(source))
        return merged

    def __repr__(self) -> str:
        values = ", ".join(f"{k}={v!r}" for k, v in self._values.items())
        groups = ", ".join(f"{name}={getattr(self, name)!r}" for name in
                           ("Distributed", "Jit", "Precision", "TensorLocations", "Training", "_Popart"))
        return f"{type(self).__name__}({values}, {groups})"


def _decode_lines(content: bytes, filepath: str) -> list:
    """An options file's lines; a ``ConfigFileError`` naming the line and byte that are not UTF-8."""
    try:
        return content.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        number = content.count(b"\n", 0, exc.start) + 1
        raise ConfigFileError(errors.CONFIG_FILE_NOT_UTF8.format(number=number, path=filepath,
                                                                 offset=exc.start)) from None


def _random_generator_states():
    """torch's CPU generator state, and the CUDA ones where CUDA is initialised (``randomSeed`` seeds all)."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def _restore_random_generators(states) -> None:
    cpu, cuda = states
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


def _string_list(values, where: str, name: str, item_types=str) -> list:
    """``values`` (a list or tuple of ``item_types``) as a list: a clear error for anything else."""
    errors.check_type(values, (list, tuple), where, name)
    for value in values:
        errors.check_type(value, item_types, where, f"each of {name}")
    return list(values)


def _from_json_value(value: Any) -> Any:
    if isinstance(value, str):
        match = re.fullmatch(r"(?:poptorch\.)?(\w+)\.(\w+)", value)
        if match and match.group(1) in enums.__all__:
            enum_class = getattr(enums, match.group(1))
            if match.group(2) in enum_class.__members__:
                return enum_class[match.group(2)]
    return value


def _config_namespace(options: Options) -> dict[str, Any]:
    """Names a config-file line may use: ``options``, ``torch``, ``poptorch`` (openpop's whole
    public API, as ``import poptorch`` gives it) and the enums by name."""
    import openpop  # the package that imports this module: complete by the time a file is loaded
    enum_classes = {name: getattr(enums, name) for name in enums.__all__}
    return {"__builtins__": __builtins__, "options": options, "torch": torch,
            "poptorch": openpop, **enum_classes}


__all__ = ["ConfigFileError", "Options", "TensorLocationSettings"]
