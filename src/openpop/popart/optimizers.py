"""PopART's optimizers (``SGD``, ``ConstSGD``, ``Adam``, ``Adaptive``) as descriptions that become
openpop optimizers over the session's weights.

Hyper-parameters are ``(value, isConst)`` pairs (a bare number counts as non-constant); per-weight
values come from ``insertSpecific``. A constant value cannot be changed later by
``updateOptimizerFromHost`` (PopART bakes it into the program). Mapping:

* ``SGD`` -> ``openpop.optim.SGD``: torch's update, ``v = mm*v + (1-dm)*(g + wd*w)``, ``w -= lr*v``
  (momentum buffer initialised with the first step's term, as torch and PopTorch), Nesterov,
  velocity scaling, ``Combined``/``Separate`` accumulators, loss scaling.
* ``Adam`` -> ``AdamW`` (``WeightDecayMode.Decay``), ``Adam`` (``L2Regularization``), ``bias_correction=False``
  for ``AdamNoBias``; ``LAMB`` for ``Lamb``/``LambNoBias`` (with ``maxWeightNorm``); torch's ``Adamax``
  for ``AdaMax``.
* ``Adaptive`` -> PopART's own equations for AdaGrad, RMSProp (TensorFlow's variant too), centered RMSProp
  and AdaDelta (``_AdaptiveUpdate``).

Gradient clipping (``ClipNormSettings``) as PopART's ClipWeightGradientsByNorm: one group of every weight is
the optimizer's ``max_grad_norm`` (the compiled backend runs it); subsets of the weights, several groups, LAMB
and AdaMax clip each group by its own global norm in a step pre-hook (``_ClipByNorm``).
"""
import math
from typing import Optional

import torch

from . import messages
from .enums import AdamMode, AdaptiveMode, SGDAccumulatorAndMomentum, WeightDecayMode
from .errors import popart_exception


class ClipNormSettings:
    """Clip the global norm of ``weightIds``' gradients to ``maxNorm``."""

    def __init__(self, weightIds: list[str], maxNorm: float):
        self.weightIds = list(weightIds)
        self.maxNorm = float(maxNorm)
        self.all_weights = False

    @staticmethod
    def clipWeights(weightIds, maxNorm):
        return ClipNormSettings(weightIds, maxNorm)

    @staticmethod
    def clipAllWeights(maxNorm):
        settings = ClipNormSettings([], maxNorm)
        settings.all_weights = True
        return settings


class OptimizerValue:
    def __init__(self, val: float = 0.0, isConst: bool = True):
        self._val = float(val)
        self._const = bool(isConst)

    def val(self) -> float:
        return self._val

    def isConst(self) -> bool:
        return self._const

    def __repr__(self):
        return f"OptimizerValue({self._val}, isConst={self._const})"


def _value(v):
    if isinstance(v, OptimizerValue):
        return v.val(), v.isConst()
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise popart_exception(messages.OPTIMIZER_VALUE_NOT_A_PAIR.format(v=v))
        return float(v[0]), bool(v[1])
    if isinstance(v, bool):
        return v, True
    return float(v), False


