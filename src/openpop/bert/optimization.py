"""Optimizer and learning-rate schedule, as the recipe sets them up.

* Weight matrices decay by ``weight_decay``; one-dimensional parameters (biases, LayerNorm)
  do not (and, for LAMB, get a trust ratio of 1 through ``max_weight_norm=0``).
* ``AdamW`` without bias correction, ``LAMB`` with it, ``LAMBNoBiasCorrection`` without;
  ``eps=1e-6``; the config's ``loss_scaling``; ``weight_decay`` (and ``max_weight_norm``)
  constant after compilation.
* The schedule warms the learning rate up linearly over ``lr_warmup * training_steps`` steps,
  then keeps it (``constant``) or decays it linearly to 0 at ``training_steps`` (``linear``).
  It steps once per training step (host call).
"""
import torch

import poptorch

from .config import BertRunConfig


def parameter_groups(model: torch.nn.Module, config: BertRunConfig, lamb: bool):
    decayed, plain = [], []
    for param in model.parameters():
        if param.requires_grad:
            (plain if param.dim() == 1 else decayed).append(param)
    groups = [{"params": decayed, "weight_decay": config.weight_decay},
              {"params": plain, "weight_decay": 0.0}]
    if lamb:
        groups[1]["max_weight_norm"] = 0
    return groups


def get_optimizer(config: BertRunConfig, model: torch.nn.Module):
    first_order = torch.float16 if config.enable_half_first_order_momentum else torch.float32
    common = dict(lr=config.learning_rate, weight_decay=0.0, eps=1e-6, loss_scaling=config.loss_scaling,
                  accum_type=torch.float32, first_order_momentum_accum_type=first_order,
                  second_order_momentum_accum_type=torch.float32)
    if config.optimizer == "AdamW":
        optimizer = poptorch.optim.AdamW(parameter_groups(model, config, lamb=False), bias_correction=False,
                                         **common)
    else:
        optimizer = poptorch.optim.LAMB(parameter_groups(model, config, lamb=True), max_weight_norm=None,
                                        bias_correction=config.optimizer == "LAMB", **common)
        optimizer.variable_attrs.markAsConstant("max_weight_norm")
    optimizer.variable_attrs.markAsConstant("weight_decay")
    return optimizer


def lr_factor(step: int, config: BertRunConfig) -> float:
    """Multiplier of ``learning_rate`` after ``step`` scheduler steps."""
    total = config.training_steps
    warmup = int(config.lr_warmup * total)
    if step < warmup:
        return step / max(1, warmup)
    if config.lr_schedule == "linear":
        return max(0.0, (total - step) / max(1, total - warmup))
    return 1.0


def get_lr_scheduler(optimizer, config: BertRunConfig):
    def factor(step: int) -> float:
        return lr_factor(step, config)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
