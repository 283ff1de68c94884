"""What the executor asks about an optimizer: is it supported, what loss scaling and
accumulator dtypes it uses, and which of its attributes are frozen by compilation.

Executor-facing functions:

* ``validate_optimizer(optimizer, relax_checks)`` — when a model is wrapped and on every
  ``setOptimizer``; raises for unsupported optimizers, warns about subclasses and unknown
  attributes (once per optimizer and message).
* ``check_parameters_belong(optimizer, model)`` — at wrap and on every ``setOptimizer``: an
  optimizer over other tensors than the model's parameters would train nothing.
* ``optimizer_method(optimizer, name)`` — how the executor calls ``step`` and the like.
* ``loss_scaling_of(optimizer)``, ``uses_float16_accumulators(optimizer)``.
* ``snapshot(optimizer)`` at compilation, then ``constant_attribute_changes(snapshot,
  optimizer)`` on ``setOptimizer``; a non-empty result is turned into the error by
  ``constant_attribute_error(changes)``.
"""
import math
import weakref
from collections.abc import Iterable

import torch

from ..errors import Error, createPoptorchError
from ..log import logger
from . import messages
from ._base import ACCUM_TYPES, VariableAttributes
from .adam import Adam, AdamW
from .lamb import LAMB
from .rmsprop import RMSprop
from .sgd import SGD

_TORCH_TYPES = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.RMSprop)
_OPENPOP_TYPES = (SGD, Adam, AdamW, RMSprop, LAMB)
_EXACT_TYPES = frozenset(_TORCH_TYPES + _OPENPOP_TYPES)


# Extra attributes each kind of optimizer understands (read from torch optimizers too,
# as PopTorch did), beyond torch's own.
_OPTIMIZER_ATTRS = {SGD: SGD._optimizer_attrs, Adam: Adam._optimizer_attrs, AdamW: AdamW._optimizer_attrs,
                    RMSprop: RMSprop._optimizer_attrs, LAMB: LAMB._optimizer_attrs}
_ACCUM_ATTRS = ("accum_type", "velocity_accum_type", "first_order_momentum_accum_type",
                "second_order_momentum_accum_type")
# What a torch optimizer may carry for openpop's executor (read by loss_scaling_of /
# uses_float16_accumulators); its other PopTorch attributes would have no effect on it.
_TORCH_OPTIMIZER_ATTRS = ["loss_scaling", "accum_type", "use_combined_accum"]
# Instance attributes torch or its LR schedulers put on optimizers / param groups.
_KNOWN_OBJECT_ATTRS = {"defaults", "state", "param_groups", "variable_attrs", "step"}
_KNOWN_GROUP_KEYS = {"params", "param_names", "initial_lr", "max_lr", "min_lr", "max_momentum",
                     "base_momentum"}

# Numeric attributes that are either constant (fixed at compilation) or variable.
_HYPERPARAMETERS = {
    SGD: ["lr", "momentum", "dampening", "weight_decay", "velocity_scaling"],
    Adam: ["lr", "betas", "eps", "weight_decay"],
    AdamW: ["lr", "betas", "eps", "weight_decay"],
    RMSprop: ["lr", "momentum", "weight_decay", "alpha", "eps"],
    LAMB: ["lr", "weight_decay", "betas", "eps", "max_weight_norm"],
}
_OPTIMIZER_VARIABLES = ["loss_scaling"]

_printed: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _family(optimizer) -> type:
    """The openpop class whose semantics apply (torch's AdamW derives from Adam: test it first)."""
    if isinstance(optimizer, LAMB):
        return LAMB
    if isinstance(optimizer, torch.optim.AdamW):
        return AdamW
    if isinstance(optimizer, torch.optim.Adam):
        return Adam
    if isinstance(optimizer, torch.optim.SGD):
        return SGD
    if isinstance(optimizer, torch.optim.RMSprop):
        return RMSprop
    return None


def optimizer_kind(optimizer) -> str:
    """PopTorch's name of the optimizer variant: SGD1 (combined accumulator) / SGD2, ADAM,
    ADAMW, ADAMW_NO_BIAS, RMSPROP, RMSPROP_CENTERED, LAMB, LAMB_NO_BIAS."""
    family = _family(optimizer)
    if family is SGD:
        return "SGD1" if getattr(optimizer, "use_combined_accum", False) else "SGD2"
    if family is Adam:
        return "ADAMW" if optimizer.defaults.get("decoupled_weight_decay", False) else "ADAM"
    if family is AdamW:
        return "ADAMW" if getattr(optimizer, "bias_correction", True) else "ADAMW_NO_BIAS"
    if family is RMSprop:
        return "RMSPROP_CENTERED" if optimizer.param_groups[0].get("centered", False) else "RMSPROP"
    if family is LAMB:
        return "LAMB" if getattr(optimizer, "bias_correction", True) else "LAMB_NO_BIAS"
    return "Unknown"


def _log_once(optimizer, message, log):
    seen = _printed.setdefault(optimizer, set())
    if message not in seen:
        seen.add(message)
        log(message)


