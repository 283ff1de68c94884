"""Lightning's dataloaders -> ``poptorch.DataLoader`` (combined batches).

A ``torch.utils.data.DataLoader`` with ``batch_size=b`` becomes a ``poptorch.DataLoader`` over the
same dataset, sampler and loading settings whose every item is one host call's worth of data:
``b * device_iterations * replicas * gradient_accumulation`` samples (inference: no
accumulation). A user ``batch_sampler`` (any ``torch.utils.data.BatchSampler``, with any number
of replicas) is kept: consecutive batches it yields are joined, so each replica, accumulation
step and device iteration gets exactly one of its batches.

A ``poptorch.DataLoader`` the user built is used as it is when its options combine as many
micro-batches per host call as the stage's options (``trainer.strategy.training_opts`` /
``inference_opts``). Otherwise (typically one built with ``poptorch.Options()`` under
``Trainer(devices=2)``) it is re-created with the stage's options from the very arguments it was
built with (Lightning records them for loaders made in a ``*_dataloader`` hook): ``batch_size``
stays the micro-batch size, as ``poptorch.DataLoader`` defines it, and every other argument
(``shuffle``, ``sampler``, ``batch_sampler``, ``num_workers``, ``drop_last``, ``collate_fn``,
``mode``, a subclass's own arguments...) is kept; a warning says so. Lightning 2.0 passed such a
loader on unchanged, so PopTorch split its batches into smaller micro-batches than
``batch_size``, or refused them ("Invalid batch dimension"). A loader openpop cannot re-create
(made outside the hook, or of a subclass without an ``options`` argument) is an error naming
the fix.

Training loaders drop an incomplete last combined batch (``poptorch.DataLoader``'s default;
Lightning's epoch then has ``len(dataset) // combined`` batches). Evaluation and prediction
loaders keep it (the user's ``drop_last``): the strategy runs it on the host in micro-batches
(``steps.run_in_chunks``), so no sample is lost.
"""
from typing import Optional

import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler
from torch.utils.data import DataLoader as TorchDataLoader

from openpop.data import DataLoader
from openpop.errors import with_fix
from openpop.runtime.geometry import BatchGeometry

from . import messages
from ._framework import fabric_module, module, pl

_PASSED_THROUGH = ("num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context",
                   "generator", "pin_memory_device", "in_order")


LOADER_REBUILT = (
    "`{hook}` returned a poptorch.DataLoader built for options that combine {have} micro-batches per host call "
    "({have_detail}), but {stage} runs with options that combine {need} ({need_detail}). openpop re-created it "
    "with the {stage} options, keeping batch_size={micro} as the micro-batch size and every other argument. Build "
    "it with `self.trainer.strategy.{attr}` to have it used as it is.")
LOADER_NOT_REBUILDABLE = (
    "`{hook}` returned a poptorch.DataLoader built for options that combine {have} micro-batches per host call "
    "({have_detail}), but {stage} runs with options that combine {need} ({need_detail}), and openpop cannot "
    "re-create it: {reason}. Build it inside `{hook}` with `self.trainer.strategy.{attr}` as its options, or "
    "return a torch.utils.data.DataLoader (openpop converts it).")
NOT_MADE_IN_HOOK = "it was not created inside `{hook}`, so its arguments are unknown"
NO_OPTIONS_ARGUMENT = "its class, {cls}, takes no `options` argument"


def to_openpop_loader(loader, options, training: bool, hook: str = "train_dataloader"):
    """``loader`` as a ``poptorch.DataLoader`` for ``options`` (see the module docstring);
    ``hook`` is the ``LightningModule`` hook that returned it (for messages)."""
    if isinstance(loader, DataLoader):
        loader = _for_options(loader, options, training, hook)
        if hook == "predict_dataloader":
            _record_batch_indices(loader)
    else:
        loader = _convert(loader, options, training)
    if training and isinstance(loader, DataLoader):
        _check_an_epoch_has_a_batch(loader, options)
    return loader


