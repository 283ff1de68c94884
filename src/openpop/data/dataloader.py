"""``poptorch.DataLoader``: a torch DataLoader whose every item is one host call's worth of data.

The batch size given by the user is the micro-batch size; the loader yields combined batches of
``batch_size * device_iterations * (replication_factor // input_group_size) *
gradient_accumulation`` elements. With several processes each one reads its own shard of a
map-style dataset (``distributed.py``). The ``Async`` modes load in a separate process through
an ``AsynchronousDataAccessor``.
"""
from collections.abc import Iterable, Sequence
from typing import Any, Optional, Union

import torch
from torch.utils.data import Sampler

from ..enums import DataLoaderMode
from ..errors import Error, with_fix
from ..log import logger
from ..options import Options
from ..runtime import trace
from ..runtime.geometry import BatchGeometry, combined_batch_factor
from . import messages
from .async_accessor import AsynchronousDataAccessor
from .distributed import DistributedShard
from .samplers import CombinedBatchSampler


class DataLoader(torch.utils.data.DataLoader):
    def __init__(self,
                 options: Options,
                 dataset: torch.utils.data.Dataset,
                 batch_size: Optional[int] = 1,
                 shuffle: Optional[bool] = None,
                 num_workers: int = 0,
                 drop_last: bool = True,
                 persistent_workers: Optional[bool] = None,
                 auto_distributed_partitioning: bool = True,
                 mode: DataLoaderMode = DataLoaderMode.Sync,
                 async_options: Optional[dict[str, Any]] = None,
                 rebatched_worker_size: Optional[int] = None,
                 batch_sampler: Optional[Union[Sampler[Sequence], Iterable[Sequence]]] = None,
                 **kwargs):
        """A ``torch.utils.data.DataLoader`` whose batches are whole host calls.

        Each batch holds ``batch_size x device_iterations x replication_factor x
        gradient_accumulation`` samples (``options`` give the factors), in the order a
        model wrapped with the same options splits them. Under ``poprun`` each process
        reads its own share of the dataset.

        Args:
            options (poptorch.Options): The run's options; they are frozen from now on.
            dataset (torch.utils.data.Dataset): A map-style or iterable dataset.
            batch_size (int): The micro-batch size, multiplied into the combined batch size.
            shuffle (bool): As in torch (``None`` means ``False``); with several processes the
                shuffle is global and needs ``options.randomSeed()``.
            num_workers (int): Loading worker processes, as in torch.
            drop_last (bool): Drop the last incomplete combined batch (default ``True``,
                unlike torch).
            persistent_workers (bool): Keep the workers between epochs (default
                ``num_workers > 0``, unlike torch).
            auto_distributed_partitioning (bool): With several processes, give each process
                its own contiguous share of a map-style dataset (default ``True``).
            mode (poptorch.DataLoaderMode): ``Sync`` (default), ``Async`` (load in a separate
                process) or ``AsyncRebatched`` (the torch workers use ``rebatched_worker_size``
                and the loading process re-cuts their batches into combined batches).
            async_options (dict): Keyword arguments of ``AsynchronousDataAccessor``.
            rebatched_worker_size (int): The workers' batch size with ``AsyncRebatched``.
            batch_sampler: Yields micro-batches of indices; consecutive ones are joined into
                combined batches. Excludes ``batch_size`` and ``shuffle``.
            **kwargs: Any other argument of ``torch.utils.data.DataLoader``.
        """
        if not isinstance(options, Options):
            raise AssertionError(messages.NOT_OPTIONS.format(type=type(options).__name__))
        mode = DataLoaderMode(mode)
        shuffle = bool(shuffle)
        if persistent_workers is None:
            persistent_workers = num_workers > 0
        async_options = dict(async_options or {})
        if "rebatched_size" in async_options:
            raise AssertionError(messages.ASYNC_OPTIONS_REBATCHED)
        num_processes = options.Distributed.numProcesses
        num_batches_to_combine = combined_batch_factor(options)
        is_iterable = isinstance(dataset, torch.utils.data.IterableDataset)

        if batch_sampler is not None:
            if batch_size != 1 or shuffle:
                raise Error(messages.BATCH_SAMPLER_EXCLUSIVE)
            if num_processes > 1 and auto_distributed_partitioning:
                raise Error(messages.BATCH_SAMPLER_DISTRIBUTED)
            batch_sampler = CombinedBatchSampler(batch_sampler, num_batches_to_combine, drop_last)
            combined_batch_size = batch_sampler.batch_size
        else:
            combined_batch_size = None if batch_size is None else batch_size * num_batches_to_combine

        if is_iterable:
            if num_processes != 1 and auto_distributed_partitioning:
                raise AssertionError(messages.ITERABLE_PARTITIONING)
            if num_workers > 1 and kwargs.get("worker_init_fn") is None:
                logger.warning(messages.ITERABLE_WORKERS, num_workers, num_workers)

        shard = None
        if not is_iterable and batch_sampler is None and num_processes > 1 and auto_distributed_partitioning:
            shard = DistributedShard(dataset, options, combined_batch_size, drop_last, shuffle)
            shuffle = False  # the shard shuffles globally, the same way in every process

        if not drop_last and not is_iterable and batch_sampler is None and combined_batch_size is not None:
            elements = len(shard.dataset if shard is not None else dataset)
            per_step = combined_batch_size * num_processes
            if elements % per_step:
                logger.warning(messages.LEFTOVER_ELEMENTS, elements, per_step, elements % per_step)

        if mode == DataLoaderMode.Async and not drop_last and (combined_batch_size or 1) > 1:
            mode = DataLoaderMode.AsyncRebatched
        rebatched_size = None
        # Without a batch size nothing is batched and there is no last batch to drop.
        torch_batch_size, torch_drop_last = combined_batch_size, drop_last and combined_batch_size is not None
        if mode == DataLoaderMode.AsyncRebatched and batch_sampler is None:
            if combined_batch_size is None:
                raise AssertionError(messages.REBATCHED_NEEDS_BATCH_SIZE)
            worker_size = rebatched_worker_size or combined_batch_size
            if worker_size > combined_batch_size:
                raise AssertionError(messages.REBATCHED_WORKER_SIZE.format(
                    worker=worker_size, combined=combined_batch_size))
            rebatched_size = combined_batch_size
            # The re-batching applies drop_last to combined batches; dropping partial worker
            # batches too would lose elements a synchronous loader keeps.
            torch_batch_size, torch_drop_last = worker_size, False

        options._freeze()
        self._options = options
        self._combined_batch_size = combined_batch_size
        self._shard = shard
        self._mode = mode
        self._rebatched_size = rebatched_size
        self._rebatch_drop_last = drop_last
        self._accessor = None

        dataset = shard if shard is not None else dataset
        if batch_sampler is not None:
            super().__init__(dataset, batch_sampler=batch_sampler, num_workers=num_workers,
                             persistent_workers=persistent_workers, **kwargs)
        else:
            super().__init__(dataset, batch_size=torch_batch_size, shuffle=shuffle, num_workers=num_workers,
                             drop_last=torch_drop_last, persistent_workers=persistent_workers, **kwargs)

        if mode != DataLoaderMode.Sync:
            self._accessor = AsynchronousDataAccessor(self, rebatched_size=rebatched_size, **async_options)

    @property
    def combinedBatchSize(self) -> Optional[int]:
        """Elements per item: micro-batch size times the batches one host call consumes."""
        return self._combined_batch_size

    @property
    def options(self) -> Options:
        """The (frozen) options the loader was built with."""
        return self._options

    def terminate(self) -> None:
        """Stop the loading process of the ``Async`` modes (no-op in ``Sync`` mode)."""
        if self._accessor is not None:
            self._accessor.terminate()

    def __len__(self) -> int:
        if self._rebatched_size is not None:
            elements = len(self.dataset)
            full, rest = divmod(elements, self._rebatched_size)
            return full + (1 if rest and not self._rebatch_drop_last else 0)
        return super().__len__()

    def __iter__(self):
        if self._accessor is not None:
            return iter(self._accessor)
        empty = self.empty_epoch_message()
        if empty is not None:
            raise Error(empty)
        return trace.WaitSpans(self._iter_sync())

    def empty_epoch_message(self) -> Optional[str]:
        """Why an epoch of this loader has no batch, then a line with what to do; None when it has
        batches or its length is unknown."""
        reason = self.no_batch_reason()
        return None if reason is None else with_fix(*reason)

    def no_batch_reason(self) -> Optional[tuple]:
        """``(sizes, fix)`` when drop_last leaves a map-style dataset without one combined batch."""
        if self._combined_batch_size is None or not self._rebatch_drop_last \
                or isinstance(self.dataset, torch.utils.data.IterableDataset):
            return None
        try:
            if len(self) > 0:
                return None
            elements = len(self._shard.dataset if self._shard is not None else self.dataset)
        except TypeError:  # a dataset without a length
            return None
        if elements == 0:
            return None  # an empty dataset: nothing to say about batch sizes
        options = self._options
        processes = options.Distributed.numProcesses
        factor = combined_batch_factor(options)
        per_step = self._combined_batch_size * processes
        geometry = BatchGeometry.from_options(options)
        text = messages.NO_BATCH_IN_EPOCH.format(
            elements=elements, processes=f" for {processes} processes" if processes > 1 else "",
            per_step=per_step, batch_size=self._combined_batch_size // factor, factor=factor,
            di=geometry.device_iterations, replicas=geometry.input_replicas, ga=geometry.gradient_accumulation,
            times_processes=f", x {processes} processes" if processes > 1 else "")
        largest = elements // (factor * processes)
        fix = messages.NO_BATCH_IN_EPOCH_FIX.format(largest=largest, per_step=per_step) if largest \
            else messages.NO_BATCH_IN_EPOCH_FIX_TOO_FEW.format(per_step=per_step)
        return text, fix

    def _iter_sync(self):
        """Start an epoch in this process (what the asynchronous loading process iterates)."""
        if self._shard is not None:
            self._shard.start_epoch()
        return super().__iter__()

    def __getstate__(self):
        # Pickled when the loading process is started with forkserver or spawn.
        state = self.__dict__.copy()
        state["_accessor"] = None
        state["_iterator"] = None
        return state

