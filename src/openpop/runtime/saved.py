"""Executor files: what ``PoplarExecutor.save`` writes and ``poptorch.load`` reads back."""
import torch

from .. import errors
from ..atomic_file import atomic_write

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
        raise errors.createPoptorchError(f"{filename} is not a file saved by poptorch: {exc}") from exc
    if not isinstance(saved, dict) or saved.get("format") != SAVED_EXECUTOR_FORMAT:
        raise errors.createPoptorchError(f"{filename} is not a file saved by openpop's PoplarExecutor.save().")
    if saved["poptorch_version"] != poptorch_version:
        raise errors.createPoptorchError(
            f"PopTorch version mismatch: {filename} was saved by {saved['poptorch_version']} and this is "
            f"{poptorch_version}. Save it again with this version.")
    return saved
