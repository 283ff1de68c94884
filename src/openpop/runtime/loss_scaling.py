"""Automatic (dynamic) loss scaling: ``Options.Training.setAutomaticLossScaling(True)``.

The rule is ``torch.amp.GradScaler``'s. Every optimizer step checks its unscaled gradients:

* some gradient is inf/NaN: the step is skipped (no ``optimizer.step()``: weights and optimizer
  state stay as they were) and the scale is multiplied by ``backoff_factor`` (0.5);
* all finite: the step is applied; after ``growth_interval`` (2000) finite steps in a row the
  scale is multiplied by ``growth_factor`` (2.0).

The current scale *is* the optimizer's ``loss_scaling`` attribute (PopTorch's automatic loss
scaling made ``loss_scaling`` variable and updated it on the device): it starts from the value the
optimizer was built with (1.0 unless given), the executor writes every change back to
``optimizer.loss_scaling``, and a value the user sets (or a new optimizer passed to
``setOptimizer``) is where scaling continues from. The count of finite steps belongs to the
executor and survives ``setOptimizer``.

openpop extras (keyword-only arguments of ``setAutomaticLossScaling``, stored in
``automaticLossScalingSettings`` only when given): ``growth_factor``, ``backoff_factor``,
``growth_interval``.
"""
import math

from ..log import logger

DEFAULTS = {"growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000}


class DynamicLossScaling:
    """The persistent part of automatic loss scaling (settings and the finite-step count)."""

    def __init__(self, growth_factor: float = 2.0, backoff_factor: float = 0.5, growth_interval: int = 2000):
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.finite_steps = 0      # finite steps since the last change of scale
        self.skipped_steps = 0     # total steps skipped (for users and tests)

    @classmethod
    def from_options(cls, options):
        """None unless ``Training.setAutomaticLossScaling(True)``."""
        settings = options.Training.automaticLossScalingSettings
        if not settings.get("enabled", False):
            return None
        return cls(**{key: settings.get(key, default) for key, default in DEFAULTS.items()})

    def bind(self, optimizer) -> "BoundLossScaling":
        return BoundLossScaling(self, optimizer)

    def next_scale(self, scale: float, finite: bool) -> float:
        """The scale after a step whose gradients were (not) all finite (``scaling_rule``)."""
        new, self.finite_steps = scaling_rule(scale, self.finite_steps, finite, self.growth_factor,
                                              self.backoff_factor, self.growth_interval)
        if not finite:
            self.skipped_steps += 1
            logger.info("Automatic loss scaling: non-finite gradients, optimizer step skipped; "
                        "loss scaling %g -> %g", scale, new)
        return new


def _pick(condition, if_true, if_false):
    return if_true if condition else if_false


def scaling_rule(scale, finite_steps, finite, growth_factor, backoff_factor, growth_interval, *, where=_pick,
                 isfinite=math.isfinite):
    """``torch.amp.GradScaler``'s rule, written once: ``(scale, finite_steps)`` after a step whose
    gradients were (``finite``) or were not all finite. Eager runs it on Python numbers; a compiled
    program (``compiled/loss_scaling.py``) traces it on 0-d tensors with ``where=torch.where`` and
    ``isfinite=torch.isfinite``."""
    count = where(finite, finite_steps + 1, 0 * finite_steps)
    grow = count >= growth_interval
    grown = scale * growth_factor
    new = where(finite, where(grow & isfinite(grown), grown, scale), scale * backoff_factor)
    return new, where(grow, 0 * count, count)


class StaticLossScaling:
    """The optimizer's ``loss_scaling`` as it is when a host call starts, never changed."""

    automatic = False

    def __init__(self, optimizer):
        self.scale = float(getattr(optimizer, "loss_scaling", 1.0))

    def update(self, finite: bool) -> float:
        return self.scale


class BoundLossScaling:
    """``DynamicLossScaling`` applied to one optimizer: reads and writes its ``loss_scaling``."""

    automatic = True

    def __init__(self, state: DynamicLossScaling, optimizer):
        self.state = state
        self.optimizer = optimizer

    @property
    def scale(self) -> float:
        return float(getattr(self.optimizer, "loss_scaling", 1.0))

    def update(self, finite: bool) -> float:
        new = self.state.next_scale(self.scale, finite)
        self.optimizer.loss_scaling = new
        return new
