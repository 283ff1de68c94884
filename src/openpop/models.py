"""Wrapping user models: ``trainingModel``, ``inferenceModel`` and the hardware queries."""
from typing import Callable, Optional

import torch

from . import errors
from ._version import poptorch_version
from .runtime import context
from .runtime.executor import PoplarExecutor, read_saved_executor, training_wrapper_of


def _unwrap(model):
    return model._user_model if isinstance(model, PoplarExecutor) else model


def trainingModel(model, options=None, optimizer: Optional[torch.optim.Optimizer] = None) -> PoplarExecutor:
    """Wrap ``model`` so that each call runs device_iterations training steps."""
    model = _unwrap(model)
    if training_wrapper_of(model) is not None:
        raise RuntimeError(errors.ALREADY_WRAPPED)
    return PoplarExecutor(model, options, training=True, poptorch_version=poptorch_version, optimizer=optimizer)


def inferenceModel(model, options=None) -> PoplarExecutor:
    """Wrap ``model`` for inference; it shares weights with a training wrapper of the same model."""
    model = _unwrap(model)
    return PoplarExecutor(model, options, training=False, poptorch_version=poptorch_version)


def load(filename: str, edit_opts_fn: Optional[Callable] = None) -> PoplarExecutor:
    """Rebuild an executor saved with ``save``/``compileAndExport`` (with ``export_model=True``).

    ``edit_opts_fn(options)`` may change the options first (e.g. ``useIpuId``)."""
    saved = read_saved_executor(filename, poptorch_version)
    if saved["model"] is None:
        raise errors.createPoptorchError(
            errors.EXECUTABLE_WITHOUT_MODEL.format(filename=filename))
    options = saved["options"].clone()
    if edit_opts_fn is not None:
        edit_opts_fn(options)
    if saved["training"]:
        executor = trainingModel(saved["model"], options, saved["optimizer"])
    else:
        executor = inferenceModel(saved["model"], options)
    if saved["rng_state"] is not None:
        torch.random.set_rng_state(torch.tensor(saved["rng_state"][1:], dtype=torch.uint8))
    return executor


def isRunningOnIpu() -> bool:
    """True while the model is being run by an openpop executor (the "IPU")."""
    return context.is_running()


def ipuHardwareIsAvailable(num_ipus: int = 1) -> bool:
    """There is no Graphcore hardware: openpop's virtual IPUs are CPUs and GPUs."""
    return False


def ipuHardwareVersion() -> int:
    return 0
