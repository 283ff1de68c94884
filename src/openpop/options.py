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
        """Set existing options by name: ``opts.set(device_iterations=4)``.

        Every option must exist and keep its default's type; counts and IPU ids are checked
        as their setters check them. Nothing changes if one of them is refused.

        Args:
            **kwargs: Option names and their new values.

        Raises:
            AssertionError: An unknown option, or a value of another type.
            ValueError: A count below 1 or an id below 0.
            AttributeError: The options are frozen (a model or a ``DataLoader`` uses them).
        """
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
        """openpop extension: whether ``option`` was given a value through a setter (even its
        default value), as opposed to holding its default. Integrations such as Lightning's
        ``IPUStrategy`` use it so that the user's choices win.

        Args:
            option (str): The option's name.

        Returns:
            bool: True if a setter, ``set()`` or an assignment gave it a value.
        """
        return isinstance(option, str) and option in self._explicit

    def createOrSet(self, **kwargs: Any) -> None:
        """Set options by name, creating those that do not exist yet.

        Args:
            **kwargs: Option names and their values.
        """
        self._check_not_frozen()
        for option, value in kwargs.items():
            if self.exists(option):
                self.set(**{option: value})
            else:
                self._check_value(option, value)
                self._values[option] = value

    def exists(self, option: str) -> bool:
        """Whether the option is known to this object.

        Args:
            option (str): The option's name, for example ``"device_iterations"``.

        Returns:
            bool: True if the option has a value.
        """
        return isinstance(option, str) and option in self._values

    def deleteIfExists(self, option: str) -> None:
        """Remove an option, if it is set.

        Args:
            option (str): The option's name.
        """
        self._check_not_frozen()
        if isinstance(option, str):
            self._values.pop(option, None)

    def toDict(self) -> dict[str, Any]:
        """The options as a plain dictionary of names and values.

        Returns:
            dict: A copy; changing it changes nothing.
        """
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
        """Store a PopART session option (``opts._Popart.set("autoRecomputation", 3)``).

        Any key is accepted and kept. openpop acts on recomputation, precision, synthetic data
        and caching keys; the others only steer IPU hardware and are named once at INFO.

        Args:
            key (str): The PopART option's name.
            value: Its value.

        Returns:
            The PopART options, so that calls chain.
        """
        if self._is_frozen:
            raise AttributeError(FROZEN_OPTIONS)
        self.options[key] = value
        return self

    def setEngineOptions(self, options: dict[str, Any]) -> "_PopartOptions":
        """Set Poplar engine options, as ``POPLAR_ENGINE_OPTIONS`` does.

        openpop reads the ``autoReport.*`` keys (a profile report, see ``enableProfiling``) and
        keeps the others.

        Args:
            options (dict): Engine option names and values.
        """
        errors.check_type(options, dict, "_PopartOptions.setEngineOptions", "options")
        return self.set("engineOptions", dict(options))

    def setPatterns(self, patterns: dict[str, bool], level: int = 2) -> "_PopartOptions":
        """Enable or disable PopART graph patterns. Kept; openpop applies no PopART patterns.

        Args:
            patterns (dict): Pattern names and whether each is enabled.
            level (int): The pattern level (default 2).
        """
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
        """Deprecated: choose between tracing and dispatching the model. openpop always runs
        the model through the dispatcher.

        Args:
            trace_model (bool): Must be False.

        Raises:
            ValueError: ``trace_model`` is True.
        """
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
        """openpop extension: run every forward pass under ``torch.autocast``: float32 weights
        and optimizer, matmuls and convolutions in ``dtype``, losses in float32.

        Where ``dtype`` is slow on this CPU, the lowered ops are computed in float32 from
        operands rounded to ``dtype`` (see the precision guide). Shown in ``toDict()`` as
        ``autocast_enabled`` and ``autocast_dtype``.

        Args:
            enabled (bool): Turn autocast on (default) or off.
            dtype (torch.dtype): ``torch.bfloat16`` (default) or ``torch.float16``; the names
                "bfloat16"/"bf16" and "float16"/"fp16"/"half" are accepted too.

        Raises:
            ValueError: ``enabled`` is not a bool, or ``dtype`` is not a half dtype.
        """
        if not isinstance(enabled, bool):
            raise ValueError(errors.AUTOCAST_ENABLED.format(enabled=enabled))
        resolved = _AUTOCAST_DTYPES.get(dtype) if isinstance(dtype, (torch.dtype, str)) else None
        if resolved is None:
            raise ValueError(errors.AUTOCAST_DTYPE.format(dtype=dtype))
        self.set(autocast_enabled=enabled, autocast_dtype=resolved)
        return self

    def setPartialsType(self, dtype: torch.dtype) -> "_PrecisionOptions":
        """Set the data type of the partial results of matmuls and convolutions.

        On CUDA, ``torch.half`` allows cuBLAS's reduced-precision accumulation and
        ``torch.float`` (the default) forbids it. CPU kernels accumulate in float32 either way.

        Args:
            dtype (torch.dtype): ``torch.float`` or ``torch.half``.

        Raises:
            ValueError: Any other dtype.
        """
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
        """Raise ``poptorch.Error`` when an op of the forward or backward pass overflows,
        divides by zero or makes a NaN (``-inf`` masks are fine). The message names the op and
        its module. Checking costs a pass over every op's output: use it to debug.

        Args:
            enabled (bool): Turn the checks on or off.
        """
        if not isinstance(enabled, bool):
            raise AssertionError(errors.FLOATING_POINT_EXCEPTIONS_BOOL)
        self._popart_options.set("enableFloatingPointChecks", enabled)
        return self

    def enableStochasticRounding(self, enabled: bool) -> "_PrecisionOptions":
        """Round float16 and bfloat16 weight updates stochastically (unbiased) instead of to
        nearest, with any optimizer. float32 models are not affected.

        Args:
            enabled (bool): Turn stochastic rounding on or off.
        """
        if not isinstance(enabled, bool):
            raise AssertionError(errors.STOCHASTIC_ROUNDING_BOOL)
        self._popart_options.set("enableStochasticRounding", enabled)
        return self

    def halfFloatCasting(self, half_float_casting: enums.HalfFloatCastingBehavior) -> "_PrecisionOptions":
        """Deprecated, no effect: an op that mixes float16 and float32 operands computes in float32,
        as PopTorch 3 did.

        Args:
            half_float_casting (poptorch.HalfFloatCastingBehavior): Ignored.
        """
        _warn_deprecated("poptorch.Options.Precision.halfFloatCasting",
                         "mixed-precision ops always follow PyTorch's type promotion")
        return self

    def runningStatisticsAlwaysFloat(self, value: bool) -> "_PrecisionOptions":
        """Deprecated, no effect: running statistics keep the dtype of the module's buffers.

        Args:
            value (bool): Ignored (must be a bool).
        """
        _warn_deprecated("poptorch.Options.Precision.runningStatisticsAlwaysFloat",
                         "running statistics keep the dtype of the module's buffers")
        if not isinstance(value, bool):
            raise ValueError(errors.RUNNING_STATISTICS_FLOAT_BOOL)
        return self

    @property
    def partials_type(self) -> str:
        """The partials type set by ``setPartialsType``: "float" or "half"."""
        return self._popart_options.options.get("partialsTypeMatMuls", "float")

    @property
    def floating_point_exceptions(self) -> bool:
        """Whether ``enableFloatingPointExceptions(True)`` was set."""
        return self._popart_options.options.get("enableFloatingPointChecks", False)

    @property
    def stochastic_rounding(self) -> bool:
        """Whether ``enableStochasticRounding(True)`` was set."""
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
        """Set how many micro-batches' gradients are accumulated before each optimizer step.

        A pipelined model (``PipelinedExecution`` over N stages) needs at least ``2 * N - 1``.

        Args:
            gradient_accumulation (int): Micro-batches per step and replica, at least 1.
        """
        self.set(gradient_accumulation=gradient_accumulation)
        return self

    def accumulationAndReplicationReductionType(self, reduction_type: ReductionType) -> "_TrainingOptions":
        """Set how the gradients of the accumulated micro-batches and of the replicas are combined.

        Args:
            reduction_type (poptorch.ReductionType): ``ReductionType.Mean`` (default) or
                ``ReductionType.Sum``.

        Raises:
            ValueError: ``ReductionType.NoReduction`` or not a ``ReductionType``.
        """
        if (not isinstance(reduction_type, ReductionType)
                or reduction_type == ReductionType.NoReduction):
            raise ValueError(errors.REDUCTION_TYPE)
        self.set(accumulation_and_replication_reduction_type=reduction_type)
        return self

    def setMeanAccumulationAndReplicationReductionStrategy(
            self, mean_reduction_strategy: enums.MeanReductionStrategy) -> "_TrainingOptions":
        """Set when the ``Mean`` reduction divides: once the micro-batches' gradients are summed
        (``Post``, the default; ``PostAndLoss`` gives the same numbers here), or as a running mean
        at each micro-batch (``Running``, which keeps float16 accumulators from overflowing). The
        weights are the same up to float rounding.

        Args:
            mean_reduction_strategy (poptorch.MeanReductionStrategy): The strategy.
        """
        self.set(meanAccumulationAndReplicationReductionStrategy=mean_reduction_strategy)
        return self

    def setAutomaticLossScaling(self, enabled: bool, *, growth_factor: Optional[float] = None,
                                backoff_factor: Optional[float] = None,
                                growth_interval: Optional[int] = None) -> "_TrainingOptions":
        """Scale the loss automatically, as ``torch.amp.GradScaler`` does: a step whose gradients
        hold inf or NaN is skipped (weights and optimizer state untouched) and the scale is
        multiplied by ``backoff_factor``; after ``growth_interval`` finite steps in a row it is
        multiplied by ``growth_factor``. The current scale is the optimizer's ``loss_scaling``.

        Args:
            enabled (bool): Turn automatic loss scaling on or off.
            growth_factor (float): openpop extension; above 1 (default 2.0).
            backoff_factor (float): openpop extension; between 0 and 1 (default 0.5).
            growth_interval (int): openpop extension; at least 1 (default 2000).

        Raises:
            AssertionError: ``enabled`` is not a bool.
            ValueError: A keyword argument out of range.
        """
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
        """openpop extension: whether a training host call that raises is rolled back.

        When True (the default), parameters, buffers, optimizer state, the loss scale and the
        random generators are as before a call that fails; with ``deviceIterations`` above 1
        that keeps one extra copy of the parameters and optimizer state. When False there is no
        copy, and a failed call keeps the steps it completed; its error says how many.

        Args:
            enabled (bool): Roll failed calls back (default) or not.
        """
        if not isinstance(enabled, bool):
            raise ValueError(errors.ROLLBACK_FAILED_CALLS_BOOL.format(enabled=enabled))
        self.set(rollback_failed_calls=enabled)
        return self

    def setConvolutionDithering(self, enabled: bool) -> "_TrainingOptions":
        """Set convolution dithering, an IPU tile-balancing setting. Kept; no effect here.

        Args:
            enabled (bool): Whether to dither.
        """
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
        """Read the process count and this process's index from environment variables.

        By default they are read from ``OMPI_COMM_WORLD_SIZE`` and ``OMPI_COMM_WORLD_RANK``,
        which ``poprun`` sets for every instance. An unset variable means 1 process, index 0.

        Args:
            var_num_processes (str): The variable holding the number of processes.
            var_process_id (str): The variable holding this process's index.

        Raises:
            ValueError: A variable that is not an integer, or an index out of range.
        """
        return self.configureProcessId(_environment_integer(var_process_id, "0"),
                                       _environment_integer(var_num_processes, "1"))

    def configureProcessId(self, process_id: int, num_processes: int) -> "_DistributedOptions":
        """Set this process's index and the number of processes of the run.

        Args:
            process_id (int): This process's index, from 0.
            num_processes (int): The number of processes, at least 1.

        Raises:
            ValueError: ``process_id`` is not below ``num_processes``.
        """
        for option, value in (("distributed_process_id", process_id), ("num_distributed_processes", num_processes)):
            self._check_value(option, value)
        if process_id >= num_processes:
            raise ValueError(errors.PROCESS_ID_OUT_OF_RANGE.format(process_id=process_id, num_processes=num_processes))
        self.set(distributed_process_id=process_id, num_distributed_processes=num_processes)
        return self

    @property
    def processId(self) -> int:
        """This process's index among the run's processes (0 for a single process)."""
        return self.distributed_process_id

    @property
    def numProcesses(self) -> int:
        """The number of processes of the run (1 unless distributed)."""
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
        """Keep tensors with fewer elements on chip. An IPU memory hint; kept, no effect here.

        Args:
            min_elements (int): The smallest number of elements stored off chip.
        """
        errors.check_type(min_elements, int, "TensorLocationSettings.minElementsForOffChip", "min_elements")
        self.createOrSet(minElementsForOffChip=min_elements)
        return self

    def minElementsForReplicatedTensorSharding(self, min_elements: int) -> "TensorLocationSettings":
        """Shard only tensors with at least this many elements across replicas. An IPU memory hint;
        kept, no effect here.

        Args:
            min_elements (int): The smallest number of elements sharded.
        """
        errors.check_type(min_elements, int, "TensorLocationSettings.minElementsForReplicatedTensorSharding",
                          "min_elements")
        self.createOrSet(minElementsForReplicatedTensorSharding=min_elements)
        return self

    def useOnChipStorage(self, use: Optional[bool] = True) -> "TensorLocationSettings":
        """Store this class of tensors on chip or off chip. An IPU memory hint; kept, no effect here.

        Args:
            use (bool or None): True for on-chip memory, False for off-chip, None to leave it
                unspecified.
        """
        if use is None:
            self.deleteIfExists("onChip")
        else:
            errors.check_type(use, bool, "TensorLocationSettings.useOnChipStorage", "use")
            self.createOrSet(onChip=int(use))
        return self

    def useReplicatedTensorSharding(self, use: bool = True) -> "TensorLocationSettings":
        """Shard this class of tensors across replicas. An IPU memory hint; kept, no effect here
        (every replica holds its tensors whole).

        Args:
            use (bool): Whether to shard.
        """
        errors.check_type(use, bool, "TensorLocationSettings.useReplicatedTensorSharding", "use")
        self.createOrSet(useReplicatedTensorSharding=int(use))
        return self

    def useIOTilesToLoad(self, use: bool = True) -> "TensorLocationSettings":
        """Load this class of tensors through the IPU's IO tiles. Kept; no effect here.

        Args:
            use (bool): Whether to use IO tiles.
        """
        errors.check_type(use, bool, "TensorLocationSettings.useIOTilesToLoad", "use")
        self.createOrSet(useIOTilesToLoad=int(use))
        return self

    def useIOTilesToStore(self, use: bool = True) -> "TensorLocationSettings":
        """Store this class of tensors through the IPU's IO tiles. Kept; no effect here.

        Args:
            use (bool): Whether to use IO tiles.
        """
        errors.check_type(use, bool, "TensorLocationSettings.useIOTilesToStore", "use")
        self.createOrSet(useIOTilesToStore=int(use))
        return self