def _runs_eagerly(optimizer) -> bool:
    return isinstance(optimizer, torch.optim.Optimizer) and not isinstance(optimizer, torch.optim.LBFGS)


def validate_optimizer(optimizer, relax_checks: bool) -> None:
    """Raise if openpop cannot run ``optimizer``; warn about what it will ignore."""
    family = _family(optimizer)
    if family is None and _runs_eagerly(optimizer):
        # Beyond PopTorch, which could only map these five onto PopART's native optimizers:
        # openpop calls the optimizer's own step(), so any closure-free torch optimizer works.
        logger.debug("openpop runs %s.step() as is (PopTorch supported only %s)",
                     type(optimizer).__qualname__, messages.SUPPORTED_TYPES)
        return
    if family is None:
        raise AssertionError(messages.UNSUPPORTED_OPTIMIZER.format(
            supported=messages.SUPPORTED_TYPES, module=type(optimizer).__module__,
            qualname=type(optimizer).__qualname__))
    kind = optimizer_kind(optimizer)
    for group in optimizer.param_groups:
        if family in (Adam, AdamW) and group.get("amsgrad", False):
            raise ValueError(messages.AMSGRAD_ERROR)
    for name in _ACCUM_ATTRS:
        value = getattr(optimizer, name, torch.float32)
        if value not in ACCUM_TYPES:
            raise ValueError(messages.ACCUM_TYPE_VALUE.format(name=name, value=value))
    if getattr(optimizer, "use_tf_variant", False) and family is not RMSprop:
        raise ValueError(messages.TF_VARIANT_NOT_RMSPROP)

    if type(optimizer) not in _EXACT_TYPES:
        _log_once(optimizer, messages.SUBCLASS_WARNING.format(name=type(optimizer).__name__), logger.warning)

    log = logger.debug if relax_checks else logger.warning
    group_keys = set(_group_keys(family)) | _KNOWN_GROUP_KEYS
    extra = [k for k in optimizer.defaults if k not in group_keys]
    if extra:
        _log_once(optimizer, f"Ignoring unexpected default group variable in {kind} optimizer: {extra}", log)
    extras = _OPTIMIZER_ATTRS[family] if isinstance(optimizer, _OPENPOP_TYPES) else _TORCH_OPTIMIZER_ATTRS
    known = _KNOWN_OBJECT_ATTRS | set(extras)
    extra = [k for k in vars(optimizer) if not k.startswith("_") and k not in known]
    if extra:
        _log_once(optimizer, f"Ignoring unexpected optimizer attribute in {kind} optimizer: {extra}", log)
    for i, group in enumerate(optimizer.param_groups):
        extra = [k for k in group if k not in group_keys]
        if extra:
            _log_once(optimizer, f"Ignoring unexpected group {i} attribute in {kind} optimizer: {extra}", log)




def check_parameters_belong(optimizer, model: torch.nn.Module) -> None:
    """Raise ``poptorch.Error`` naming every tensor ``optimizer`` would update that is not one
    of ``model``'s parameters (PopTorch fails to compile such a model)."""
    own = {id(p) for p in model.parameters()}
    foreign = []
    for g, group in enumerate(optimizer.param_groups):
        names = group.get("param_names")
        for i, param in enumerate(group["params"]):
            if id(param) in own:
                continue
            where = f"param_groups[{g}]['params'][{i}]"
            if names is not None and i < len(names):
                where = f"{names[i]!r} ({where})"
            foreign.append(f"{where} of shape {list(param.shape)}")
    if foreign:
        shown = "; ".join(foreign[:5]) + ("; ..." if len(foreign) > 5 else "")
        raise createPoptorchError(messages.FOREIGN_PARAMETERS.format(count=len(foreign), names=shown))


def optimizer_method(optimizer, name: str):
    """``optimizer.<name>`` as a callable: the instance's own callable (a wrapper an LR
    scheduler or the user installed), else the class's method — an optimizer may carry a plain
    attribute of that name (``optimizer.step = 0`` used as a counter) and must still be stepped."""
    own = vars(optimizer).get(name)
    if callable(own):
        return own
    return getattr(type(optimizer), name).__get__(optimizer, type(optimizer))


_GROUP_KEYS_CACHE: dict[type, list[str]] = {}


def _group_keys(family) -> list[str]:
    """Every per-group key the family's optimizers have (torch's defaults + openpop's)."""
    keys = _GROUP_KEYS_CACHE.get(family)
    if keys is None:
        probe = torch.nn.Parameter(torch.zeros(1))
        keys = list(family([probe], lr=0.1).defaults) + list(family._group_vars)
        _GROUP_KEYS_CACHE[family] = keys = list(dict.fromkeys(keys))
    return keys


def loss_scaling_of(optimizer) -> float:
    """The factor the executor multiplies the loss by (and divides gradients by): the
    optimizer's ``loss_scaling``, 1.0 for torch's optimizers."""
    return float(getattr(optimizer, "loss_scaling", 1.0))


