"""Checkpoints: everything needed to resume a run exactly, in one file written atomically.

``<checkpoint_output_dir>/step_<N>.pt`` holds the weights, the optimizer and schedule state,
the step count N (training steps completed), the torch RNG state and the configuration. The
data position follows from N (see ``data.StepSampler``), so resuming from step N and training
on gives the same weights as an uninterrupted run.

A checkpoint is written to a temporary file in the same directory, then renamed into place:
a crash never leaves a partial ``step_N.pt``. A write that fails (full disk, file-size limit)
raises ``CheckpointError`` naming the file; Ctrl-C during a write raises ``KeyboardInterrupt``.
Temporary files of writes that were killed are removed when the next run starts
(``remove_stale_checkpoint_files``).
"""
import copy
import errno
import os
import re
from typing import Optional

import torch

from ..atomic_file import atomic_write, remove_stale_temporaries
from . import messages
from .config import BertRunConfig

FORMAT = "openpop-bert-checkpoint-1"
_STEP_FILE = re.compile(r"^step_(\d+)\.pt$")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, damaged or does not fit the configuration; the message names the fix."""


def checkpoint_path(directory: str, step: int) -> str:
    return os.path.join(directory, f"step_{step}.pt")


def save_checkpoint(directory: str, step: int, config: BertRunConfig, model, optimizer, scheduler) -> str:
    scheduler_state = {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"}
    state = {
        "format": FORMAT,
        "step": step,
        "config_name": config.config,
        "config": config.as_dict(),
        "model_config": config.model_dict(),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler_state,
        "rng_state": torch.get_rng_state(),
    }
    path = checkpoint_path(directory, step)
    try:
        os.makedirs(directory, exist_ok=True)
        atomic_write(path, lambda stream: torch.save(state, stream))
    except OSError as exc:
        fix = _WRITE_FIXES.get(exc.errno, "point --checkpoint-output-dir at a directory you can write to")
        raise CheckpointError(messages.CHECKPOINT_UNWRITABLE.format(
            path=path, problem=exc.strerror or exc, fix=fix)) from None
    return path


_WRITE_FIXES = {
    errno.ENOSPC: "free disk space there, or point --checkpoint-output-dir at a disk with room",
    errno.EDQUOT: "free space in your quota, or point --checkpoint-output-dir at a disk with room",
    errno.EFBIG: "raise the file-size limit (`ulimit -f`), or point --checkpoint-output-dir at a file system "
                 "that takes files this large",
}


def remove_stale_checkpoint_files(directory: str) -> list:
    """Delete the temporary files of checkpoint writes that were killed; returns their paths."""
    return remove_stale_temporaries(directory, _STEP_FILE)


def latest_checkpoint(directory: str) -> Optional[str]:
    """The ``step_N.pt`` with the highest N in ``directory``, or None."""
    if not os.path.isdir(directory):
        return None
    steps = [(int(m.group(1)), name) for name in os.listdir(directory) for m in [_STEP_FILE.match(name)] if m]
    return os.path.join(directory, max(steps)[1]) if steps else None


def find_checkpoint(config: BertRunConfig) -> Optional[str]:
    """The checkpoint this run starts from (None: start from scratch)."""
    source = config.checkpoint_input_dir
    if source is None and config.resume_training_from_checkpoint:
        source = config.checkpoint_output_dir
    if source is None:
        return None
    if os.path.isfile(source):
        return source
    if os.path.isdir(source):
        found = latest_checkpoint(source)
        if found is None:
            raise CheckpointError(messages.NO_CHECKPOINT_IN_DIRECTORY.format(source=source))
        return found
    raise CheckpointError(messages.NO_SUCH_CHECKPOINT.format(source=source))


def _start_over(config: Optional[BertRunConfig]) -> str:
    """The setting to drop to run without the checkpoint: the one that made this run read it."""
    if config is None or not config.resume_training_from_checkpoint:
        return messages.START_WITHOUT_INPUT
    return messages.START_WITHOUT_RESUME if config.checkpoint_input_dir is None else messages.START_WITHOUT_BOTH


def load_checkpoint(path: str, config: BertRunConfig) -> dict:
    """Read and check a checkpoint for this configuration."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(
            messages.CHECKPOINT_DAMAGED.format(path=path, exc_type=type(exc).__name__,
                                               start_over=_start_over(config))) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(messages.NOT_A_CHECKPOINT.format(path=path, format=FORMAT))
    _check_entries(state, path, config)
    theirs, ours = state["model_config"], config.model_dict()
    different = [f"{k}={theirs.get(k)!r} (this run: {ours[k]!r})" for k in ours if theirs.get(k) != ours[k]]
    if different:
        raise CheckpointError(messages.CHECKPOINT_OTHER_MODEL.format(
            path=path, different=', '.join(different), config_name=state.get('config_name')))
    saved_run, this_run = state.get("config") or {}, config.as_dict()
    changed = [f"{k}={saved_run.get(k)!r} (this run: {this_run.get(k)!r})" for k in RESUME_MUST_MATCH
               if k in saved_run and saved_run.get(k) != this_run.get(k)]
    if changed:
        raise CheckpointError(messages.CHECKPOINT_OTHER_TRAINING.format(path=path, changed=', '.join(changed)))
    return state


