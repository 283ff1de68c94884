"""Lightning's dataloaders -> ``poptorch.DataLoader`` (combined batches).

A ``torch.utils.data.DataLoader`` with ``batch_size=b`` becomes a ``poptorch.DataLoader`` over the
same dataset, sampler and loading settings whose every item is one host call's worth of data:
``b * device_iterations * replicas * gradient_accumulation`` samples (inference: no
accumulation). A user ``batch_sampler`` (any ``torch.utils.data.BatchSampler``, with any number
of replicas) is kept: consecutive batches it yields are joined, so each replica, accumulation
step and device iteration gets exactly one of its batches. A ``poptorch.DataLoader`` the user
built is used as it is.

Training loaders drop an incomplete last combined batch (``poptorch.DataLoader``'s default;
Lightning's epoch then has ``len(dataset) // combined`` batches). Evaluation and prediction
loaders keep it (the user's ``drop_last``): the strategy runs it on the host in micro-batches, so
no sample is lost.
"""
import torch
from torch.utils.data import BatchSampler, DataLoader as TorchDataLoader, RandomSampler, SequentialSampler

from openpop.data import DataLoader
from openpop.log import logger

_PASSED_THROUGH = ("num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context",
                   "generator", "pin_memory_device", "in_order")


def to_openpop_loader(loader, options, training: bool):
    """``loader`` as a ``poptorch.DataLoader`` for ``options`` (see the module docstring)."""
    converted = _convert(loader, options, training)
    if training and converted is not loader and isinstance(converted, DataLoader):
        try:
            empty = len(converted) == 0
        except TypeError:  # an iterable dataset without a length
            empty = False
        if empty:
            logger.warning(
                "The training dataset (%d samples) is smaller than one host call's combined batch (%s samples = "
                "batch_size x device_iterations x devices x accumulate_grad_batches): no optimizer step will "
                "run. Lower batch_size, devices, device_iterations or accumulate_grad_batches.",
                len(loader.dataset), converted.combinedBatchSize)
    return converted


def _records_batch_indices(batch_sampler) -> bool:
    """Lightning's ``_IndexBatchSamplerWrapper`` (by name: lightning and pytorch_lightning each
    have their own class)."""
    return type(batch_sampler).__name__ == "_IndexBatchSamplerWrapper" and hasattr(batch_sampler, "_batch_sampler")


def _convert(loader, options, training: bool):
    if isinstance(loader, DataLoader) or not isinstance(loader, TorchDataLoader):
        return loader
    kwargs = {name: getattr(loader, name) for name in _PASSED_THROUGH if hasattr(loader, name)}
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    kwargs["persistent_workers"] = loader.persistent_workers
    dataset = loader.dataset
    if loader.batch_size is None and loader.batch_sampler is not None:
        # The user's own batch sampler, or Lightning's predict-time wrapper recording the
        # indices of every batch (for BasePredictionWriter): that one must record what a host
        # call takes, one combined batch, so it goes around the combined sampler instead.
        batch_sampler = loader.batch_sampler
        recorder = type(batch_sampler) if _records_batch_indices(batch_sampler) else None
        if recorder is not None:
            batch_sampler = batch_sampler._batch_sampler
        converted = DataLoader(options, dataset, batch_size=1, batch_sampler=batch_sampler,
                               drop_last=training, **kwargs)
        if recorder is not None:
            # torch forbids re-assigning batch_sampler after construction; the loader has not
            # been iterated, and iteration reads the attribute afresh.
            object.__setattr__(converted, "batch_sampler", recorder(converted.batch_sampler))
        return converted
    if loader.batch_size is None:
        return loader  # no automatic batching: the dataset yields whole batches itself
    sampler = loader.sampler
    drop_last = True if training else loader.drop_last
    if isinstance(dataset, torch.utils.data.IterableDataset):
        return DataLoader(options, dataset, batch_size=loader.batch_size, drop_last=drop_last, **kwargs)
    if type(sampler) is RandomSampler and not sampler.replacement and sampler._num_samples is None:
        if sampler.generator is not None:
            kwargs["generator"] = sampler.generator
        return DataLoader(options, dataset, batch_size=loader.batch_size, shuffle=True, drop_last=drop_last,
                          **kwargs)
    if type(sampler) is SequentialSampler:
        return DataLoader(options, dataset, batch_size=loader.batch_size, shuffle=False, drop_last=drop_last,
                          **kwargs)
    # A custom sampler of indices: batch it as torch would, then combine the batches.
    batch_sampler = BatchSampler(sampler, loader.batch_size, loader.drop_last)
    return DataLoader(options, dataset, batch_size=1, batch_sampler=batch_sampler, drop_last=drop_last, **kwargs)