def uses_float16_accumulators(optimizer) -> bool:
    """True when gradients are accumulated in float16 (``accum_type=torch.float16`` without
    SGD's combined accumulator): the executor then accumulates with a running mean."""
    return (getattr(optimizer, "accum_type", torch.float32) == torch.float16
            and not getattr(optimizer, "use_combined_accum", False))


# --------------------------------------------------------------------------- constness
def _torch_default_is_constant(family, name, value) -> bool:
    """PopTorch's rule for optimizers without ``variable_attrs`` (torch's): an attribute
    is constant while it holds the value that makes it a no-op / torch's default."""
    if name == "lr":
        return False
    if name in ("alpha", "betas", "max_weight_norm"):
        return True
    if name == "weight_decay":
        return value == (1e-2 if family is AdamW else 0.0)
    if name in ("momentum", "dampening"):
        return value == 0.0
    if name in ("velocity_scaling", "loss_scaling"):
        return value == 1.0
    if name == "eps":
        return value == 1e-8
    return True


def variable_attributes_of(optimizer) -> VariableAttributes:
    """``optimizer.variable_attrs`` for openpop optimizers; for torch optimizers, the
    attributes PopTorch treats as variable given their current values."""
    attrs = getattr(optimizer, "variable_attrs", None)
    if isinstance(attrs, VariableAttributes):
        return attrs
    family = _family(optimizer)
    names = _HYPERPARAMETERS.get(family, []) + _OPTIMIZER_VARIABLES
    variable = [n for n in _HYPERPARAMETERS.get(family, [])
                if not _torch_default_is_constant(family, n, _normalise(optimizer.defaults.get(n)))]
    if not _torch_default_is_constant(family, "loss_scaling", loss_scaling_of(optimizer)):
        variable.append("loss_scaling")
    return VariableAttributes(variable, names)


def _normalise(value):
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else tuple(value.flatten().tolist())
    if isinstance(value, (tuple, list)):
        return tuple(_normalise(v) for v in value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return value


def _checked_names(optimizer) -> list[str]:
    family = _family(optimizer)
    names = list(_HYPERPARAMETERS.get(family, []))
    if family is SGD and not getattr(optimizer, "use_combined_accum", False):
        names.remove("velocity_scaling")  # ignored by the separate variant
    return names


def snapshot(optimizer, force_variable: Iterable[str] = ()) -> dict:
    """The values of the optimizer's constant attributes, taken when the model is compiled.
    ``force_variable`` names attributes to treat as variable regardless (e.g. loss_scaling
    under automatic loss scaling)."""
    force_variable = set(force_variable)
    family = _family(optimizer)
    attrs = getattr(optimizer, "variable_attrs", None)
    explicit = isinstance(attrs, VariableAttributes)

    def constant(name, value):
        if name in force_variable:
            return False
        if explicit:
            return attrs.isConstant(name)
        return _torch_default_is_constant(family, name, value)

    groups = []
    for group in optimizer.param_groups:
        frozen = {}
        for name in _checked_names(optimizer):
            value = _normalise(group.get(name, optimizer.defaults.get(name)))
            if constant(name, value):
                frozen[name] = value
        groups.append(frozen)
    wide = {}
    value = loss_scaling_of(optimizer)
    if constant("loss_scaling", value):
        wide["loss_scaling"] = value
    return {"kind": optimizer_kind(optimizer), "optimizer": wide, "groups": groups}


def constant_attribute_changes(old_snapshot: dict, optimizer) -> list[str]:
    """Constant attributes whose value in ``optimizer`` differs from ``old_snapshot``, each
    as ``"<attribute> (<where>: <old> -> <new>)"``. Param groups are matched by index; groups
    added since the snapshot are not checked."""
    changes = []
    for name, old in old_snapshot["optimizer"].items():
        new = loss_scaling_of(optimizer) if name == "loss_scaling" else _normalise(getattr(optimizer, name, None))
        if not _same(old, new):
            changes.append(f"{name} (optimizer: {old} -> {new})")
    for i, (frozen, group) in enumerate(zip(old_snapshot["groups"], optimizer.param_groups)):
        for name, old in frozen.items():
            new = _normalise(group.get(name, optimizer.defaults.get(name)))
            if not _same(old, new):
                changes.append(f"{name} (param group {i}: {old} -> {new})")
    return changes


def _same(a, b) -> bool:
    if isinstance(a, tuple) or isinstance(b, tuple):
        return (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b)
                and all(_same(x, y) for x, y in zip(a, b)))
    try:
        return float(a) == float(b) or (math.isnan(float(a)) and math.isnan(float(b)))
    except (TypeError, ValueError):
        return a == b




def constant_attribute_error(changes: list[str]) -> Error:
    """The ``poptorch.Error`` the executor raises for ``constant_attribute_changes`` output."""
    names = list(dict.fromkeys(c.split(" ", 1)[0] for c in changes))
    it = "it" if len(names) == 1 else "them"
    return Error(messages.CONSTANT_ATTRIBUTE_CHANGED.format(
        changes="; ".join(changes), it=it, names=", ".join(repr(n) for n in names)))
