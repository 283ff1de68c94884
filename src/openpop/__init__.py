"""openpop: the PopTorch programming model on CPUs and NVIDIA GPUs.

``import poptorch`` re-exports this module's public API; everything lives here.

The public names are imported on first use (PEP 562): ``import openpop.k8s.cli`` and the other
command-line tools answer ``--help`` without loading torch. A public name, ``__all__`` or
``dir(openpop)`` loads what it needs (the first one checks torch's version, ``torch_version.py``).
"""
import importlib as _importlib
import importlib.util as _importlib_util

from .distributed.instance import expose_horovod_alias as _expose_horovod_alias

# public name -> the module (relative to this package) that defines it
_FROM = {
    **dict.fromkeys(("openpop_version", "__version__"), "._version"),
    **dict.fromkeys(("BeginBlock", "Block", "BlockFunction", "removeBlocks"), ".annotations"),
    **dict.fromkeys(("AsynchronousDataAccessor", "DataLoader"), ".data"),
    **dict.fromkeys(("ConfigFileError", "Error", "RecoverableError", "UnrecoverableError", "createPoptorchError"),
                    ".errors"),
    **dict.fromkeys(("logger", "setLogLevel"), ".log"),
    **dict.fromkeys(("inferenceModel", "ipuHardwareIsAvailable", "ipuHardwareVersion", "isRunningOnIpu", "load",
                     "trainingModel"), ".models"),
    **dict.fromkeys(("Options", "TensorLocationSettings"), ".options"),
    "PoplarExecutor": ".runtime.executor",
    "identity_loss": ".runtime.losses",
    **dict.fromkeys(("ParallelPhasedExecution", "Phase", "PipelinedExecution", "SerialPhasedExecution",
                     "ShardedExecution", "Stage"), ".strategies"),
}
_PUBLIC_SUBMODULES = ("errors", "optim", "profiling", "testing")
_STAR_MODULES = (".enums", ".ops")  # every name in their __all__ is public here too
_NAME_IN_MODULE = {"__version__": "poptorch_version"}

# Any IPU-stack import (popdist, popart, poptorch: all import openpop) lets a later
# `import horovod.torch` find openpop's compatibility layer when horovod is not installed.
_expose_horovod_alias()


def _import(relative: str):
    return _importlib.import_module(relative, __name__)


def _star_names() -> dict:
    names = {}
    for relative in _STAR_MODULES:
        module = _import(relative)
        names.update(dict.fromkeys(module.__all__, module))
    return names


def _all_names() -> list:
    """Every public name loaded, then every public global (the submodules they imported too)."""
    for name in (*_FROM, *_PUBLIC_SUBMODULES, *_star_names()):
        __getattr__(name)
    return sorted(name for name in globals() if not name.startswith("_"))


def __getattr__(name):
    if name in _PUBLIC_SUBMODULES:
        value = _import("." + name)
    elif name.startswith("__") and name not in ("__all__", "__version__"):
        raise AttributeError(name)
    elif _importlib_util.find_spec(f"{__name__}.{name}") is not None:
        raise AttributeError(name)  # a submodule not imported yet: ``from openpop import x`` imports it
    else:
        _import(".torch_version")  # (first use: refuses a torch that is too old)
        if name == "__all__":
            value = _all_names()
        elif name in _FROM:
            value = getattr(_import(_FROM[name]), _NAME_IN_MODULE.get(name, name))
        elif name == "AnchorMode":  # not cached: the warning is given at each use
            import warnings

            from .enums import OutputMode
            from .errors import ANCHOR_MODE_DEPRECATED
            warnings.warn(ANCHOR_MODE_DEPRECATED, DeprecationWarning, stacklevel=2)
            return OutputMode
        else:
            module = _star_names().get(name)
            if module is None:
                from .errors import NO_SUCH_ATTRIBUTE
                raise AttributeError(NO_SUCH_ATTRIBUTE.format(name=name))
            value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__():
    return _all_names()