# Settings a resumed run must share with the saved one to continue it exactly.
RESUME_MUST_MATCH = ("micro_batch_size", "gradient_accumulation", "device_iterations", "replication_factor",
                     "dataset", "input_files", "random_seed", "optimizer", "learning_rate", "lr_schedule",
                     "lr_warmup", "loss_scaling", "weight_decay", "sequence_length", "mask_tokens")


def _check_entries(state: dict, path: str, config: Optional[BertRunConfig] = None) -> None:
    """The entries a resumed run reads, each of the type ``save_checkpoint`` writes: a damaged or
    hand-edited checkpoint fails here, before the run builds anything, not inside torch later."""
    def damaged(entry, expected):
        return CheckpointError(messages.CHECKPOINT_ENTRY.format(path=path, entry=entry, expected=expected,
                                                                start_over=_start_over(config)))

    step = state.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise damaged("step", messages.EXPECTED_STEP_COUNT)
    for entry in ("model_config", "model", "optimizer", "scheduler"):
        if not isinstance(state.get(entry), dict):
            raise damaged(entry, messages.EXPECTED_DICT)
    if not isinstance(state.get("config", {}), dict):
        raise damaged("config", messages.EXPECTED_DICT)
    if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state["model"].items()):
        raise damaged("model", messages.EXPECTED_TENSORS)
    optimizer = state["optimizer"]
    if not (isinstance(optimizer.get("state"), dict) and isinstance(optimizer.get("param_groups"), list)
            and all(isinstance(group, dict) for group in optimizer["param_groups"])):
        raise damaged("optimizer", messages.EXPECTED_OPTIMIZER_STATE)
    rng = state.get("rng_state")
    reference = torch.get_rng_state()
    if not isinstance(rng, torch.Tensor) or rng.dtype != reference.dtype or rng.shape != reference.shape:
        raise damaged("rng_state", messages.EXPECTED_RNG_STATE)


def load_weights(model, state: dict, path: str, config: Optional[BertRunConfig] = None) -> None:
    """The checkpoint's weights into ``model``, after checking that every name and shape fits
    (``load_state_dict`` would copy what fits before raising for the rest)."""
    ours = model.state_dict()
    theirs = state["model"]
    missing = sorted(set(ours) - set(theirs))
    unexpected = sorted(set(theirs) - set(ours))
    wrong = sorted(name for name in set(ours) & set(theirs) if theirs[name].shape != ours[name].shape)
    if missing or unexpected or wrong:
        problems = [f"{title}: {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"
                    for title, names in (("missing", missing), ("unexpected", unexpected), ("other shapes", wrong))
                    if names]
        raise CheckpointError(messages.CHECKPOINT_WEIGHTS.format(path=path, problems="; ".join(problems),
                                                                 start_over=_start_over(config)))
    model.load_state_dict(theirs)


def restore_training_state(state: dict, optimizer, scheduler, path: str = "the checkpoint") -> int:
    """Load optimizer and schedule state; return the number of steps already done. A state that does
    not fit them raises ``CheckpointError`` and leaves both as they were."""
    ours = {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"}
    theirs = state["scheduler"]
    if set(theirs) != set(ours) or any(_kind(theirs[k]) != _kind(v) for k, v in ours.items()):
        raise CheckpointError(messages.CHECKPOINT_SCHEDULE.format(path=path))
    saved = copy.deepcopy(optimizer.state_dict())
    try:
        optimizer.load_state_dict(state["optimizer"])
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as exc:
        optimizer.load_state_dict(saved)
        raise CheckpointError(messages.CHECKPOINT_OPTIMIZER.format(
            path=path, error=f"{type(exc).__name__}: {exc}")) from None
    scheduler_state = dict(theirs)
    scheduler_state["lr_lambdas"] = [None] * len(optimizer.param_groups)
    scheduler.load_state_dict(scheduler_state)
    return state["step"]


def _kind(value):
    """What a schedule entry is, for comparing a saved schedule with this run's."""
    if isinstance(value, bool):
        return bool
    if isinstance(value, (int, float)):
        return float
    return type(value)