class _TensorLocationOptions(OptionsDict):
    """Tensor placement hints (``Options.TensorLocations``); IPU memory only."""

    def numIOTiles(self, num_tiles: int) -> "_TensorLocationOptions":
        """Set the number of IPU tiles reserved for IO. Kept; no effect here.

        Args:
            num_tiles (int): An even number from 32 to 192.

        Raises:
            AssertionError: Any other value.
        """
        if not (isinstance(num_tiles, int) and 32 <= num_tiles <= 192 and num_tiles % 2 == 0):
            raise AssertionError(errors.NUM_IO_TILES)
        self.createOrSet(numIOTiles=num_tiles)
        return self

    def _set_location(self, key: str, location: TensorLocationSettings) -> "_TensorLocationOptions":
        errors.check_type(location, TensorLocationSettings, "_TensorLocationOptions._set_location", "location")
        self.createOrSet(**{key: location.toDict()})
        return self

    def setActivationLocation(self, location: TensorLocationSettings) -> "_TensorLocationOptions":
        """Set where activations are stored on an IPU system. Kept; no effect here.

        Args:
            location (poptorch.TensorLocationSettings): The location settings.
        """
        return self._set_location("location_activation", location)

    def setWeightLocation(self, location: TensorLocationSettings) -> "_TensorLocationOptions":
        """Set where weights are stored on an IPU system. Kept; no effect here.

        Args:
            location (poptorch.TensorLocationSettings): The location settings.
        """
        return self._set_location("location_weight", location)

    def setOptimizerLocation(self, location: TensorLocationSettings) -> "_TensorLocationOptions":
        """Set where optimizer state are stored on an IPU system. Kept; no effect here.

        Args:
            location (poptorch.TensorLocationSettings): The location settings.
        """
        return self._set_location("location_optimizer", location)

    def setAccumulatorLocation(self, location: TensorLocationSettings) -> "_TensorLocationOptions":
        """Set where gradient accumulators are stored on an IPU system. Kept; no effect here.

        Args:
            location (poptorch.TensorLocationSettings): The location settings.
        """
        return self._set_location("location_accumulator", location)


