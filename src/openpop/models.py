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
    """Wrap ``model`` for training: each call of the result runs ``deviceIterations`` optimizer
    steps on the call's inputs, each over ``gradientAccumulation x replicationFactor``
    micro-batches, and returns the model's outputs as the output mode says.

    The model's ``forward`` must return its loss (a torch loss, or a value wrapped in
    ``poptorch.identity_loss``). The wrapper trains the model's own parameters, and
    ``model.destroy()`` unwraps it.

    Args:
        model (torch.nn.Module): The model to train.
        options (poptorch.Options): The run's options (default: ``poptorch.Options()``);
            frozen from now on.
        optimizer (torch.optim.Optimizer): Over the model's parameters (default: SGD with
            learning rate 0.01).

    Returns:
        poptorch.PoplarExecutor: The wrapped model; call it like the model.

    Raises:
        RuntimeError: The model is already wrapped by another ``trainingModel``.
    """
    model = _unwrap(model)
    if training_wrapper_of(model) is not None:
        raise RuntimeError(errors.ALREADY_WRAPPED)
    return PoplarExecutor(model, options, training=True, poptorch_version=poptorch_version, optimizer=optimizer)


def inferenceModel(model, options=None) -> PoplarExecutor:
    """Wrap ``model`` for inference: each call of the result runs ``deviceIterations`` batches
    of ``replicationFactor`` micro-batches and returns the outputs as the output mode says.

    The wrapper runs on its own copy of the weights. It picks up new weights when a training
    wrapper of the same model has trained, and otherwise on ``copyWeightsToDevice()``.

    Args:
        model (torch.nn.Module): The model to run.
        options (poptorch.Options): The run's options (default: ``poptorch.Options()``);
            frozen from now on.

    Returns:
        poptorch.PoplarExecutor: The wrapped model; call it like the model.
    """
    model = _unwrap(model)
    return PoplarExecutor(model, options, training=False, poptorch_version=poptorch_version)


def load(filename: str, edit_opts_fn: Optional[Callable] = None) -> PoplarExecutor:
    """Rebuild a wrapped model saved with ``save`` or ``compileAndExport`` (with
    ``export_model=True``): its options, model, optimizer and random state.

    Args:
        filename (str): The saved file.
        edit_opts_fn (callable): ``edit_opts_fn(options)`` may change the options first (for
            example ``useIpuId``).

    Returns:
        poptorch.PoplarExecutor: A training or inference wrapper, as saved.

    Raises:
        poptorch.Error: The file was saved without its model.
    """
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