class Optimizer:
    """Common part: default values, per-weight values, constness."""

    _keys: dict[str, float] = {}
    _global = ("lossScaling", "nesterov")

    def __init__(self, values: dict, clip_norm_settings=(), debugContext=""):
        unknown = [k for k in values if k not in self._keys]
        if unknown:
            raise popart_exception(messages.UNKNOWN_OPTIMIZER_PARAMETER.format(
                unknown=unknown[0], self_type=type(self).__name__, keys=', '.join(self._keys)))
        self._defaults = {k: (v, True) for k, v in self._keys.items()}
        for k, v in values.items():
            self._defaults[k] = _value(v)
        self._specific: dict[str, dict] = {}
        self._clip = list(clip_norm_settings or [])
        for s in self._clip:
            if not isinstance(s, ClipNormSettings):
                raise popart_exception(messages.CLIP_NORM_SETTINGS_TYPE)

    def insertSpecific(self, weightId: str, values: dict) -> None:
        specific = {}
        for k, v in values.items():
            key = k if k in self._keys else "default" + k[0].upper() + k[1:]
            if key not in self._keys or key in self._global:
                raise popart_exception(messages.INVALID_WEIGHT_SPECIFIC_PARAMETER.format(
                    k=k, weightId=weightId))
            specific[key] = _value(v)
        self._specific[weightId] = specific

    def hasSpecific(self, weightId: Optional[str] = None) -> bool:
        return bool(self._specific) if weightId is None else weightId in self._specific

    def getLossScalingVal(self) -> float:
        return float(self._defaults["lossScaling"][0])

    def value(self, key: str, weight_id: Optional[str] = None):
        if weight_id is not None and key in self._specific.get(weight_id, {}):
            return self._specific[weight_id][key][0]
        return self._defaults[key][0]

    def constants(self) -> dict[tuple, float]:
        consts = {(None, k): v for k, (v, c) in self._defaults.items() if c}
        for w, values in self._specific.items():
            consts.update({(w, k): v for k, (v, c) in values.items() if c})
        return consts

    def _max_grad_norm(self, weight_ids) -> float:
        """The clip norm of one group holding every weight (the optimizer's own ``max_grad_norm``),
        or inf when there is none or the groups are subsets (``_clip_groups``)."""
        if len(self._clip) == 1 and (self._clip[0].all_weights or set(self._clip[0].weightIds) >= set(weight_ids)):
            return self._clip[0].maxNorm
        return math.inf

    def _clip_groups(self, params: dict) -> list:
        """PopART's clipping groups as (parameters, max norm), checked as PopART checks them
        (ClipWeightGradientsByNorm: one ClipAllWeights group alone, every weight a tensor of the model
        that the optimizer updates)."""
        if len(self._clip) > 1 and any(s.all_weights for s in self._clip):
            raise popart_exception(messages.CLIP_ALL_WEIGHTS_NOT_ALONE)
        groups = []
        for s in self._clip:
            if s.all_weights:
                groups.append((list(params.values()), s.maxNorm))
                continue
            for w in s.weightIds:
                if w not in params:
                    raise popart_exception(messages.CLIP_WEIGHT_NOT_UPDATED.format(id=w))
            groups.append(([params[w] for w in s.weightIds], s.maxNorm))
        return groups

    def _with_clipping(self, optimizer, params: dict, native: bool = True):
        """Attach the clipping groups to a built torch optimizer. One group of every weight is the
        optimizer's own ``max_grad_norm`` where it has one (``native``: openpop's optimizers; the
        compiled backend runs it); subsets, several groups and other optimizers clip in a step
        pre-hook, each group scaled by PopART's factor ``maxNorm / max(maxNorm, ||g||)``."""
        groups = self._clip_groups(params)
        if not groups:
            return optimizer
        if native and len(groups) == 1 and self._max_grad_norm(list(params)) != math.inf:
            optimizer.max_grad_norm = groups[0][1]
            return optimizer
        optimizer.register_step_pre_hook(_ClipByNorm(groups))
        return optimizer

    def _groups(self, params: dict[str, torch.nn.Parameter], keys: list[str]):
        """One parameter group for the weights on defaults, one per weight with specific values."""
        groups = []
        plain = [p for w, p in params.items() if w not in self._specific]
        if plain:
            groups.append({"params": plain})
        for w, p in params.items():
            if w in self._specific:
                groups.append({"params": [p], **{k: self.value(k, w) for k in keys}, "popart_weight": w})
        unknown = [w for w in self._specific if w not in params]
        if unknown:
            raise popart_exception(messages.INSERT_SPECIFIC_NOT_A_WEIGHT.format(unknown=unknown[0]))
        if not groups:  # a model without trainable weights trains (PopART: gradients, no updates)
            groups.append({"params": []})
        return groups

    def check_update(self, new: "Optimizer") -> None:
        """``updateOptimizerFromHost``: same type, constants unchanged."""
        if type(new) is not type(self) or getattr(new, "mode", None) != getattr(self, "mode", None):
            raise popart_exception(messages.UPDATED_OPTIMIZER_TYPE_DIFFERS.format(
                new_type=type(new).__name__, self_type=type(self).__name__))
        old, fresh = self.constants(), new.constants()
        for key, value in old.items():
            if (key in fresh and fresh[key] != value) or key not in fresh:
                of_weight = f" of {key[0]}" if key[0] else ""
                raise popart_exception(messages.CONSTANT_OPTIMIZER_VALUE_CHANGED.format(
                    name=key[1], of_weight=of_weight, value=value))