class _OpenpopOptions:
    """openpop's own settings of a run, in one group (``poptorch.Options.Openpop``): what has no
    counterpart in PopTorch. Each setter stores its value where the same setter outside the group
    does (``Options.openpopBackend``, ``Options.deviceMap``, ``Options.Precision.autocast``,
    ``Options.Training.rollbackFailedCalls``, which stay for scripts that use them), so
    ``toDict()`` and saved options are the same either way. Settings of the whole process rather
    than of one model (the ``OPENPOP_*`` environment variables: threads, host memory, GEMM library,
    ...) are listed by ``processSettings()``; those above default to their variable where one exists.
    """

    def __init__(self, options: "Options") -> None:
        self._options = options

    def backend(self, backend: str, compile_after: Optional[float] = None,
                unit: Optional[str] = None) -> "_OpenpopOptions":
        """Choose how host calls run: ``"auto"``, ``"eager"`` or ``"compiled"``
        (``Options.openpopBackend``; default ``OPENPOP_BACKEND``, else ``"auto"``).

        Args:
            backend (str): ``"auto"``, ``"eager"`` or ``"compiled"``.
            compile_after (float): Seconds of eager host calls before ``auto`` compiles.
            unit (str): ``"auto"``, ``"program"`` or ``"regions"``.
        """
        self._options.openpopBackend(backend, compile_after, unit)
        return self

    def deviceMap(self, devices: list) -> "_OpenpopOptions":
        """Set the torch devices the virtual IPUs run on (``Options.deviceMap``; default
        ``OPENPOP_DEVICE_MAP``, else every CUDA GPU, else the CPU).

        Args:
            devices (list): Device names or ``torch.device`` objects.
        """
        self._options.deviceMap(devices)
        return self

    def autocast(self, enabled: bool = True, dtype: torch.dtype = torch.bfloat16) -> "_OpenpopOptions":
        """Run forward passes under ``torch.autocast`` (``Options.Precision.autocast``).

        Args:
            enabled (bool): On (default) or off.
            dtype (torch.dtype): ``torch.bfloat16`` (default) or ``torch.float16``.
        """
        self._options.Precision.autocast(enabled, dtype)
        return self

    def rollbackFailedCalls(self, enabled: bool = True) -> "_OpenpopOptions":
        """Roll back a training host call that raises (``Options.Training.rollbackFailedCalls``).

        Args:
            enabled (bool): Roll back (default) or keep the steps a failed call completed.
        """
        self._options.Training.rollbackFailedCalls(enabled)
        return self

    def toDict(self) -> dict:
        """The group's values: ``{"backend", "compile_after", "unit", "device_map", "autocast_enabled",
        "autocast_dtype", "rollback_failed_calls"}`` as the run will use them."""
        o = self._options
        return {"backend": o.openpop_backend, "compile_after": o.compile_after, "unit": o.compiled_unit,
                "device_map": list(o.device_map), "autocast_enabled": o.Precision.autocast_enabled,
                "autocast_dtype": o.Precision.autocast_dtype,
                "rollback_failed_calls": o.Training.rollback_failed_calls}

    @staticmethod
    def processSettings() -> dict:
        """openpop's process-wide settings (``openpop_settings.py``: one field per ``OPENPOP_*``
        variable), each as its value now: the variable's if set, else the default.

        Returns:
            dict: ``{variable name: value}``.
        """
        from .openpop_settings import SETTINGS
        return {setting.env: setting.read() for setting in SETTINGS}


