"""Trainer settings ``IPUStrategy`` refuses (a changing ``accumulate_grad_batches``) or warns
about (step counts that a host call of ``device_iterations`` optimizer steps cannot honour)."""
from ._framework import module

_rank_zero = module("utilities.rank_zero")

ACCUMULATION_CHANGED = ("The `IPUAccelerator` does not support `accumulate_grad_batches` changing between epochs. "
                        "Remove the `GradientAccumulationScheduler` or give it a single value, e.g. "
                        "`Trainer(accumulate_grad_batches=k)`.")
MAX_STEPS_ROUNDED = ("Trainer(max_steps={max_steps}) is not a multiple of device_iterations={di}: every host call "
                     "runs {di} optimizer steps, so training stops after {rounded} steps.")
CHECKPOINT_EVERY_ROUNDED = (
    "ModelCheckpoint(every_n_train_steps={every}) is not a multiple of device_iterations={di}: global_step "
    "advances by {di} per host call, so only steps that are multiples of both are saved. Use a multiple of {di}.")


def check_accumulation_schedule(trainer) -> None:
    """The executor's gradient accumulation is fixed when it compiles."""
    callbacks = module("callbacks")
    for callback in trainer.callbacks:
        if isinstance(callback, callbacks.GradientAccumulationScheduler):
            if len(set(callback.scheduling.values())) > 1:
                raise RuntimeError(ACCUMULATION_CHANGED)


def warn_about_rounded_steps(trainer, di: int) -> None:
    """``global_step`` advances by ``di`` per host call: step counts not a multiple of it round."""
    if trainer.max_steps is not None and trainer.max_steps > 0 and trainer.max_steps % di:
        rounded = -(-trainer.max_steps // di) * di
        _rank_zero.rank_zero_warn(MAX_STEPS_ROUNDED.format(max_steps=trainer.max_steps, di=di, rounded=rounded))
    for callback in trainer.checkpoint_callbacks:
        every = getattr(callback, "_every_n_train_steps", 0) or 0
        if every > 0 and every % di:
            _rank_zero.rank_zero_warn(CHECKPOINT_EVERY_ROUNDED.format(every=every, di=di))
