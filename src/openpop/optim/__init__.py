"""openpop's optimizers — what ``poptorch.optim`` serves.

``SGD``, ``Adam``, ``AdamW`` and ``RMSprop`` extend the torch optimizers of the same name
(``isinstance`` works both ways) and ``LAMB`` extends ``torch.optim.Optimizer``; all derive
from ``openpop.optim.Optimizer``. They take PopTorch's constructor arguments (every extra
defaults to None = torch's default) plus current torch's, and are real optimizers: ``step()``
implements the update and works outside any executor.

The executor-facing helpers (``validate_optimizer``, ``loss_scaling_of``,
``uses_float16_accumulators``, ``snapshot``, ``constant_attribute_changes``,
``constant_attribute_error``) live in ``openpop.optim.checks`` and are importable from here,
but are not part of ``poptorch.optim``'s public names.
"""
from ._base import Optimizer, VariableAttributes
from .adam import Adam, AdamW
from .checks import (
                     constant_attribute_changes,
                     constant_attribute_error,
                     loss_scaling_of,
                     optimizer_kind,
                     snapshot,
                     uses_float16_accumulators,
                     validate_optimizer,
                     variable_attributes_of,
)
from .lamb import LAMB
from .rmsprop import RMSprop
from .sgd import SGD

__all__ = ["LAMB", "SGD", "Adam", "AdamW", "Optimizer", "RMSprop", "VariableAttributes"]
