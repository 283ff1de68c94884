"""PopART's Python API on openpop: ``import popart`` builds an ONNX model with ``Builder`` and runs
it with ``InferenceSession`` / ``TrainingSession`` on openpop's runtime (the same plan, devices
and schedules as PopTorch). See docs/guides/popart.md."""
import logging

from . import enums as _enums
from .builder import DEFAULT_AI_GRAPHCORE_OPSET as defaultAiGraphcoreOpset
from .builder import DEFAULT_AI_ONNX_OPSET as defaultAiOnnxOpset
from .builder import Builder, DebugContext, InputSettings, VariableSettings
from .dataflow import AnchorReturnType, DataFlow
from .devices import DeviceInfo, DeviceManager
from .enums import *  # noqa: F403
from .errors import OutOfMemoryException, popart_exception, popart_internal_exception, poplar_exception
from .graphtransformer import GraphTransformer
from .names import RESERVED_PREFIXES
from .ops import OperatorIdentifier
from .optimizers import SGD, Adam, Adaptive, ClipNormSettings, ConstSGD, OptimizerValue
from .options import (
    AccumulateOuterFragmentSettings,
    AutomaticLossScalingSettings,
    BatchSerializationSettings,
    CommGroup,
    ExecutionPhaseSettings,
    ExperimentalSettings,
    NumIOTiles,
    SessionOptions,
    TensorLocation,
    TensorLocationSettings,
)
from .patterns import Patterns
from .sessions import GRADIENT_PREFIX, UPDATED_VAR_PREFIX, InferenceSession, InputShapeInfo, TrainingSession
from .stepio import PyStepIO, PyStepIOCallback, PyWeightsIO
from .tensorinfo import TensorInfo

__version__ = "3.4.0+openpop"



def _reserved_prefix(name: str, value: str):
    def prefix() -> str:
        return value
    prefix.__name__ = prefix.__qualname__ = name
    prefix.__doc__ = f"PopART's prefix of the tensors its IR names so: ``{value}``."
    return prefix


# popart.reservedGradientPrefix(), reservedAccl1Prefix(), ...: every one PopART's Python module has.
for _name, _value in RESERVED_PREFIXES.items():
    globals()[_name] = _reserved_prefix(_name, _value)


def getSupportedOperations(includeInternal: bool = False):
    """An ``OperatorIdentifier`` (domain, type, version) for each operator version this implementation runs."""
    from .ops import supported_operations
    return supported_operations(includeInternal)


def getUnsupportedOperations(opsetVersion: int):
    """The ``OperatorIdentifier`` of each ai.onnx operator of opset ``opsetVersion`` not run here."""
    from .ops import unsupported_operations
    return unsupported_operations(opsetVersion)


def getSupportedOperationsDefinition(includeInternal: bool = False):
    return getSupportedOperations(includeInternal)


def getLogger(name: str = "all"):
    """PopART's logger: a ``logging.Logger`` with PopART's ``setLevel("TRACE"|"DEBUG"|"INFO"|...)``."""
    logger = logging.getLogger("popart" if name == "all" else f"popart.{name}")
    if not hasattr(logger, "_popart_levels"):
        plain = logger.setLevel
        levels = {"TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
                  "ERR": logging.ERROR, "CRITICAL": logging.CRITICAL, "OFF": logging.CRITICAL + 10}

        def set_level(level):
            plain(levels.get(str(level).upper(), level) if isinstance(level, str) else level)
        logger.setLevel = set_level
        logger._popart_levels = levels
    return logger


def versionString() -> str:
    return __version__


def versionNumber():
    return (3, 4, 0)


def packageHash() -> str:
    return "openpop"
