"""``IPUPrecision``: Lightning's ``precision=`` for ``accelerator="ipu"``.

==============  ==============================================================================
``"32-true"``   float32 weights and compute.
``"16-mixed"``  float32 weights; each micro-batch's forward under ``torch.autocast`` float16;
                dynamic loss scaling (openpop's automatic loss scaling, starting at 2**16 as
                ``torch.amp.GradScaler`` does) unless ``training_opts`` set loss scaling.
``"bf16-mixed"`` as ``"16-mixed"`` with bfloat16, no loss scaling needed.
``"16-true"``   weights converted to float16 (``module.half()``), float inputs cast to float16,
                new tensors created in float16 inside the steps.
``"bf16-true"`` the same with bfloat16.
==============  ==============================================================================

``"16-mixed"`` with a model the user cast to float16 (``model.half()``, any float16 parameter)
trains it in pure float16, as Lightning 2.0 did: the parameters stay float16 (nothing converts
them), float inputs are cast to float16, no autocast, and no automatic loss scaling unless
``training_opts`` set it (2.0 had none; a static ``loss_scaling`` of a poptorch optimizer
applies as usual). Mixed precision's float32 master weights would need a copy of the user's
model, and ``torch.amp``-style loss scaling of float16 gradients skips the first steps, so
neither matches what such a script did on IPUs.

With automatic optimization the executor does backward and the optimizer steps, so this
plugin's ``backward`` and ``optimizer_step`` only hand over to it; with manual optimization they
behave as Lightning's (the steps run on the host, see ``manual_optimization.py``).
"""
import contextlib
from typing import Any, Callable, Optional

import torch
from lightning_utilities.core.apply_func import apply_to_collection

from ..runtime import half_compute
from ._framework import module, pl

SUPPORTED = ("32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true")
UNSUPPORTED = ("`Trainer(accelerator='ipu', precision={precision!r})` is not supported. "
               "`precision` must be one of: {supported}.")
BACKWARD_IGNORED = ("You have overridden the `LightningModule.backward` hook but it will be ignored since openpop "
                    "does the backward pass inside the IPU executor with automatic optimization. Use manual "
                    "optimization (`self.automatic_optimization = False`) to run your own backward.")
LBFGS_AUTOMATIC = ("IPUs and the LBFGS optimizer are not compatible with automatic optimization: its closure "
                   "re-evaluates the model, which one host call cannot do. Use manual optimization "
                   "(`self.automatic_optimization = False` and `opt.step(closure)` in `training_step`).")
FP16_INITIAL_LOSS_SCALE = 2.0 ** 16

_DTYPES = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16, "16-true": torch.float16,
           "bf16-true": torch.bfloat16}
_ALIASES = {"32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed", "32-true": "32-true"}


def normalise(precision: Any) -> str:
    text = str(precision)
    return _ALIASES.get(text, text)