class SGD(Optimizer):
    _keys = {"defaultLearningRate": 0.1, "defaultWeightDecay": 0.0, "defaultMomentum": 0.0,
             "defaultDampening": 0.0, "defaultVelocityScaling": 1.0, "lossScaling": 1.0, "nesterov": False}
    _per_group = {"lr": "defaultLearningRate", "weight_decay": "defaultWeightDecay", "momentum": "defaultMomentum",
                  "dampening": "defaultDampening", "velocity_scaling": "defaultVelocityScaling"}

    def __init__(self, pyd: Optional[dict] = None, clip_norm_settings=(),
                 accumulatorAndMomentum=SGDAccumulatorAndMomentum.Combined,
                 accumType=None, accl1Type=None, debugContext="sgd"):
        super().__init__(dict(pyd or {}), clip_norm_settings, debugContext)
        self.accumulatorAndMomentum = SGDAccumulatorAndMomentum(int(accumulatorAndMomentum))

    def learningRates(self):
        return self.value("defaultLearningRate")

    def to_torch(self, params: dict[str, torch.nn.Parameter]):
        from ..optim import SGD as OpenpopSGD
        groups = self._groups(params, list(self._per_group.values()))
        for g in groups:
            for torch_key, key in self._per_group.items():
                if key in g:
                    g[torch_key] = g.pop(key)
            g.pop("popart_weight", None)
        optimizer = OpenpopSGD(groups, lr=self.value("defaultLearningRate"), momentum=self.value("defaultMomentum"),
                               dampening=self.value("defaultDampening"), weight_decay=self.value("defaultWeightDecay"),
                               nesterov=bool(self.value("nesterov")), loss_scaling=self.value("lossScaling"),
                               velocity_scaling=self.value("defaultVelocityScaling"),
                               use_combined_accum=self.accumulatorAndMomentum == SGDAccumulatorAndMomentum.Combined)
        return self._with_clipping(optimizer, params)


class ConstSGD(SGD):
    """SGD whose learning rate, weight decay and loss scaling are constants."""

    def __init__(self, learning_rate: float, weight_decay: float = 0.0, loss_scaling: float = 1.0,
                 clip_norm_settings=()):
        super().__init__({"defaultLearningRate": (learning_rate, True), "defaultWeightDecay": (weight_decay, True),
                          "lossScaling": (loss_scaling, True)}, clip_norm_settings)


class Adam(Optimizer):
    _keys = {"defaultLearningRate": 0.1, "defaultWeightDecay": 0.0, "defaultBeta1": 0.9, "defaultBeta2": 0.999,
             "defaultEps": 1e-6, "lossScaling": 1.0, "maxWeightNorm": math.inf}
    _global = ("lossScaling", "maxWeightNorm")

    def __init__(self, values: Optional[dict] = None, mode=AdamMode.Adam, weight_decay_mode=WeightDecayMode.Decay,
                 accum_type=None, accl1_type=None, accl2_type=None, clip_norm_settings=(),
                 scaled_optimizer_state=False, debugContext="adam"):
        super().__init__(dict(values or {}), clip_norm_settings, debugContext)
        self.mode = AdamMode(int(mode))
        self.weight_decay_mode = WeightDecayMode(int(weight_decay_mode))

    def to_torch(self, params: dict[str, torch.nn.Parameter]):
        from .. import optim
        groups = self._groups(params, ["defaultLearningRate", "defaultWeightDecay", "defaultBeta1", "defaultBeta2",
                                       "defaultEps"])
        for g in groups:
            if "defaultLearningRate" in g:
                g["lr"] = g.pop("defaultLearningRate")
                g["weight_decay"] = g.pop("defaultWeightDecay")
                g["betas"] = (g.pop("defaultBeta1"), g.pop("defaultBeta2"))
                g["eps"] = g.pop("defaultEps")
            g.pop("popart_weight", None)
        common = dict(lr=self.value("defaultLearningRate"), betas=(self.value("defaultBeta1"),
                                                                   self.value("defaultBeta2")),
                      eps=self.value("defaultEps"), weight_decay=self.value("defaultWeightDecay"))
        scaling = self.value("lossScaling")
        if self.mode in (AdamMode.Lamb, AdamMode.LambNoBias):
            return self._with_clipping(optim.LAMB(groups, bias_correction=self.mode == AdamMode.Lamb,
                                                  loss_scaling=scaling, max_weight_norm=self.value("maxWeightNorm"),
                                                  **common), params)
        if self.mode == AdamMode.AdaMax:
            if self.weight_decay_mode == WeightDecayMode.Decay and self.value("defaultWeightDecay"):
                raise popart_exception(messages.ADAMAX_DECOUPLED_DECAY_UNSUPPORTED)
            return self._with_clipping(torch.optim.Adamax(groups, **common), params, native=False)
        bias = self.mode == AdamMode.Adam
        if self.weight_decay_mode == WeightDecayMode.Decay:
            return self._with_clipping(optim.AdamW(groups, loss_scaling=scaling, bias_correction=bias, **common),
                                       params)
        if not bias:
            raise popart_exception(messages.ADAM_NO_BIAS_L2_UNSUPPORTED)
        return self._with_clipping(optim.Adam(groups, loss_scaling=scaling, **common), params)


