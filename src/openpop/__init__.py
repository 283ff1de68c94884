"""openpop: the PopTorch programming model on CPUs and NVIDIA GPUs.

``import poptorch`` re-exports this module's public API; everything lives here.
"""
import warnings as _warnings  # noqa: I001 (torch_version first: it refuses a torch too old)

from . import torch_version as _torch_version
from . import errors, optim, profiling, testing
from ._version import openpop_version
from ._version import poptorch_version as __version__
from .annotations import BeginBlock, Block, BlockFunction, removeBlocks
from .data import AsynchronousDataAccessor, DataLoader
from .distributed.instance import expose_horovod_alias as _expose_horovod_alias
from .enums import *  # noqa: F403
from .enums import OutputMode as _OutputMode
from .errors import ConfigFileError, Error, RecoverableError, UnrecoverableError, createPoptorchError
from .log import logger, setLogLevel
from .models import inferenceModel, ipuHardwareIsAvailable, ipuHardwareVersion, isRunningOnIpu, load, trainingModel
from .ops import *  # noqa: F403
from .options import Options, TensorLocationSettings
from .runtime.executor import PoplarExecutor
from .runtime.losses import identity_loss
from .strategies import (
    ParallelPhasedExecution,
    Phase,
    PipelinedExecution,
    SerialPhasedExecution,
    ShardedExecution,
    Stage,
)

# Any IPU-stack import (popdist, popart, poptorch: all import openpop) lets a later
# `import horovod.torch` find openpop's compatibility layer when horovod is not installed.
_expose_horovod_alias()


def __getattr__(name):
    if name == "AnchorMode":
        _warnings.warn(errors.ANCHOR_MODE_DEPRECATED, DeprecationWarning, stacklevel=2)
        return _OutputMode
    raise AttributeError(errors.NO_SUCH_ATTRIBUTE.format(name=name))
