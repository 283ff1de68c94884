"""Executor files: what ``PoplarExecutor.save`` writes and ``poptorch.load`` reads back."""
import torch

from .. import errors
from ..atomic_file import atomic_write
from . import messages

SAVED_EXECUTOR_FORMAT = "openpop-executor-1"


def write_saved_executor(filename: str, *, poptorch_version: str, training: bool, options, model, optimizer,
                         rng_state) -> None:
    """Options, the model (its structure and weights) with its optimizer, and the RNG state;
    written atomically."""
    saved = {
        "format": SAVED_EXECUTOR_FORMAT,
        "poptorch_version": poptorch_version,
        "training": training,
        "options": options,
        "model": model,
        "optimizer": optimizer,
        "rng_state": rng_state,
    }
    atomic_write(filename, lambda stream: torch.save(saved, stream))


def read_saved_executor(filename: str, poptorch_version: str) -> dict:
    """Read a file written by ``PoplarExecutor.save``, checking it is one."""
    try:
        saved = torch.load(filename, weights_only=False)
    except FileNotFoundError:
        raise
    except Exception as exc:  # torch raises several types for foreign or corrupt files
        raise errors.createPoptorchError(messages.SAVED_UNREADABLE.format(filename=filename, error=exc)) from exc
    if not isinstance(saved, dict) or saved.get("format") != SAVED_EXECUTOR_FORMAT:
        raise errors.createPoptorchError(messages.SAVED_FOREIGN.format(filename=filename))
    if saved["poptorch_version"] != poptorch_version:
        raise errors.createPoptorchError(messages.SAVED_VERSION.format(
            filename=filename, saved=saved["poptorch_version"], current=poptorch_version))
    return saved