class IPUPrecision(pl.plugins.precision.Precision):
    """The precision plugin of ``IPUStrategy``.

    Args:
        precision: ``"32-true"`` (default), ``"16-mixed"`` (autocast with dynamic loss
            scaling), ``"bf16-mixed"``, ``"16-true"`` or ``"bf16-true"``, or Lightning's
            other spellings of them.

    Raises:
        ValueError: Another precision.
    """

    def __init__(self, precision: Any = "32-true") -> None:
        name = normalise(precision)
        if name not in SUPPORTED:
            raise ValueError(UNSUPPORTED.format(precision=precision, supported=SUPPORTED))
        self.precision = name
        self.dtype = _DTYPES.get(name, torch.float32)
        self.half_model = False  # "16-mixed" on a model holding float16 parameters: pure float16
        self._warned_backward = False

    @property
    def mixed(self) -> bool:
        """Autocast over float32 weights."""
        return self.precision.endswith("-mixed") and not self.half_model

    @property
    def wants_loss_scaling(self) -> bool:
        return self.precision == "16-mixed" and not self.half_model

    def adapt_to_module(self, module_: torch.nn.Module) -> None:
        """Decide pure float16 for ``"16-mixed"`` from the parameters ``module_`` holds."""
        self.half_model = self.precision == "16-mixed" and _holds_half(module_)

    @property
    def casts_inputs(self) -> bool:
        return self.true_low_precision or self.half_model

    @property
    def true_low_precision(self) -> bool:
        return self.precision in ("16-true", "bf16-true")

    # ------------------------------------------------------------------ options
    def prepare_optimizer(self, optimizer, options) -> None:
        """fp16 mixed precision's dynamic loss scaling (set in the options, ``run_options.py``)
        starts from ``torch.amp.GradScaler``'s scale."""
        if self.wants_loss_scaling and options.Training.automaticLossScalingSettings.get("enabled") \
                and getattr(optimizer, "loss_scaling", None) is None:
            optimizer.loss_scaling = FP16_INITIAL_LOSS_SCALE

    # ------------------------------------------------------------------ modules and data
    def convert_module(self, module_: torch.nn.Module) -> torch.nn.Module:
        if self.true_low_precision:
            return module_.to(dtype=self.dtype)
        return module_

    def convert_input(self, data: Any) -> Any:
        if not self.casts_inputs:
            return data
        return self._cast_floats(data)

    def convert_batch(self, data: Any, module_: Optional[torch.nn.Module]) -> Any:
        """``IPUStrategy.batch_to_device``'s cast: floating-point tensors (float64 included) to
        this precision's dtype, others untouched, when the run computes in it (``convert_input``).
        ``"16-mixed"`` casts also before the plugin has seen the module (no module yet, or one
        holding float16 parameters, as after ``model.half()``): Lightning 2.0's IPU strategy cast
        every ``"16-mixed"`` batch, since its pure-half mode was the user's ``model.half()``."""
        if self.casts_inputs or (self.precision == "16-mixed" and (module_ is None or _holds_half(module_))):
            return self._cast_floats(data)
        return data

    def _cast_floats(self, data: Any) -> Any:
        return apply_to_collection(data, torch.Tensor,
                                   lambda t: t.to(self.dtype) if torch.is_floating_point(t) else t)

    def convert_output(self, data: Any) -> Any:
        if not self.true_low_precision:
            return data
        return apply_to_collection(data, torch.Tensor,
                                   lambda t: t.to(torch.get_default_dtype()) if torch.is_floating_point(t) else t)

    @contextlib.contextmanager
    def _default_dtype(self):
        previous = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            yield
        finally:
            torch.set_default_dtype(previous)

    def tensor_init_context(self):
        return self._default_dtype() if self.true_low_precision else contextlib.nullcontext()

    def module_init_context(self):
        return self.tensor_init_context()

    @contextlib.contextmanager
    def forward_context(self):
        """Entered around every micro-batch of a step (not around backward or the optimizer)."""
        if self.mixed:
            with half_compute.autocast(self.dtype):  # torch.autocast; slow CPU half matmuls in float32
                yield
        elif self.true_low_precision:
            with self._default_dtype():
                yield
        else:
            yield

    def traced_forward(self):
        """``(factories, stepwise)`` as ``RunPrecision.traced_forward``: the contexts of
        ``forward_context`` that a compiled program enters around each traced micro-batch (mixed
        precision: ``half_compute.autocast_contexts``). Other precisions: none; the step enters
        its ``forward_context`` itself."""
        return half_compute.autocast_contexts(self.dtype) if self.mixed else ([], False)

    # The strategy applies forward_context per micro-batch; the host call itself gets none.
    @contextlib.contextmanager
    def train_step_context(self):
        yield

    val_step_context = test_step_context = predict_step_context = train_step_context

    # ------------------------------------------------------------------ optimization
    def backward(self, tensor, model, optimizer, *args: Any, **kwargs: Any) -> None:
        if model.automatic_optimization:
            if not self._warned_backward and _overrides(model, "backward"):
                pl.utilities.rank_zero_warn(BACKWARD_IGNORED)
                self._warned_backward = True
            return None  # the executor back-propagated every micro-batch already
        return super().backward(tensor, model, optimizer, *args, **kwargs)

    def optimizer_step(self, optimizer, model, closure: Callable[[], Any], **kwargs: Any) -> Any:
        if not model.automatic_optimization:
            return super().optimizer_step(optimizer, model=model, closure=closure, **kwargs)
        if isinstance(optimizer, torch.optim.LBFGS):
            raise module("utilities.exceptions").MisconfigurationException(LBFGS_AUTOMATIC)
        # The closure runs the host call: device_iterations optimizer steps happen inside it,
        # each preceded by Lightning's on_before_optimizer_step hooks and gradient clipping
        # (see optimizer_steps.py). Nothing is left to do afterwards.
        return closure()


def _holds_half(module_: torch.nn.Module) -> bool:
    return any(p.dtype == torch.float16 for p in module_.parameters())


def _overrides(model, name: str) -> bool:
    method = getattr(type(model), name, None)
    return method is not None and method is not getattr(pl.LightningModule, name, None)
