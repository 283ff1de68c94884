"""Each process's share of a map-style dataset when several processes train together.

With ``Options.Distributed.numProcesses > 1`` every process builds the same ``DataLoader``
and reads a contiguous slice of the data. Shuffling is global: all processes draw the same
permutation of the whole dataset from a generator seeded with ``Options.randomSeed()``, so
their slices stay disjoint. When ``drop_last`` leaves elements out of an epoch, those
elements are moved to the front of the next epoch's order, so none is skipped twice in a row.
"""
from typing import Optional

import torch

from . import messages
from .messages import BATCH_SIZE_REQUIRED, RANDOM_SEED_REQUIRED


def process_slice(num_elements: int, combined_batch_size: int, num_processes: int, process_id: int,
                  drop_last: bool) -> tuple[int, int]:
    """``(start, length)`` of process ``process_id``'s part of ``num_elements`` elements.

    With ``drop_last`` every process gets the same whole number of combined batches and the
    rest is left out; otherwise the elements are split as evenly as possible, the first
    ``num_elements % num_processes`` processes getting one more.
    """
    if drop_last:
        per_process = combined_batch_size * (num_elements // (combined_batch_size * num_processes))
        return process_id * per_process, per_process
    base, remainder = divmod(num_elements, num_processes)
    start = process_id * base + min(process_id, remainder)
    return start, base + (1 if process_id < remainder else 0)


class DistributedShard(torch.utils.data.Dataset):
    """The part of ``dataset`` this process reads; call ``start_epoch()`` before each pass.

    Until the first ``start_epoch()`` a shuffled shard reads the unshuffled order.
    """

    def __init__(self, dataset, options, combined_batch_size: Optional[int], drop_last: bool, shuffle: bool):
        if combined_batch_size is None:
            raise AssertionError(BATCH_SIZE_REQUIRED)
        self.dataset = dataset
        self.num_processes = options.Distributed.numProcesses
        self.process_id = options.Distributed.processId
        total = len(dataset)
        self._start, self._length = process_slice(total, combined_batch_size, self.num_processes,
                                                  self.process_id, drop_last)
        self._order = None
        self._generator = None
        if shuffle:
            if not options.exists("random_seed"):
                raise AssertionError(RANDOM_SEED_REQUIRED)
            self._generator = torch.Generator()
            self._generator.manual_seed(options.random_seed)
            self._used_per_epoch = total if not drop_last else self._length * self.num_processes
            # Shared memory: persistent DataLoader workers must see each new epoch's order.
            self._order = torch.arange(total).share_memory_()
            self._epochs_started = 0

    @property
    def shuffled(self) -> bool:
        return self._order is not None

    def start_epoch(self) -> None:
        """Draw this epoch's global order (identical in every process); no-op without shuffle."""
        if self._order is None:
            return
        permutation = torch.randperm(len(self._order), generator=self._generator)
        if self._epochs_started > 0:
            permutation = _leftovers_first(permutation, self._order[self._used_per_epoch:])
        self._order.copy_(permutation)
        self._epochs_started += 1

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int):
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError(messages.SHARD_INDEX_OUT_OF_RANGE.format(index=index, length=self._length))
        position = self._start + index
        if self._order is not None:
            position = int(self._order[position])
        return self.dataset[position]


def _leftovers_first(permutation: torch.Tensor, leftovers: torch.Tensor) -> torch.Tensor:
    """``permutation`` reordered so that ``leftovers`` come first, in their previous order."""
    if len(leftovers) == 0:
        return permutation
    is_leftover = torch.zeros(len(permutation), dtype=torch.bool)
    is_leftover[leftovers] = True
    return torch.cat([leftovers, permutation[~is_leftover[permutation]]])
