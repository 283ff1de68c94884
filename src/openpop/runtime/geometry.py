"""Batch geometry: the one place that knows how a combined batch splits into micro-batches.

A host call receives, for every input, a batch dimension of
``device_iterations * gradient_accumulation * (replicas / input_group_size) * micro_batch``
rows laid out in PopART's order ``[DI, GA, R, micro, ...]``. Outputs are assembled back in the
same order (see ``outputs.py``).
"""
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .. import errors
from ..enums import CommGroupType


class MicroBatch(NamedTuple):
    """Where one micro-batch sits in a host call."""

    step: int  # device iteration (optimizer step) it belongs to
    accumulation: int  # gradient-accumulation index within the step
    replica: int  # replica that runs it
    chunk: int  # input chunk that replica reads (replicas of one input group share a chunk)
    index: int  # order within its step: accumulation * replicas + replica


@dataclass(frozen=True)
class BatchGeometry:
    device_iterations: int = 1
    gradient_accumulation: int = 1
    replication_factor: int = 1
    input_group_size: int = 1
    input_group_type: CommGroupType = CommGroupType.Consecutive

    @classmethod
    def from_options(cls, options) -> "BatchGeometry":
        return cls(
            device_iterations=options.device_iterations,
            gradient_accumulation=options.Training.gradient_accumulation,
            replication_factor=options.replication_factor,
            input_group_size=options.input_group_size,
            input_group_type=CommGroupType(options.input_cgt),
        )

    @property
    def input_replicas(self) -> int:
        """How many distinct input chunks the replicas of one accumulation step receive."""
        return self.replication_factor // self.input_group_size

    @property
    def batches_per_call(self) -> int:
        """Micro-batches of input data consumed by one host call (the combined-batch factor)."""
        return self.device_iterations * self.gradient_accumulation * self.input_replicas

    @property
    def micro_batches_per_step(self) -> int:
        """Forward/backward passes that contribute to one optimizer step."""
        return self.gradient_accumulation * self.replication_factor

    @property
    def output_rows_per_call(self) -> int:
        return self.device_iterations * self.gradient_accumulation * self.replication_factor

    def input_chunk_of_replica(self, replica: int) -> int:
        """Replicas in one input group read the same chunk of the combined batch."""
        if self.input_group_size == 1:
            return replica
        if self.input_group_type == CommGroupType.Orthogonal:
            return replica % self.input_replicas
        return replica // self.input_group_size

    def micro_batches(self, steps=None, replicas=None) -> Iterator[MicroBatch]:
        """The micro-batches of a host call in PopART's ``[DI, GA, R]`` order.

        ``steps`` narrows to some device iterations (an ``int`` is one step); ``replicas`` to the
        replicas actually run (a count, default all)."""
        if steps is None:
            steps = range(self.device_iterations)
        elif isinstance(steps, int):
            steps = (steps,)
        replica_count = self.replication_factor if replicas is None else replicas
        for d in steps:
            for g in range(self.gradient_accumulation):
                for r in range(replica_count):
                    yield MicroBatch(d, g, r, self.input_chunk_of_replica(r), g * replica_count + r)

    def input_position(self, micro: MicroBatch) -> int:
        """Where ``micro``'s input rows start in the combined batch, counted in micro-batches."""
        return (micro.step * self.gradient_accumulation + micro.accumulation) * self.input_replicas + micro.chunk

    def check_divisible(self, name: str, tensor: torch.Tensor) -> None:
        if tensor.dim() == 0:
            return
        total = self.batches_per_call
        if tensor.shape[0] % total != 0:
            text = errors.INVALID_BATCH_DIM.format(
                name=name, batch=tensor.shape[0], di=self.device_iterations, rf=self.replication_factor,
                gs=self.input_group_size, ga=self.gradient_accumulation, total=total)
            suggested = max(1, round(tensor.shape[0] / total)) * total
            raise AssertionError(errors.with_fix(text, errors.INVALID_BATCH_DIM_FIX.format(
                name=name, total=total, suggested=suggested)))

    def split(self, tensor: torch.Tensor) -> torch.Tensor:
        """View ``[N*micro, ...]`` as ``[DI, GA, R_in, micro, ...]`` (no copy for contiguous input)."""
        micro = tensor.shape[0] // self.batches_per_call
        return tensor.view(self.device_iterations, self.gradient_accumulation, self.input_replicas, micro,
                           *tensor.shape[1:])


def combined_batch_factor(options) -> int:
    """Micro-batches per host call for ``options`` (what ``poptorch.DataLoader`` multiplies by)."""
    return BatchGeometry.from_options(options).batches_per_call
