"""The texts of the data package's errors and warnings (PopTorch's exact words where it had them)."""

# --- DataLoader -----------------------------------------------------------------
BATCH_SAMPLER_EXCLUSIVE = "`batch_sampler` option is mutually exclusive with batch_size, shuffle."
BATCH_SAMPLER_DISTRIBUTED = (
    "`batch_sampler` option is mutually exclusive with auto_distributed_partitioning=True when "
    "poptorch.Options.Distributed.numProcesses > 1: pass auto_distributed_partitioning=False and make the "
    "sampler return this process's share of the data.")
ITERABLE_PARTITIONING = (
    "auto_distributed_partitioning is not supported for an IterableDataset used by several processes: pass "
    "auto_distributed_partitioning=False and let the dataset return this process's share of the data "
    "(poptorch.Options.Distributed.processId / numProcesses).")
ITERABLE_WORKERS = (
    "The IterableDataset is used with num_workers=%d and no worker_init_fn: every worker iterates over the "
    "whole dataset, so each element will be returned %d times. Pass a worker_init_fn that gives each worker "
    "its own part of the data (see torch.utils.data.get_worker_info()).")
LEFTOVER_ELEMENTS = (
    "The number of elements in the dataset (%d) is not divisible by the number of elements processed per "
    "step (%d) and drop_last=False. The last tensor will have a batch size of %d. To avoid having to handle "
    "this special case switch to drop_last=True")
REBATCHED_WORKER_SIZE = "The rebatched_worker_size ({worker}) must be <= to the combined batch size ({combined})"
REBATCHED_NEEDS_BATCH_SIZE = "DataLoaderMode.AsyncRebatched needs a batch_size (got batch_size=None)"
ASYNC_OPTIONS_REBATCHED = (
    "async_options cannot contain rebatched_size: the DataLoader sets it to the combined batch size (use "
    "rebatched_worker_size to choose the batch size of the workers)")
NOT_OPTIONS = "options must be a poptorch.Options, got {type}"
# An epoch without a batch (PopTorch's synchronous loader gave an empty epoch without a word; its
# asynchronous one raised DATASET_EMPTY). The sizes, then what to change.
NO_BATCH_IN_EPOCH = (
    "poptorch.DataLoader has no batch to give: the dataset has {elements} elements{processes} and one host call "
    "takes a combined batch of {per_step} (batch_size {batch_size} x {factor} micro-batches per call: "
    "deviceIterations {di} x replicas {replicas} x gradientAccumulation {ga}{times_processes}), so drop_last=True "
    "leaves no batch")
NO_BATCH_IN_EPOCH_FIX = (
    "use a batch_size of at most {largest} or fewer micro-batches per host call (deviceIterations, replicas, "
    "gradientAccumulation), give the dataset at least {per_step} elements, or pass drop_last=False")
NO_BATCH_IN_EPOCH_FIX_TOO_FEW = (
    "give the dataset at least {per_step} elements, use fewer micro-batches per host call (deviceIterations, "
    "replicas, gradientAccumulation), or pass drop_last=False")

# --- distributed sharding -------------------------------------------------------
BATCH_SIZE_REQUIRED = ("auto_distributed_partitioning requires a batch_size: pass batch_size to the "
                       "DataLoader or set auto_distributed_partitioning=False")
RANDOM_SEED_REQUIRED = ("When using auto_distributed_partitioning you must set poptorch.Options.randomSeed() "
                        "to ensure that tensors are in the same order in all processes.")
SHARD_INDEX_OUT_OF_RANGE = "index {index} is out of range for a shard of {length} elements"

# --- AsynchronousDataAccessor ---------------------------------------------------
ALREADY_ASYNC = ("The DataLoader already uses an AsynchronousDataAccessor internally. Either use the existing "
                 "one or set mode='poptorch.DataLoaderMode.Sync' in the DataLoader.")
REBATCHED_SIZE_TOO_SMALL = "rebatched_size must be None or greater than 1 (got {size})"
BUFFER_SIZE_TOO_SMALL = "buffer_size must be at least 1 (got {size})"
WORKER_FAILED_TO_START = "AsynchronousDataAccessor worker thread failed to start (Check above for details)"
DATASET_EMPTY = "The Dataset is empty"
SHARING_STRATEGY_UNKNOWN = ("sharing_strategy {value!r} is not a poptorch.SharingStrategy: "
                            "pass one of its members or their names ({names})")
WORKER_DIED = ("The AsynchronousDataAccessor worker process exited unexpectedly (exit code {code}) while "
               "loading data")
WORKER_FAILED = "The AsynchronousDataAccessor worker process stopped after an error: {error}"
TERMINATED = "The AsynchronousDataAccessor has been terminated: create a new one to load more data"
WORKER_RAISED = "The AsynchronousDataAccessor worker raised {summary}"
WORKER_FIRST_MESSAGE = "unexpected first message from the worker: {message}"

# --- batch_tree -----------------------------------------------------------------
REBATCH_NOT_BATCHED = "Rebatching needs batches whose leaves are tensors with a batch dimension, got {tree_type}"
REBATCH_LEAF_TYPE = "Rebatching supports batches of tensors only, got a leaf of type {leaf_type}"
