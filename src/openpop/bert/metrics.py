"""Step metrics as the recipe reports them, and BERT's model FLOPs.

The model returns ``(total_loss, mlm_loss, nsp_loss, mlm_acc, nsp_acc)`` with
``OutputMode.Sum``: each summed over the ``device_iterations x gradient_accumulation``
micro-batches of a host call, one row per replica. ``step_metrics`` divides by that factor
and averages the replicas. Accuracies are fractions in [0, 1] printed with a '%' sign, as
the recipe prints them.
"""
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Optional

import torch

from .config import BertRunConfig

OUTPUT_NAMES = ("total_loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc")


@dataclass
class StepMetrics:
    step: int
    lr: float
    total_loss: float
    mlm_loss: float
    nsp_loss: float
    mlm_acc: float
    nsp_acc: float
    throughput: float
    seconds: float

    def as_dict(self):
        return asdict(self)


def reduce_outputs(outputs: Sequence[torch.Tensor], config: BertRunConfig):
    """Per output: sum over DI x GA micro-batches -> mean per micro-batch, averaged over replicas."""
    factor = config.gradient_accumulation * config.device_iterations
    return [float(o.detach().float().div(factor).mean()) for o in outputs]


def step_description(m: StepMetrics, config: BertRunConfig) -> str:
    return f"Step: {m.step} / {config.training_steps - 1} - {metrics_text(m)}"


def metrics_text(m: StepMetrics) -> str:
    """A step's learning rate, losses and accuracies as the recipe's log lines print them."""
    return (f"LR: {m.lr:.2e} - total loss: {m.total_loss:3.3f} - mlm_loss: {m.mlm_loss:3.3f} - "
            f"nsp_loss: {m.nsp_loss:3.3f} - mlm_acc: {m.mlm_acc:3.3f} % - nsp_acc: {m.nsp_acc:3.3f} %")


def throughput_text(m: StepMetrics) -> str:
    return f"throughput: {m.throughput:.1f} samples/sec"


# --------------------------------------------------------------------------- FLOPs
def forward_flops_per_token(hidden: int, layers: int, intermediate: int, sequence_length: int) -> float:
    """Encoder matmul FLOPs per token of one forward pass (2 FLOPs per multiply-add):
    QKV + attention output (4 H^2) and the feed-forward (2 H FF) per layer, plus the
    attention scores and context (4 S H per layer)."""
    dense = layers * 2 * (4 * hidden * hidden + 2 * hidden * intermediate)
    attention = layers * 4 * sequence_length * hidden
    return dense + attention


def training_flops_per_sample(config: BertRunConfig, predicted_tokens: Optional[int] = None) -> float:
    """Model FLOPs to train on one sequence: 3 x forward (forward + backward at twice its cost);
    the MLM head counts for the ``mask_tokens`` positions it is computed on, pooler and NSP
    head once. Recomputation is not counted (hardware FLOPs, not model FLOPs)."""
    h, v, s = config.hidden_size, config.vocab_size, config.sequence_length
    p = config.mask_tokens if predicted_tokens is None else predicted_tokens
    encoder = s * forward_flops_per_token(h, config.num_hidden_layers, config.intermediate_size, s)
    mlm_head = p * (2 * h * h + 2 * h * v)
    pooler_nsp = 2 * h * h + 2 * h * 2
    return 3.0 * (encoder + mlm_head + pooler_nsp)
