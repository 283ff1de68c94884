"""openpop: the PopTorch programming model on CPUs and NVIDIA GPUs.

``import poptorch`` re-exports this module's public API; everything lives here.
"""
import warnings as _warnings

from ._version import openpop_version, poptorch_version as __version__
from .errors import ConfigFileError, Error, RecoverableError, UnrecoverableError, createPoptorchError
from .enums import *  # noqa: F401,F403
from .enums import OutputMode as _OutputMode
from .log import logger, setLogLevel
from .options import Options, TensorLocationSettings
from .strategies import (ParallelPhasedExecution, Phase, PipelinedExecution, SerialPhasedExecution,
                         ShardedExecution, Stage)
from .annotations import BeginBlock, Block, BlockFunction, removeBlocks
from .ops import *  # noqa: F401,F403
from .runtime.losses import identity_loss
from .data import AsynchronousDataAccessor, DataLoader
from .runtime.executor import PoplarExecutor
from .models import inferenceModel, load, ipuHardwareIsAvailable, ipuHardwareVersion, isRunningOnIpu, trainingModel
from . import optim, profiling, testing  # noqa: F401


def __getattr__(name):
    if name == "AnchorMode":
        _warnings.warn("poptorch.AnchorMode is deprecated: use poptorch.OutputMode instead, previous name "
                       "was misleading", DeprecationWarning, stacklevel=2)
        return _OutputMode
    raise AttributeError(f"module 'poptorch' has no attribute '{name}'")
