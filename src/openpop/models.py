"""Wrapping user models: ``trainingModel``, ``inferenceModel`` and the hardware queries."""
from typing import Optional

import torch

from . import errors
from ._version import poptorch_version
from .runtime import context
from .runtime.executor import PoplarExecutor, _training_wrappers


def _unwrap(model):
    return model._user_model if isinstance(model, PoplarExecutor) else model


def trainingModel(model, options=None, optimizer: Optional[torch.optim.Optimizer] = None) -> PoplarExecutor:
    """Wrap ``model`` so that each call runs device_iterations training steps."""
    model = _unwrap(model)
    if model in _training_wrappers:
        raise RuntimeError(errors.ALREADY_WRAPPED)
    return PoplarExecutor(model, options, training=True, poptorch_version=poptorch_version, optimizer=optimizer)


def inferenceModel(model, options=None) -> PoplarExecutor:
    """Wrap ``model`` for inference; it shares weights with a training wrapper of the same model."""
    model = _unwrap(model)
    return PoplarExecutor(model, options, training=False, poptorch_version=poptorch_version)


def isRunningOnIpu() -> bool:
    """True while the model is being run by an openpop executor (the "IPU")."""
    return context.is_running()


def ipuHardwareIsAvailable(num_ipus: int = 1) -> bool:
    """There is no Graphcore hardware: openpop's virtual IPUs are CPUs and GPUs."""
    return False


def ipuHardwareVersion() -> int:
    return 0
