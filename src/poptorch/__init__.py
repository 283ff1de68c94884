"""PopTorch's API, served by openpop. This package only re-exports ``openpop``."""
import openpop as _openpop
from openpop import *
from openpop import (
                     Error,
                     PoplarExecutor,
                     RecoverableError,
                     UnrecoverableError,
                     __getattr__,
                     __version__,
                     createPoptorchError,
                     logger,
)
from openpop import torch_ops as _torch_ops  # registers torch.ops.poptorch.*

from . import enums, optim, poptorch_core, profiling, testing

__all__ = [name for name in dir(_openpop) if not name.startswith("_")]
