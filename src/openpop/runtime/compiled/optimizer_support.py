"""Which optimizers the compiled backend runs (``unsupported_reason``), and what a program is
built for (``signature``: the optimizer's static choices; ``clipping``): a change of either
builds another program (``backend.py``), while hyperparameter values are program inputs
(``functional_optim.py``)."""
import inspect
import math

import torch
import torch.optim.optimizer as _torch_optimizer

from . import step_hooks

_HALF = (torch.float16, torch.bfloat16)
_FAMILIES = {}  # optimizer class -> family_of (asked on every compiled host call)


def family_of(optimizer):
    """'sgd', 'adam', 'adamw', 'lamb', 'rmsprop' or None (not supported by the compiled backend)."""
    cls = type(optimizer)
    if cls not in _FAMILIES:
        _FAMILIES[cls] = _family_of_class(cls)
    return _FAMILIES[cls]


def _family_of_class(optimizer_class):
    from ...optim.lamb import LAMB
    for cls in optimizer_class.__mro__:
        if cls is LAMB:
            return "lamb"
        if cls is torch.optim.RMSprop:
            return "rmsprop"
        if cls is torch.optim.AdamW:
            return "adamw"
        if cls is torch.optim.Adam:
            return "adam"
        if cls is torch.optim.SGD:
            return "sgd"
    return None


def _known_step(cls) -> bool:
    """Whether ``cls.step`` is the library's own (torch wraps ``step`` for its hooks: unwrap)."""
    from ...optim import adam, lamb, rmsprop, sgd
    from ...optim._base import Optimizer
    step = inspect.unwrap(cls.step)
    torch_classes = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.RMSprop)
    if step in [inspect.unwrap(c.step) for c in torch_classes]:
        return True
    return step is inspect.unwrap(Optimizer.step) and cls._update in (
        sgd.SGD._update, adam._AdamBase._update, lamb.LAMB._update, rmsprop.RMSprop._update)


def unsupported_reason(optimizer):
    """Why the compiled backend cannot run ``optimizer`` functionally, or None."""
    family = family_of(optimizer)
    if family is None:
        return (f"optimizer {type(optimizer).__name__} has no functional update "
                "(SGD, Adam, AdamW, LAMB, RMSprop have)")
    if not _known_step(type(optimizer)):
        return f"{type(optimizer).__name__}.step overridden (only the library's update is known)"
    own = vars(optimizer).get("step")
    if callable(own) and inspect.unwrap(own) is not inspect.unwrap(type(optimizer).step):
        return "a step function set on the optimizer instance (only the library's update is known)"
    hooks = step_hooks.of(optimizer)
    if (_torch_optimizer._global_optimizer_pre_hooks or _torch_optimizer._global_optimizer_post_hooks
            or not (step_hooks.owns_all(optimizer, hooks) if hooks is not None else _no_step_hooks(optimizer))):
        return "optimizer step hooks (optimizer.register_step_pre_hook / post_hook)"
    if hooks is not None:
        reason = hooks.compiled_reason()
        if reason is not None:
            return reason
        if hooks.clipping() is not None and _max_grad_norm(optimizer) != math.inf:
            return "gradient clipping by the step hooks and by the optimizer's max_grad_norm"
    for group in optimizer.param_groups:
        if group.get("amsgrad", False):
            return "amsgrad"
        if group.get("differentiable", False):
            return "a differentiable optimizer"
        for p in group["params"]:
            if p.dtype != torch.float32 and not (_is_openpop(optimizer) and p.dtype in _HALF):
                return (f"a {p.dtype} parameter (the compiled backend updates float32 parameters, and "
                        "float16/bfloat16 ones with poptorch.optim optimizers)")
    return None


def _is_openpop(optimizer) -> bool:
    from ...optim._base import Optimizer
    return isinstance(optimizer, Optimizer)


def _no_step_hooks(optimizer) -> bool:
    return not (getattr(optimizer, "_optimizer_step_pre_hooks", None)
                or getattr(optimizer, "_optimizer_step_post_hooks", None))


def _max_grad_norm(optimizer) -> float:
    return float(getattr(optimizer, "max_grad_norm", math.inf) or math.inf)


def clipping(optimizer):
    """``None``, ``("norm", max_norm)`` (the optimizer's ``max_grad_norm`` or the step hooks')
    or ``("value", clip_value)``."""
    hooks = step_hooks.of(optimizer)
    if hooks is not None and hooks.clipping() is not None:
        return hooks.clipping()
    norm = _max_grad_norm(optimizer)
    return None if math.isinf(norm) else ("norm", norm)


def signature(optimizer):
    """The static choices an update program is built for: (family, clipping kind, per group
    (count of the parameters it updates, momentum on, nesterov, maximize, decoupled weight decay,
    bias correction, centered, TensorFlow's RMSprop), per-step hyperparameters, the positions of
    the parameters with ``requires_grad=False``). A frozen parameter gets no gradient, so eager's
    step leaves it and its state untouched: the program takes it as a constant input (freezing or
    unfreezing one between calls builds another program)."""
    family = family_of(optimizer)
    groups = []
    frozen = []
    position = 0
    for group in optimizer.param_groups:
        momentum_on = family in ("sgd", "rmsprop") and float(group["momentum"]) != 0.0
        params = group["params"]
        before = len(frozen)
        frozen.extend(position + i for i, p in enumerate(params) if not p.requires_grad)
        position += len(params)
        groups.append((len(params) - (len(frozen) - before), momentum_on,
                       bool(group.get("nesterov", False)), bool(group.get("maximize", False)),
                       family == "adamw" or bool(group.get("decoupled_weight_decay", False)),
                       bool(getattr(optimizer, "bias_correction", True)),
                       bool(group.get("centered", False)), bool(getattr(optimizer, "use_tf_variant", False))))
    clip = clipping(optimizer)
    return (family, clip[0] if clip else None, tuple(groups), step_hooks.of(optimizer) is not None, tuple(frozen))


def updated_parameters(optimizer, unused=frozenset()):
    """Per group the parameters the optimizer's step can update: those with ``requires_grad``,
    less ``unused`` (ids of parameters the program's trace gives no gradient: eager's step skips
    a parameter whose ``.grad`` is None, so the program takes them as constants too)."""
    return [[p for p in group["params"] if p.requires_grad and id(p) not in unused]
            for group in optimizer.param_groups]