class _ClipByNorm:
    """A step pre-hook clipping each group's gradients (in place) by its global norm, as PopART's
    ClipWeightGradientsByNorm transform: ``g *= maxNorm / max(maxNorm, sqrt(sum ||g_i||^2))``."""

    def __init__(self, groups):
        self.groups = groups

    @torch.no_grad()
    def __call__(self, optimizer, args, kwargs):
        for params, max_norm in self.groups:
            grads = [p.grad for p in params if p.grad is not None]
            if not grads:
                continue
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
            factor = max_norm / torch.clamp(norm, min=max_norm)
            for g in grads:
                g.mul_(factor.to(device=g.device, dtype=g.dtype))


class Adaptive(Optimizer):
    """PopART's adaptive optimizers (AdaGrad, RMSProp, centered RMSProp, AdaDelta) with its update
    equations, weight-decay modes, momentum, TensorFlow's RMSProp variant and per-weight values; see
    ``_AdaptiveUpdate``."""
    _keys = {"defaultLearningRate": 0.01, "defaultWeightDecay": 0.0, "defaultAlpha": 0.99, "defaultMomentum": 0.0,
             "defaultEps": 1e-6, "lossScaling": 1.0}
    _global = ("lossScaling",)
    _per_group = {"lr": "defaultLearningRate", "weight_decay": "defaultWeightDecay", "alpha": "defaultAlpha",
                  "momentum": "defaultMomentum", "eps": "defaultEps"}

    def __init__(self, values: Optional[dict] = None, mode=AdaptiveMode.RMSProp,
                 weight_decay_mode=WeightDecayMode.Decay, accum_type=None, accl1_type="FLOAT", accl2_type="FLOAT",
                 accl3_type=None, rmsprop_tf_variant=False, debugContext="adaptive", *, rmspropTFVariant=None):
        super().__init__(dict(values or {}), (), debugContext)
        self.mode = AdaptiveMode(int(mode))
        self.weight_decay_mode = WeightDecayMode(int(weight_decay_mode))
        self.rmsprop_tf_variant = bool(rmsprop_tf_variant if rmspropTFVariant is None else rmspropTFVariant)
        self.accl_types = (_dtype_or_none(accl1_type), _dtype_or_none(accl2_type), _dtype_or_none(accl3_type))

    def _uses_momentum(self, weight_id=None) -> bool:
        value, const = self._defaults["defaultMomentum"]
        if weight_id is not None and "defaultMomentum" in self._specific.get(weight_id, {}):
            value, const = self._specific[weight_id]["defaultMomentum"]
        return not const or value > 0.0

    def to_torch(self, params: dict[str, torch.nn.Parameter]):
        groups = self._groups(params, list(self._per_group.values()))
        for g in groups:
            weight = g.pop("popart_weight", None)
            for torch_key, key in self._per_group.items():
                if key in g:
                    g[torch_key] = g.pop(key)
            g["use_momentum"] = self._uses_momentum(weight)
        return _AdaptiveUpdate(groups, mode=self.mode, decay=self.weight_decay_mode == WeightDecayMode.Decay,
                               tf_variant=self.rmsprop_tf_variant, accl_types=self.accl_types,
                               loss_scaling=self.value("lossScaling"),
                               **{k: self.value(key) for k, key in self._per_group.items()},
                               use_momentum=self._uses_momentum())


def _dtype_or_none(name):
    """An accumulator's data type (a PopART name or DataType), None for "the weight's"."""
    if name is None:
        return None
    name = str(getattr(name, "name", name)).upper()
    if name in ("UNDEFINED", ""):
        return None
    from .tensorinfo import torch_dtype
    return torch_dtype(name)


