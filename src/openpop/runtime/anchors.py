"""Anchored tensors: ``Options.anchorTensor(short, long)`` and ``getAnchoredTensor(short)``.

PopTorch names the tensors of its PopART graph; openpop answers the names users anchor in
practice, for parameters and buffers (``fc2.bias``; the traced form ``model.fc2.bias`` also
works):

* ``Gradient___<parameter>``: the gradient the optimizer applied at a step — summed over the
  step's micro-batches and replicas, then reduced as the options say (Mean/Sum), loss scaling
  removed. (With gradient accumulation PopART's tensor of that name is one micro-batch's
  gradient; openpop keeps only the accumulated one.)
* ``UpdatedVar___<parameter>``: the parameter after the step's update.
* ``<parameter or buffer>``: its value after the step (inference: after the batch).

Each anchor follows its own output mode (default: the model's): ``All`` stacks the value of
every step, ``EveryN`` every N-th, ``Final`` keeps the last, ``Sum`` adds them up.
"""
from typing import Callable, Optional

import torch

from .. import errors
from ..enums import OutputMode
from . import messages
from .outputs import returned

GRADIENT = "Gradient___"
UPDATED = "UpdatedVar___"


class Anchor:
    """One anchored tensor: ``kind`` is ``GRADIENT``, ``UPDATED`` or "" (the value itself) of
    ``tensor`` (a parameter or buffer)."""

    def __init__(self, kind: str, tensor: torch.Tensor, mode: OutputMode, period: int):
        self.kind = kind
        self.tensor = tensor
        self.mode = mode
        self.period = period
        self.values: list[torch.Tensor] = []

    def read(self) -> Optional[torch.Tensor]:
        return self.tensor.grad if self.kind == GRADIENT else self.tensor

    def record(self, step: int, last: bool, value: Optional[Callable[[], torch.Tensor]] = None) -> None:
        """Keep the step's value if the anchor's output mode returns it. ``value``: where it comes
        from instead of ``read`` (the compiled backend's per-step values)."""
        mode = self.mode
        if not returned(mode, self.period, step, last):
            return
        value = (value or self.read)()
        if value is None:
            return
        value = value.detach().to("cpu", copy=True)
        if mode == OutputMode.Sum and self.values:
            self.values[0] += value
        elif mode in (OutputMode.Sum, OutputMode.Final):
            self.values = [value]
        else:
            self.values.append(value)

    def result(self):
        if not self.values:
            return None
        if self.mode in (OutputMode.All, OutputMode.EveryN):
            return torch.stack(self.values)
        return self.values[0]


class AnchoredTensors:
    """The anchors of one executor, resolved against its model at compile."""

    def __init__(self, anchored: dict[str, list], model: torch.nn.Module, default_mode: OutputMode,
                 default_period: int, training: bool):
        params = dict(model.named_parameters(remove_duplicate=False))
        buffers = dict(model.named_buffers(remove_duplicate=False))
        self._anchors: dict[str, Anchor] = {}
        for short_name, (long_name, use_default, mode, period) in anchored.items():
            kind, tensor = _resolve(long_name, params, buffers, training)
            if use_default or mode is None:  # the model's output mode, period included
                mode, period = default_mode, default_period
            mode = OutputMode(mode)
            if mode == OutputMode.Default:
                mode = OutputMode.Final if training else OutputMode.All
            if mode == OutputMode.EveryN and (not isinstance(period, int) or period < 1):
                raise errors.createPoptorchError(messages.ANCHOR_PERIOD.format(name=short_name, period=period))
            self._anchors[short_name] = Anchor(kind, tensor, mode, period if mode == OutputMode.EveryN else 1)
        self.memory: dict[str, torch.Tensor] = {}

    def __bool__(self) -> bool:
        return bool(self._anchors)

    def anchors(self) -> list[Anchor]:
        return list(self._anchors.values())

    def start_call(self) -> None:
        for anchor in self._anchors.values():
            anchor.values = []

    def record(self, step: int, steps: int) -> None:
        for anchor in self._anchors.values():
            anchor.record(step, last=step == steps - 1)

    def finish_call(self) -> None:
        self.memory = {name: anchor.result() for name, anchor in self._anchors.items()}


def _resolve(long_name: str, params: dict, buffers: dict, training: bool):
    """(kind, the parameter or buffer) an anchor's long name refers to."""
    kind = ""
    name = long_name
    for prefix in (GRADIENT, UPDATED):
        if long_name.startswith(prefix):
            kind, name = prefix, long_name[len(prefix):]
    tensor = _find(name, params) if kind else _find(name, {**params, **buffers})
    if tensor is None or (kind and not training):
        known = ", ".join(list(params)[:4] + (["..."] if len(params) > 4 else []))
        hint = messages.ANCHOR_HINT_TRAINING if training else messages.ANCHOR_HINT_INFERENCE
        raise errors.createPoptorchError(messages.ANCHOR_NOT_FOUND.format(name=long_name, known=known, hint=hint))
    return kind, tensor


def _find(name: str, tensors: dict):
    if name in tensors:
        return tensors[name]
    if name.startswith("model."):  # PopTorch's traced graphs prefix the names with "model."
        return tensors.get(name[len("model."):])
    return None