class Options(OptionsDict):
    """All the settings of a PopTorch run (``poptorch.Options``).

    Environment: ``POPTORCH_CACHE_DIR`` puts the executable cache at that path (by default it is
    ``~/.cache/openpop/executables``);
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
        self._openpop = _OpenpopOptions(self)
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
        """Training settings (``poptorch.Options.Training``): gradient accumulation, reduction, loss scaling."""
        return self._training

    @property
    def Precision(self) -> _PrecisionOptions:
        """Precision settings (``poptorch.Options.Precision``): autocast, partials, stochastic rounding."""
        return self._precision

    @property
    def Distributed(self) -> _DistributedOptions:
        """Multi-process settings (``poptorch.Options.Distributed``): process count and index."""
        return self._distributed

    @property
    def TensorLocations(self) -> _TensorLocationOptions:
        """Tensor placement hints of IPU systems (``poptorch.Options.TensorLocations``); no effect here."""
        return self._tensor_locations

    @property
    def Jit(self) -> _JitOptions:
        """PyTorch JIT settings (``poptorch.Options.Jit``); deprecated."""
        return self._jit

    @property
    def Openpop(self) -> _OpenpopOptions:
        """openpop's own settings (``Options.Openpop``): backend, device map, autocast, rollback."""
        return self._openpop

    @property
    def _Popart(self) -> _PopartOptions:
        """PopART session options (``opts._Popart.set(key, value)``); see ``_PopartOptions``."""
        return self._popart

    # --- batching and replication ---------------------------------------------------
    def deviceIterations(self, device_iterations: int) -> "Options":
        """Set how many iterations one call of the model runs: optimizer steps for a training
        model, batches for an inference model.

        A call's inputs hold ``device_iterations x replication_factor x gradient_accumulation``
        micro-batches (``poptorch.DataLoader`` builds such batches).

        Args:
            device_iterations (int): Iterations per call, at least 1.
        """
        self.set(device_iterations=device_iterations)
        return self

    def replicationFactor(self, replication_factor: int) -> "Options":
        """Set the number of data-parallel replicas of the model (in this process, when
        distributed). Replicas share the weights; their gradients are reduced every step.

        Args:
            replication_factor (int): Replicas, at least 1.
        """
        self.set(replication_factor=replication_factor)
        return self

    def inputReplicaGrouping(self, input_group_size: int,
                             input_group_type: CommGroupType) -> "Options":
        """Give the replicas of a group the same input data.

        Args:
            input_group_size (int): Replicas per group; must divide ``replicationFactor``.
            input_group_type (poptorch.CommGroupType): ``Consecutive`` or ``Orthogonal``
                groups; ``NoGrouping`` gives every replica its own data.

        Raises:
            ValueError: ``CommGroupType.All``, or a size that does not divide the replication factor.
        """
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
        """Whether replicas get their buffers from the host at each call.

        Normalisation statistics stay per replica either way. A model with replicas whose
        ``forward`` changes other buffers in place needs ``broadcastBuffers(False)``; each
        replica then keeps its own values.

        Args:
            broadcast_buffers (bool): True (default) or False.
        """
        self.set(broadcast_buffers=broadcast_buffers)
        return self

    # --- outputs --------------------------------------------------------------------
    def outputMode(self, output_mode: OutputMode,
                   output_return_period: Optional[int] = None) -> "Options":
        """Set which results a call returns.

        Args:
            output_mode (poptorch.OutputMode): ``All`` (every micro-batch), ``Final`` (the
                last), ``Sum`` (summed), ``EveryN`` (every N-th iteration) or ``Default``
                (``Final`` for training, ``All`` for inference).
            output_return_period (int): N, for ``EveryN`` only.

        Raises:
            AssertionError: ``EveryN`` without a positive period.
        """
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
        """Whether the output mode is still ``OutputMode.Default``.

        Returns:
            bool: True until ``outputMode`` is called with another mode.
        """
        return self.output_mode == OutputMode.Default

    def anchorMode(self, anchor_mode: OutputMode,
                   anchor_return_period: Optional[int] = None) -> "Options":
        """Deprecated name of ``outputMode``.

        Args:
            anchor_mode (poptorch.OutputMode): As ``outputMode``'s ``output_mode``.
            anchor_return_period (int): As ``outputMode``'s ``output_return_period``.
        """
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
        """Also return a model tensor, read back after a call with
        ``model.getAnchoredTensor(short_name)``.

        Parameters and buffers can be anchored: ``Gradient___<name>`` (the reduced gradient the
        optimizer applied), ``UpdatedVar___<name>`` (after the update) and ``<name>`` (the value
        after the step).

        Args:
            short_name (str): The name to read it back by.
            long_name (str): The tensor's name, for example ``"Gradient___fc.bias"``.
            output_mode (poptorch.OutputMode): Which iterations to keep (default: the model's
                output mode).
            output_return_period (int): N, for ``OutputMode.EveryN``.
        """
        if output_mode != OutputMode.EveryN:
            output_return_period = 1
        anchored = dict(self.anchored_tensors)
        anchored[short_name] = [long_name, output_mode is None, output_mode, output_return_period]
        self.set(anchored_tensors=anchored)

    # --- randomness, devices, connection ---------------------------------------------
    def randomSeed(self, random_seed: int) -> "Options":
        """Seed the run's random numbers. Also seeds ``torch`` on the host, so that dropout masks
        and other random draws repeat from run to run.

        Args:
            random_seed (int): The seed; an integer that fits torch's seed range.

        Raises:
            ValueError: A seed out of range.
        """
        errors.check_type(random_seed, int, "Options.randomSeed", "random_seed")
        if not _SEED_RANGE[0] <= random_seed <= _SEED_RANGE[1]:
            raise ValueError(errors.RANDOM_SEED_RANGE.format(random_seed=random_seed))
        self._check_not_frozen()
        torch.manual_seed(random_seed)
        self.createOrSet(random_seed=random_seed)
        return self

    def setExecutionStrategy(self, strategy: _IExecutionStrategy) -> "Options":
        """Set how the model's blocks are executed.

        Args:
            strategy: ``poptorch.PipelinedExecution`` (default), ``ShardedExecution``,
                ``SerialPhasedExecution`` or ``ParallelPhasedExecution``.

        Raises:
            AssertionError: Any other object.
        """
        errors.check_type(strategy, _IExecutionStrategy, "Options.setExecutionStrategy", "strategy",
                          fix=errors.EXECUTION_STRATEGY_FIX)
        self._execution_strategy = strategy
        return self

    def autoRoundNumIPUs(self, auto_round_num_ipus: bool = True) -> "Options":
        """Allow a number of IPUs that is not a power of two, as if rounded up to the next one.

        Args:
            auto_round_num_ipus (bool): True (default when called) or False.
        """
        self.set(auto_round_num_ipus=auto_round_num_ipus)
        return self

    def useIpuModel(self, use_model: bool) -> "Options":
        """Run on Graphcore's IPU Model simulator. Kept; openpop runs on its virtual IPUs either way.

        Args:
            use_model (bool): Whether to use the IPU Model.
        """
        self.createOrSet(use_model=use_model)
        return self

    def useIpuId(self, ipu_id: int) -> "Options":
        """Run on a given IPU (or multi-IPU device) id. Kept; openpop's devices come from the device
        map (``deviceMap``).

        Args:
            ipu_id (int): The device id, from 0.
        """
        errors.check_type(ipu_id, int, "Options.useIpuId", "ipu_id")
        self.createOrSet(ipu_id=ipu_id)
        return self

    def useOfflineIpuTarget(self, ipu_version: int = 2) -> "Options":
        """Compile only, for an IPU version, without running: the model compiles and refuses to run
        or attach (``ConnectionType.Never``).

        Args:
            ipu_version (int): 1, 2 or 21 (default 2).
        """
        self._check_not_frozen()
        self.connectionType(ConnectionType.Never)
        self.createOrSet(ipu_version=ipu_version)
        return self

    def connectionType(self, connection_type: ConnectionType) -> "Options":
        """Set when the device is attached. ``ConnectionType.Never`` makes a model that compiles and
        refuses to run; ``Always`` and ``OnDemand`` run as usual.

        Args:
            connection_type (poptorch.ConnectionType): ``Always``, ``OnDemand`` or ``Never``.
        """
        errors.check_type(connection_type, ConnectionType, "Options.connectionType", "connection_type")
        self.set(connection_type=connection_type.value)
        return self

    def syncPattern(self, sync_pattern: SyncPattern) -> "Options":
        """Set how IPUs synchronise with the host. Kept; no effect here.

        Args:
            sync_pattern (poptorch.SyncPattern): ``Full``, ``SinglePipeline`` or ``ReplicaAndLadder``.
        """
        errors.check_type(sync_pattern, SyncPattern, "Options.syncPattern", "sync_pattern")
        self.set(sync_pattern=sync_pattern.value)
        return self

    def enableSyntheticData(self, enabled: bool) -> "Options":
        """Run on synthetic data, without host-device transfers. Kept; openpop's PopTorch models run
        on the inputs they are given (PopART sessions honour ``syntheticDataMode``).

        Args:
            enabled (bool): Whether to use synthetic data.
        """
        # PopART's SyntheticDataMode: 0 = Off, 2 = RandomNormal.
        self._popart.set("syntheticDataMode", 2 if enabled else 0)
        return self

    # --- caching, logging, profiling -------------------------------------------------
    def enableExecutableCaching(self, path: Optional[str]) -> "Options":
        """Cache compiled executables in a directory, as ``POPTORCH_CACHE_DIR`` does.

        torch's compile caches (Inductor, AOTAutograd, Triton) and openpop's saved programs live
        there, so a second process compiling the same model loads what the first compiled. The
        directory is created and checked for writing when the model is wrapped.

        Without this call (and without ``POPTORCH_CACHE_DIR``) openpop caches in its default
        directory, ``~/.cache/openpop/executables``, capped in size; ``OPENPOP_EXECUTABLE_CACHE=0``
        turns that off.

        Args:
            path (str or None): The cache directory; None disables the cache, the default one too.
        """
        if path is None:
            self._popart.set("enableEngineCaching", False)
        else:
            self._popart.set("cachePath", path)
            self._popart.set("enableEngineCaching", True)
        return self

    def logDir(self, log_dir: str) -> "Options":
        """Set the directory of IPU log files. Kept; openpop logs through ``poptorch.logger``.

        Args:
            log_dir (str): A directory.
        """
        self.set(log_dir=log_dir)
        return self

    def maxRepeatLogs(self, max_lines: Optional[int]) -> "Options":
        """Set how often one repeated log message is printed. Kept.

        Args:
            max_lines (int or None): The number of repeats; None means no limit.
        """
        self.set(max_repeat_logs=_NO_REPEAT_LIMIT if max_lines is None else max_lines)
        return self

    def modelName(self, name: str) -> "Options":
        """Name the model in profile reports: its report is written to
        ``<profile directory>/<name>`` (default ``training`` or ``inference``).

        Args:
            name (str): The subdirectory's name.
        """
        errors.check_type(name, str, "Options.modelName", "name")
        self.createOrSet(model_name=name)
        return self

    def logCycleCount(self, log_cycle_count: bool) -> "Options":
        """Count the device cycles of each run, read with ``model.cycleCount()``.

        Args:
            log_cycle_count (bool): Whether to count cycles.
        """
        self._popart.set("instrumentWithHardwareCycleCounter", log_cycle_count)
        return self

    def enableProfiling(self, profile_dir: Optional[str] = None) -> "Options":
        """Write a profile of the model's first host calls: a Chrome/Perfetto trace, a JSON
        summary and an HTML report, in ``<profile_dir>/<modelName>``. The same as
        ``POPLAR_ENGINE_OPTIONS='{"autoReport.all":"true","autoReport.directory":DIR}'``.

        Stored as ``_Popart.options["engineOptions"]["autoReport.directory"]``.

        Args:
            profile_dir (str): The directory (default: the current directory).
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
        """Use a numerically more stable variance computation in normalisations. Kept; PyTorch's
        kernels are used as they are.

        Args:
            enabled (bool): Whether to use it.
        """
        self._popart.set("enableStableNorm", enabled)
        return self

    def setAvailableMemoryProportion(self, available_memory_proportion: dict[str, float]) -> "Options":
        """Set the proportion of each IPU's memory that matmuls and convolutions may use for
        temporary values. Kept; no effect here.

        Args:
            available_memory_proportion (dict): ``{"IPU0": 0.5, ...}``; each value from 0 to 1
                (stored as ``{0: 0.5}``).

        Raises:
            AssertionError: A key that is not ``"IPU<n>"``.
            ValueError: A proportion that is not a number from 0 to 1.
        """
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
        """Show the ``Graph compilation`` progress bar on stderr when the model compiles.

        Args:
            show (bool): True (default) or False.
        """
        self.set(show_compilation_progress_bar=show)
        return self

    def openpopBackend(self, backend: str, compile_after: Optional[float] = None,
                       unit: Optional[str] = None) -> "Options":
        """openpop extension: choose how host calls run.

        ``"eager"`` is the reference: a Python loop over the micro-batches. ``"compiled"`` runs
        each host call through ``torch.compile`` and raises an error naming the construct for a
        model it cannot compile exactly. ``"auto"`` (the default; environment ``OPENPOP_BACKEND``)
        runs eagerly until the eager host calls have taken ``compile_after`` seconds, then
        compiles where possible. See docs/guides/compiled-backend.md.

        Args:
            backend (str): ``"auto"``, ``"eager"`` or ``"compiled"``.
            compile_after (float): Seconds of eager calls before ``auto`` compiles (default: the
                model's estimated compile time; environment ``OPENPOP_COMPILE_AFTER``; 0 compiles
                at once).
            unit (str): What is compiled: ``"program"`` (the whole host call), ``"regions"`` (the
                model's blocks one by one, the host call run eagerly) or ``"auto"`` (default;
                environment ``OPENPOP_COMPILED_UNIT``: regions for models whose ops take
                milliseconds).

        Raises:
            poptorch.Error: An unknown backend or unit, or a negative ``compile_after``.
        """
        from .openpop_settings import check_backend, check_unit
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
        """Report optimizer attributes the run does not know as a debug message instead of a
        warning.

        Args:
            relax (bool): True (default when called) or False.
        """
        self.set(relax_optimizer_attributes_checks=relax)
        return self

    def disableModuleNamescope(self) -> "Options":
        """Stop naming ops after the modules they run in. Kept; openpop's traces name modules anyway."""
        self.set(module_namescope_enabled=False)
        return self

    def updatableNamedBuffers(self, buffers: list[str]) -> "Options":
        """Name the buffers that ``model.copyNamedBuffersToDevice()`` may send to the device
        between calls. The names are checked against the model when it compiles.

        Args:
            buffers (list of str): Buffer names, as ``model.named_buffers()`` gives them.
        """
        self.set(updatable_named_buffers=_string_list(buffers, "Options.updatableNamedBuffers", "buffers"))
        return self

    def deviceMap(self, devices: list[str]) -> "Options":
        """openpop extension: set the torch devices the virtual IPUs run on.

        Virtual IPU ``i`` of replica ``r`` runs on entry ``r * ipus_per_replica + i``, reused
        round-robin. Empty (the default): ``OPENPOP_DEVICE_MAP`` if set, else every CUDA GPU
        round-robin, else the CPU.

        Args:
            devices (list): Device names or ``torch.device`` objects, for example
                ``["cuda:0", "cuda:1"]`` or ``["cpu"]``.
        """
        _string_list(devices, "Options.deviceMap", "devices", (str, torch.device))
        self.set(device_map=[str(d) for d in devices])
        return self

    def sourceLocationExcludes(self, excludes: list[str]) -> "Options":
        """Replace the path fragments skipped when ops are attributed to source lines (in error
        messages and traces).

        Args:
            excludes (list of str): Path fragments, for example ``["site-packages/"]``.
        """
        self.set(source_location_excludes=_string_list(excludes, "Options.sourceLocationExcludes", "excludes"))
        return self

    def appendToLocationExcludes(self, *excludes: str) -> "Options":
        """Add path fragments to those skipped when ops are attributed to source lines.

        Args:
            *excludes (str): Path fragments.
        """
        self.set(source_location_excludes=self.source_location_excludes
                 + _string_list(excludes, "Options.appendToLocationExcludes", "excludes"))
        return self

    # --- loading ----------------------------------------------------------------------
    def loadFromFile(self, filepath: str) -> "Options":
        """Apply a file of setter calls, one per line, written without ``options.``:
        ``deviceIterations(4)``, ``Training.gradientAccumulation(2)``,
        ``setExecutionStrategy(poptorch.ShardedExecution())``. Lines may use ``poptorch`` (the
        whole API), ``torch`` and the enums by name; blank lines and lines starting with ``#``
        are skipped.

        All or nothing: every line is checked before any is applied (a syntax error changes
        nothing), and a line that raises undoes the lines before it; the error names the line.

        Args:
            filepath (str): The file's path.

        Raises:
            poptorch.ConfigFileError: A line that is not valid Python, or a file that is not text.
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
        """Apply settings given as JSON: ``{"deviceIterations": 4, "Training.gradientAccumulation": 2}``.

        Each key is a setter's or an option's path. A list value is passed as the setter's
        arguments; a string ``"EnumName.Member"`` becomes that enum member (``"OutputMode.All"``).
        ``POPTORCH_DEFAULT_OPTIONS`` is applied this way to every new ``Options``.

        Args:
            string (str): A JSON object.
        """
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
        """An unfrozen deep copy of the options.

        Returns:
            poptorch.Options: The copy.
        """
        return copy.deepcopy(self)

    def toDict(self) -> dict[str, Any]:
        """Every setting in one flat dictionary: the execution strategy's, the PopART options, then
        this object's and each group's values.

        Returns:
            dict: A copy of the settings.

        Raises:
            AssertionError: The output mode is still ``Default`` (it is chosen when a model is
                wrapped), or two groups set the same key.
        """
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
