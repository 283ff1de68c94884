"""Group a user's batch sampler into combined batches (one host call's worth of data)."""
from collections.abc import Iterable, Iterator, Sequence
from typing import Optional

import torch


class CombinedBatchSampler(torch.utils.data.Sampler):
    """Concatenates ``num_batches_to_combine`` consecutive batches of indices from ``batch_sampler``.

    The collated result of the concatenated indices equals the sampler's batches collated one
    by one and concatenated, so each replica / accumulation step / device iteration receives
    exactly the batch the sampler chose for it. An incomplete last group is dropped when
    ``drop_last``, otherwise returned as a shorter combined batch.
    """

    def __init__(self, batch_sampler: Iterable[Sequence[int]], num_batches_to_combine: int, drop_last: bool):
        self.batch_sampler = batch_sampler
        self.num_batches_to_combine = num_batches_to_combine
        self.drop_last = drop_last

    @property
    def batch_size(self) -> Optional[int]:
        """The combined batch size when the wrapped sampler has a fixed ``batch_size``."""
        inner = getattr(self.batch_sampler, "batch_size", None)
        return inner * self.num_batches_to_combine if isinstance(inner, int) else None

    def __iter__(self) -> Iterator[list[int]]:
        group, count = [], 0
        for batch in self.batch_sampler:
            group.extend(batch)
            count += 1
            if count == self.num_batches_to_combine:
                yield group
                group, count = [], 0
        if count and not self.drop_last:
            yield group

    def __len__(self) -> int:
        batches = len(self.batch_sampler)
        if self.drop_last:
            return batches // self.num_batches_to_combine
        return -(-batches // self.num_batches_to_combine)