class _AdaptiveUpdate(torch.optim.Optimizer):
    """PopART's Adaptive update for a weight ``w`` with gradient ``g`` (unscaled by the loss scaling),
    accumulators ``a1`` (float32 by default; TensorFlow's variant starts it at ones), ``a2`` (float32)
    and ``a3`` (the weight's type):

    * L2 regularisation: ``g += wd * w``;
    * ``a1 += g^2`` (AdaGrad) or ``a1 = alpha * a1 + (1 - alpha) * g^2``;
    * centered RMSProp: ``a2 = alpha * a2 + (1 - alpha) * g``;
    * updater ``u``: AdaDelta ``sqrt(a2 + eps) / sqrt(a1 + eps) * g`` then ``a2 = alpha * a2 + (1 - alpha) * u^2``;
      otherwise ``g / (sqrt(r) + eps)``, TensorFlow's variant ``g / sqrt(r + eps)``, with ``r = a1`` (centered:
      ``a1 - a2^2``);
    * momentum (non-zero or not constant): ``a3 = m * a3 + u`` (TensorFlow's variant: ``+ lr * u``), ``u = a3``;
    * decay mode: ``w = (1 - lr * wd) * w - lr * u`` (TensorFlow's variant with momentum: ``w * (1 - wd) - u``);
      L2 mode: ``w -= lr * u`` (``w -= u``).
    """

    def __init__(self, params, *, mode, decay: bool, tf_variant: bool, accl_types, loss_scaling: float, lr: float,
                 weight_decay: float, alpha: float, momentum: float, eps: float, use_momentum: bool):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, alpha=alpha, momentum=momentum, eps=eps,
                                      use_momentum=use_momentum))
        self.mode = mode
        self.decay = decay
        self.tf_variant = tf_variant
        self.accl_types = accl_types
        self.loss_scaling = loss_scaling

    def _state(self, p, name, dtype, fill=0.0):
        state = self.state[p]
        if name not in state:
            state[name] = torch.full_like(p, fill, dtype=dtype or p.dtype, memory_format=torch.preserve_format)
        return state[name]

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:  # (torch's optimizers' contract: re-evaluate the model first)
            with torch.enable_grad():
                loss = closure()
        accl1_type, accl2_type, accl3_type = self.accl_types
        for group in self.param_groups:
            lr, wd, alpha, m, eps = (float(group[k]) for k in ("lr", "weight_decay", "alpha", "momentum", "eps"))
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if not self.decay and wd != 0.0:
                    g = g + wd * p
                a1 = self._state(p, "accl1", accl1_type, 1.0 if self.tf_variant else 0.0)
                ga = g.to(a1.dtype)
                if self.mode == AdaptiveMode.AdaGrad:
                    a1.addcmul_(ga, ga)
                else:
                    a1.mul_(alpha).addcmul_(ga, ga, value=1.0 - alpha)
                if self.mode == AdaptiveMode.AdaDelta:
                    a2 = self._state(p, "accl2", accl2_type)
                    u = (a2.to(a1.dtype) + eps).sqrt().div_((a1 + eps).sqrt()).mul_(ga)
                    a2.mul_(alpha).addcmul_(u.to(a2.dtype), u.to(a2.dtype), value=1.0 - alpha)
                else:
                    rms = a1
                    if self.mode == AdaptiveMode.CenteredRMSProp:
                        a2 = self._state(p, "accl2", accl2_type)
                        a2.mul_(alpha).add_(g.to(a2.dtype), alpha=1.0 - alpha)
                        rms = a1 - a2.to(a1.dtype).square()
                    u = ga / ((rms + eps).sqrt() if self.tf_variant else rms.sqrt().add_(eps))
                u = u.to(g.dtype)
                lr_in_updater = False
                if group["use_momentum"]:
                    a3 = self._state(p, "accl3", accl3_type)
                    if self.tf_variant:
                        u = u * lr
                        lr_in_updater = True
                    a3.mul_(m).add_(u.to(a3.dtype))
                    u = a3
                u = u.to(p.dtype)
                if lr_in_updater:
                    if self.decay and wd != 0.0:
                        p.mul_(1.0 - wd)
                    p.sub_(u)
                else:
                    if self.decay and wd != 0.0:
                        p.mul_(1.0 - lr * wd)
                    p.add_(u, alpha=-lr)
        return loss
