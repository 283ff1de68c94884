"""PopTorch's API, served by openpop. This package only re-exports ``openpop``."""
import openpop as _openpop
from openpop import *  # noqa: F401,F403
from openpop import (__version__, __getattr__, Error, RecoverableError, UnrecoverableError,  # noqa: F401
                     createPoptorchError, logger, PoplarExecutor)
from . import enums, optim, poptorch_core, profiling, testing  # noqa: F401

__all__ = [name for name in dir(_openpop) if not name.startswith("_")]
