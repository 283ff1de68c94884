"""Per-optimizer-step work that a compiled program can express instead of running it as Python
hooks between steps.

A front-end (Lightning's ``IPUStrategy``: ``lightning/optimizer_steps.py``) that needs work done
at every optimizer step registers optimizer step hooks for the eager backend and attaches an
object to the optimizer with ``attach``. The compiled backend then accepts those hooks (and no
others) and asks the object instead:

* ``compiled_reason()``: why the hooks' work cannot be expressed (a user hook that must run
  between steps), or None;
* ``clipping()``: ``None``, ``("norm", max_norm)`` or ``("value", clip_value)``: gradient
  clipping before every step, as ``torch.nn.utils.clip_grad_norm_`` / ``clip_grad_value_``;
* ``begin_compiled_call(steps, read_hyper)``: before the program runs, the hyperparameters of
  each of the call's ``steps`` optimizer steps: ``read_hyper()`` (the optimizer's values now)
  before each step, after which the object does what its hooks do after a step (LR schedulers,
  counters). The optimizer and schedulers are then left as the eager steps leave them;
* ``abort_compiled_call()``: the program failed: undo what ``begin_compiled_call`` did (the
  eager backend runs the call next, with the hooks).

The program takes those hyperparameters as one ``[values, steps]`` tensor indexed by its step counter.
"""
_ATTRIBUTE = "_openpop_step_hooks"


def attach(optimizer, hooks) -> None:
    setattr(optimizer, _ATTRIBUTE, hooks)


def detach(optimizer) -> None:
    optimizer.__dict__.pop(_ATTRIBUTE, None)


def of(optimizer):
    """The attached object, or None."""
    return getattr(optimizer, _ATTRIBUTE, None)


def owns_all(optimizer, hooks) -> bool:
    """Whether every step hook registered on ``optimizer`` is one of ``hooks.hook_ids``."""
    registered = set(getattr(optimizer, "_optimizer_step_pre_hooks", {})) | \
        set(getattr(optimizer, "_optimizer_step_post_hooks", {}))
    return registered <= set(hooks.hook_ids)