def _check_an_epoch_has_a_batch(loader: DataLoader, options) -> None:
    """A training loader whose epoch has no batch (a dataset smaller than one combined batch, whose
    incomplete last batch training drops) is an error before ``fit`` runs anything: Lightning would
    skip every epoch with a warning and no optimizer step."""
    if loader.no_batch_reason() is None:
        return
    geometry = BatchGeometry.from_options(options)
    combined = loader.combinedBatchSize * options.Distributed.numProcesses
    micro = micro_batch_size(loader)
    samples = len(loader.dataset if getattr(loader, "_shard", None) is None else loader._shard.dataset)
    largest = samples * micro // combined
    text = messages.SMALL_TRAINING_DATASET.format(
        samples=samples, combined=combined, micro=micro, di=geometry.device_iterations,
        devices=geometry.input_replicas * options.Distributed.numProcesses, ga=geometry.gradient_accumulation)
    fix = messages.SMALL_TRAINING_DATASET_FIX.format(largest=largest, combined=combined) if largest else \
        messages.SMALL_TRAINING_DATASET_FIX_TOO_FEW.format(combined=combined)
    raise module("utilities.exceptions").MisconfigurationException(with_fix(text, fix))


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


def micro_batch_size(loader) -> Optional[int]:
    """The micro-batch size of a ``poptorch.DataLoader`` (None without automatic batching)."""
    if not isinstance(loader, DataLoader) or loader.combinedBatchSize is None:
        return None
    return loader.combinedBatchSize // BatchGeometry.from_options(loader.options).batches_per_call


def _describe(geometry: BatchGeometry) -> str:
    replicas = f"replicationFactor({geometry.replication_factor})"
    if geometry.input_group_size != 1:
        replicas = f"{replicas} / inputReplicaGrouping({geometry.input_group_size})"
    return (f"deviceIterations({geometry.device_iterations}) x {replicas} x "
            f"Training.gradientAccumulation({geometry.gradient_accumulation})")


def _for_options(loader: DataLoader, options, training: bool, hook: str):
    """A user's ``poptorch.DataLoader``, re-created for ``options`` if their batches differ."""
    have, need = BatchGeometry.from_options(loader.options), BatchGeometry.from_options(options)
    if have.batches_per_call == need.batches_per_call:
        return loader
    stage, attr = ("training", "training_opts") if training else ("inference", "inference_opts")
    details = dict(hook=hook, have=have.batches_per_call, have_detail=_describe(have), need=need.batches_per_call,
                   need_detail=_describe(need), stage=stage, attr=attr)
    saved = _saved_arguments(loader)
    reason = None
    if saved is None:
        reason = NOT_MADE_IN_HOOK.format(hook=hook)
    else:
        args, kwargs, names, defaults = saved
        replaced, args, kwargs = fabric_module("utilities.data")._replace_value_in_saved_args(
            "options", options, args, kwargs, defaults, names)
        if not replaced:
            reason = NO_OPTIONS_ARGUMENT.format(cls=type(loader).__name__)
    if reason is not None:
        raise module("utilities.exceptions").MisconfigurationException(
            LOADER_NOT_REBUILDABLE.format(reason=reason, **details))
    rebuilt = fabric_module("utilities.data")._reinstantiate_wrapped_cls(loader, *args, **kwargs)
    loader.terminate()  # its asynchronous loading process, if any
    pl.utilities.rank_zero_warn(LOADER_REBUILT.format(micro=micro_batch_size(rebuilt), **details))
    return rebuilt


def _record_batch_indices(loader: DataLoader) -> None:
    """What Lightning's predict loop reads (``BasePredictionWriter``'s ``batch_indices``): the
    dataset indices of each host call. Lightning wraps the batch sampler of the loaders it
    re-creates; a user's ``poptorch.DataLoader`` is not re-created by Lightning (see
    ``integration.py``), so its combined batch sampler is wrapped here."""
    batch_sampler = loader.batch_sampler
    if batch_sampler is None or _records_batch_indices(batch_sampler):
        return
    recorder = module("overrides.distributed")._IndexBatchSamplerWrapper
    # torch forbids re-assigning batch_sampler after construction; iteration reads it afresh.
    object.__setattr__(loader, "batch_sampler", recorder(batch_sampler))


def _saved_arguments(loader):
    """What Lightning recorded of the ``__init__`` call that built ``loader`` (inside a
    ``*_dataloader`` hook): ``(args, kwargs, positional names, defaulted kwargs)``, or None."""
    if not hasattr(loader, "__pl_saved_args"):
        return None
    return (getattr(loader, "__pl_saved_args"), dict(getattr(loader, "__pl_saved_kwargs")),
            getattr(loader, "__pl_saved_arg_names"), dict(getattr(loader, "__pl_saved_default_kwargs")))
