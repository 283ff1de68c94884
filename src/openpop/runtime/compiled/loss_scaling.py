"""Loss scaling inside a compiled program: the scale is program state, carried from step to step.

``ScalingState`` gives the program its scaling as a dict of tensors - ``{"scale"}`` for a static
``loss_scaling``, plus ``finite_steps`` and ``history`` (one flag per device iteration: were
its gradients finite) with automatic loss scaling - and, traced, applies
``runtime/loss_scaling.py``'s rule (``scaling_rule``, the one eager runs) to one step: an update
computed from non-finite gradients is discarded (``torch.where`` on the new parameters and
optimizer state), the scale backs off, or grows after ``growth_interval`` finite steps in a row.
The host then replays the call's ``history`` through the executor's own ``DynamicLossScaling``
(``commit``), which writes the optimizer's ``loss_scaling``, keeps the finite-step count, counts
and logs skipped steps exactly as eager does; the program's own copy of the scale only serves the steps inside the call.
"""
import torch

from ...torch_compat import pytree
from ..loss_scaling import scaling_rule


class ScalingState:
    """One program's loss scaling (see the module docstring). ``dynamic``: the executor's
    ``DynamicLossScaling``, or None for static loss scaling."""

    def __init__(self, dynamic, steps: int):
        self.automatic = dynamic is not None
        self.steps = steps
        if dynamic is not None:
            self.growth_factor = dynamic.growth_factor
            self.backoff_factor = dynamic.backoff_factor
            self.growth_interval = float(dynamic.growth_interval)

    def inputs(self, scale: torch.Tensor, dynamic=None) -> dict:
        """The program's scaling inputs; ``scale`` is the 0-d float32 ``loss_scaling``."""
        if not self.automatic:
            return {"scale": scale}
        device = scale.device
        return {"scale": scale, "finite_steps": torch.tensor(float(dynamic.finite_steps), device=device),
                "history": torch.zeros(self.steps, dtype=torch.bool, device=device)}

    # ------------------------------------------------------------------ traced
    def apply(self, scaling, scaled_grads, old, new, index):
        """``(params, state)`` of the step - ``new`` unless ``scaled_grads`` hold inf/NaN, then
        ``old`` - and the scaling after it. ``index``: the step, a 1-element int64 tensor."""
        if not self.automatic:
            return new, scaling
        finite = torch.stack([torch.isfinite(g).all() for g in scaled_grads]).all()
        kept = pytree.tree_map(lambda n, o: torch.where(finite, n, o), new, old)
        scale, count = scaling_rule(scaling["scale"], scaling["finite_steps"], finite, self.growth_factor,
                                    self.backoff_factor, self.growth_interval, where=torch.where,
                                    isfinite=torch.isfinite)
        return kept, {"scale": scale, "finite_steps": count,
                      "history": scaling["history"].index_copy(0, index, finite.reshape(1))}

    # ------------------------------------------------------------------ host
    def commit(self, scaler, scaling) -> None:
        """Replay the call's steps through ``scaler`` (``RunPrecision.loss_scaler``: writes
        ``loss_scaling`` back to the optimizer, as eager's steps do)."""
        if self.automatic:
            for finite in scaling["history"].tolist():
                scaler.update(bool(finite))
