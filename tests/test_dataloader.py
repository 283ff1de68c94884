"""poptorch.DataLoader: combined batches, drop_last, batch samplers, iterable datasets and the
per-process shards of distributed runs (simulated in one process with configureProcessId)."""
import contextlib
import logging
from itertools import chain

import pytest
import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

from openpop.data import DataLoader, messages
from openpop.data.distributed import process_slice
from openpop.enums import DataLoaderMode
from openpop.errors import Error
from openpop.log import logger

from helpers.data_loading import indexed_dataset, make_options


def labels(loader):
    return [batch[1].tolist() for batch in loader]


@contextlib.contextmanager
def logged_warnings():
    records = []
    handler = logging.Handler(level=logging.WARNING)
    handler.emit = records.append
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


class CountingIterable(torch.utils.data.IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield torch.tensor([float(i)]), i


# --- combined batch size ----------------------------------------------------------
GEOMETRIES = [  # (device_iterations, replicas, gradient_accumulation, input_group_size)
    (1, 1, 1, 1), (2, 1, 1, 1), (1, 2, 1, 1), (1, 1, 3, 1), (2, 2, 2, 1), (3, 4, 1, 2),
    (1, 4, 2, 4), (4, 2, 3, 2), (2, 8, 1, 4), (5, 1, 2, 1),
]


@pytest.mark.parametrize("di,r,ga,group", GEOMETRIES)
@pytest.mark.parametrize("batch_size", [1, 3])
def test_combined_batch_size_and_length(di, r, ga, group, batch_size):
    opts = make_options(di, r, ga, group)
    dataset = indexed_dataset(97)
    loader = DataLoader(opts, dataset, batch_size=batch_size)
    combined = batch_size * di * (r // group) * ga
    assert loader.combinedBatchSize == combined
    assert loader.options is opts
    assert len(loader) == 97 // combined
    batches = list(loader)
    assert len(batches) == len(loader)
    assert all(b[0].shape == (combined, 3) and b[1].shape == (combined,) for b in batches)


@pytest.mark.parametrize("di,r,ga,group", [(2, 2, 1, 1), (1, 4, 3, 2), (3, 1, 2, 1)])
def test_each_combined_batch_is_consecutive_torch_batches_concatenated(di, r, ga, group):
    dataset = indexed_dataset(50)
    loader = DataLoader(make_options(di, r, ga, group), dataset, batch_size=2)
    factor = di * (r // group) * ga
    reference = list(torch.utils.data.DataLoader(dataset, batch_size=2))
    for i, batch in enumerate(loader):
        group_of = reference[i * factor:(i + 1) * factor]
        for got, parts in zip(batch, zip(*group_of)):
            assert torch.equal(got, torch.cat(parts))


def test_batch_size_none_yields_single_elements():
    loader = DataLoader(make_options(di=4), indexed_dataset(5), batch_size=None)
    assert loader.combinedBatchSize is None
    items = list(loader)
    assert len(items) == 5 and items[2][1].item() == 2 and items[2][0].shape == (3,)


def test_defaults_shuffle_persistent_workers_and_frozen_options():
    opts = make_options(di=2)
    loader = DataLoader(opts, indexed_dataset(8), batch_size=2)
    assert labels(loader) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # shuffle=None means no shuffle
    assert loader.persistent_workers is False
    assert loader.drop_last is True
    with pytest.raises(AttributeError, match="Can't modify frozen Options"):
        opts.deviceIterations(3)
    loader.terminate()  # no-op in Sync mode
    workers = DataLoader(make_options(), indexed_dataset(8), num_workers=1)
    assert workers.persistent_workers is True


def test_options_must_be_poptorch_options():
    with pytest.raises(AssertionError):
        DataLoader({"device_iterations": 2}, indexed_dataset(4))


def test_shuffle_true_shuffles_within_one_process():
    loader = DataLoader(make_options(di=2), indexed_dataset(40), batch_size=2, shuffle=True)
    seen = list(chain.from_iterable(labels(loader)))
    assert sorted(seen) == list(range(40)) and seen != list(range(40))


# --- drop_last -------------------------------------------------------------------
def test_drop_last_is_default_and_silent():
    with logged_warnings() as records:
        loader = DataLoader(make_options(di=2, r=2), indexed_dataset(10), batch_size=2)
    assert records == []
    assert len(loader) == 1 and labels(loader) == [list(range(8))]


def test_an_epoch_without_a_batch_is_an_error_naming_the_sizes():
    """100 elements, combined batch 2 x 32 x 2 = 128: drop_last leaves no batch. PopTorch's synchronous
    loader gave an empty epoch without a word (its length, 0, is kept); iterating it is an error here."""
    loader = DataLoader(make_options(di=2, r=2), indexed_dataset(100), batch_size=32)
    assert len(loader) == 0
    with pytest.raises(Error) as info:
        iter(loader)
    assert str(info.value) == (
        "poptorch.DataLoader has no batch to give: the dataset has 100 elements and one host call takes a combined "
        "batch of 128 (batch_size 32 x 4 micro-batches per call: deviceIterations 2 x replicas 2 x "
        "gradientAccumulation 1), so drop_last=True leaves no batch\n"
        "openpop: use a batch_size of at most 25 or fewer micro-batches per host call (deviceIterations, replicas, "
        "gradientAccumulation), give the dataset at least 128 elements, or pass drop_last=False")
    few = DataLoader(make_options(di=4), indexed_dataset(3), batch_size=1)
    with pytest.raises(Error, match=r"openpop: give the dataset at least 4 elements, use fewer micro-batches"):
        iter(few)
    # Two processes: each takes its own combined batch, so one step needs 256 elements.
    shard = DataLoader(make_options(di=2, r=2, process=(0, 2)), indexed_dataset(200), batch_size=32)
    with pytest.raises(Error, match=r"the dataset has 200 elements for 2 processes and one host call takes a "
                                    r"combined batch of 256 \(batch_size 32 x 4 micro-batches per call: .*, x 2 "
                                    r"processes\).*\nopenpop: use a batch_size of at most 25 "):
        iter(shard)
    # An empty dataset, drop_last=False and a dataset without a length keep torch's behaviour.
    assert list(DataLoader(make_options(), indexed_dataset(0), batch_size=4)) == []
    assert len(list(DataLoader(make_options(di=2, r=2), indexed_dataset(100), batch_size=32, drop_last=False))) == 1


def test_drop_last_false_warns_and_returns_a_short_last_batch():
    with logged_warnings() as records:
        loader = DataLoader(make_options(di=2, r=2), indexed_dataset(10), batch_size=2, drop_last=False)
    assert [r.getMessage() for r in records] == [
        "The number of elements in the dataset (10) is not divisible by the number of elements processed "
        "per step (8) and drop_last=False. The last tensor will have a batch size of 2. To avoid having to "
        "handle this special case switch to drop_last=True"]
    assert records[0].levelno == logging.WARNING
    assert len(loader) == 2
    assert labels(loader) == [list(range(8)), [8, 9]]


def test_drop_last_false_without_leftover_does_not_warn():
    with logged_warnings() as records:
        DataLoader(make_options(di=2), indexed_dataset(8), batch_size=2, drop_last=False)
    assert records == []


# --- batch_sampler -------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [{"batch_size": 2}, {"shuffle": True}, {"batch_size": None}])
def test_batch_sampler_excludes_batch_size_and_shuffle(kwargs):
    with pytest.raises(Error) as info:
        DataLoader(make_options(), indexed_dataset(8), batch_sampler=[[0, 1]], **kwargs)
    assert str(info.value) == "`batch_sampler` option is mutually exclusive with batch_size, shuffle."


def test_batch_sampler_excludes_auto_partitioning_with_several_processes():
    with pytest.raises(Error) as info:
        DataLoader(make_options(process=(0, 2)), indexed_dataset(8), batch_sampler=[[0, 1]])
    assert str(info.value) == messages.BATCH_SAMPLER_DISTRIBUTED
    loader = DataLoader(make_options(process=(1, 2)), indexed_dataset(8), batch_sampler=[[4, 5], [6, 7]],
                        auto_distributed_partitioning=False)
    assert labels(loader) == [[4, 5], [6, 7]]


def test_batch_sampler_batches_are_combined_in_order():
    sampler = [[3, 1], [0], [7, 8, 9], [2, 2], [5]]
    loader = DataLoader(make_options(di=2), indexed_dataset(10), batch_sampler=sampler)
    assert len(loader) == 2
    assert labels(loader) == [[3, 1, 0], [7, 8, 9, 2, 2]]
    keep = DataLoader(make_options(di=2), indexed_dataset(10), batch_sampler=sampler, drop_last=False)
    assert len(keep) == 3
    assert labels(keep) == [[3, 1, 0], [7, 8, 9, 2, 2], [5]]


@pytest.mark.parametrize("di,r,ga", [(1, 2, 1), (2, 4, 1), (1, 2, 2)])
def test_torch_batch_sampler_with_several_replicas(di, r, ga):
    dataset = indexed_dataset(30)
    factor = di * r * ga
    generator = torch.Generator().manual_seed(3)
    sampler = BatchSampler(RandomSampler(dataset, generator=generator), batch_size=3, drop_last=False)
    expected_generator = torch.Generator().manual_seed(3)
    expected = list(BatchSampler(RandomSampler(dataset, generator=expected_generator), 3, False))
    loader = DataLoader(make_options(di, r, ga), dataset, batch_sampler=sampler)
    assert loader.combinedBatchSize == 3 * factor
    batches = list(loader)
    assert len(batches) == len(loader) == len(expected) // factor
    for i, (rows, index) in enumerate(batches):
        want = list(chain.from_iterable(expected[i * factor:(i + 1) * factor]))
        assert index.tolist() == want
        assert torch.equal(rows, dataset.tensors[0][want])
        # Replica k of the combined batch gets the sampler's k-th batch of the step.
        per_replica = index.view(di, ga, r, 3)
        assert per_replica[0, 0, 1].tolist() == expected[i * factor + 1]


def test_sequential_batch_sampler_equals_batch_size():
    dataset = indexed_dataset(20)
    opts = make_options(r=2)
    with_sampler = DataLoader(opts, dataset, batch_sampler=BatchSampler(SequentialSampler(dataset), 2, False))
    plain = DataLoader(make_options(r=2), dataset, batch_size=2)
    assert labels(with_sampler) == labels(plain)


# --- iterable datasets ------------------------------------------------------------
def test_iterable_dataset_is_combined():
    loader = DataLoader(make_options(di=2, ga=2), CountingIterable(10), batch_size=2)
    assert loader.combinedBatchSize == 8
    assert labels(loader) == [list(range(8))]
    keep = DataLoader(make_options(di=2, ga=2), CountingIterable(10), batch_size=2, drop_last=False)
    assert labels(keep) == [list(range(8)), [8, 9]]


def test_iterable_dataset_rejects_auto_partitioning_with_several_processes():
    with pytest.raises(AssertionError, match="IterableDataset"):
        DataLoader(make_options(process=(0, 2)), CountingIterable(8))
    loader = DataLoader(make_options(process=(0, 2)), CountingIterable(4), auto_distributed_partitioning=False)
    assert labels(loader) == [[0], [1], [2], [3]]


def test_iterable_dataset_with_workers_warns_without_worker_init_fn():
    with logged_warnings() as records:
        DataLoader(make_options(), CountingIterable(8), num_workers=2)
    assert [r.getMessage() for r in records] == [messages.ITERABLE_WORKERS % (2, 2)]
    with logged_warnings() as records:
        DataLoader(make_options(), CountingIterable(8), num_workers=2, worker_init_fn=lambda worker: None)
        DataLoader(make_options(), CountingIterable(8), num_workers=1)
    assert records == []


# --- async mode arguments (the loading itself is tested in test_async_accessor.py) -----
def test_rebatched_worker_size_must_not_exceed_combined_size():
    with pytest.raises(AssertionError) as info:
        DataLoader(make_options(di=2), indexed_dataset(8), batch_size=2, mode=DataLoaderMode.AsyncRebatched,
                   rebatched_worker_size=5)
    assert str(info.value) == "The rebatched_worker_size (5) must be <= to the combined batch size (4)"


def test_async_options_cannot_set_rebatched_size():
    with pytest.raises(AssertionError, match="rebatched_size"):
        DataLoader(make_options(), indexed_dataset(8), mode=DataLoaderMode.Async,
                   async_options={"rebatched_size": 4})


# --- distributed shards --------------------------------------------------------------
@pytest.mark.parametrize("n,combined,processes", [(100, 4, 2), (101, 4, 3), (7, 2, 4), (64, 8, 4), (5, 1, 2)])
@pytest.mark.parametrize("drop_last", [True, False])
def test_process_slices_are_disjoint_contiguous_and_cover_the_data(n, combined, processes, drop_last):
    slices = [process_slice(n, combined, processes, p, drop_last) for p in range(processes)]
    position = 0
    for start, length in slices:
        assert start == position  # contiguous, in process order, no overlap
        position += length
    lengths = [length for _, length in slices]
    if drop_last:
        per_process = combined * (n // (combined * processes))
        assert lengths == [per_process] * processes
    else:
        assert position == n and max(lengths) - min(lengths) <= 1
        assert lengths == sorted(lengths, reverse=True)  # the remainder goes to the first processes


@pytest.mark.parametrize("n,processes", [(100, 2), (61, 3), (40, 4)])
@pytest.mark.parametrize("drop_last", [True, False])
def test_distributed_loaders_read_disjoint_contiguous_shards(n, processes, drop_last):
    dataset = indexed_dataset(n)
    seen = []
    for p in range(processes):
        loader = DataLoader(make_options(di=2, process=(p, processes)), dataset, batch_size=2,
                            drop_last=drop_last)
        combined = 4
        if drop_last:
            assert len(loader) == n // (combined * processes)
        got = list(chain.from_iterable(labels(loader)))
        assert got == list(range(got[0], got[0] + len(got)))  # contiguous, in order
        seen.append(got)
    flat = list(chain.from_iterable(seen))
    assert len(flat) == len(set(flat))
    if drop_last:
        assert flat == list(range(len(flat)))
    else:
        assert flat == list(range(n))


def test_distributed_requires_batch_size_and_seed_for_shuffle():
    with pytest.raises(AssertionError) as info:
        DataLoader(make_options(process=(0, 2)), indexed_dataset(8), batch_size=None)
    assert str(info.value) == messages.BATCH_SIZE_REQUIRED
    with pytest.raises(AssertionError) as info:
        DataLoader(make_options(process=(0, 2)), indexed_dataset(8), shuffle=True)
    assert str(info.value) == (
        "When using auto_distributed_partitioning you must set poptorch.Options.randomSeed() to ensure that "
        "tensors are in the same order in all processes.")


def _epochs(loader, count):
    return [list(chain.from_iterable(labels(loader))) for _ in range(count)]


@pytest.mark.parametrize("drop_last", [True, False])
def test_distributed_shuffle_is_global_identical_in_all_processes_and_changes_every_epoch(drop_last):
    n, processes, epochs = 22, 2, 4
    dataset = indexed_dataset(n)
    per_process = [_epochs(DataLoader(make_options(r=2, process=(p, processes), seed=7), dataset, batch_size=2,
                                      shuffle=True, drop_last=drop_last), epochs)
                   for p in range(processes)]
    # Rebuilding the loaders of process 0 gives the same sequence (determinism across processes).
    again = _epochs(DataLoader(make_options(r=2, process=(0, processes), seed=7), dataset, batch_size=2,
                               shuffle=True, drop_last=drop_last), epochs)
    assert again == per_process[0]
    orders = []
    for epoch in range(epochs):
        order = per_process[0][epoch] + per_process[1][epoch]
        assert len(order) == len(set(order))  # the processes' shares are disjoint
        if drop_last:
            assert len(order) == 16  # 2 processes x 2 steps x combined batch 4
        else:
            assert sorted(order) == list(range(n))
        orders.append(order)
    assert len({tuple(order) for order in orders}) == epochs  # reshuffled every epoch
    assert orders[0] != list(range(len(orders[0])))
    if drop_last:
        for previous, current in zip(orders, orders[1:]):
            left_over = set(range(n)) - set(previous)
            assert left_over <= set(current)  # elements left out are used first in the next epoch
            assert set(current[:len(left_over)]) == left_over


def test_distributed_shuffle_depends_on_the_seed():
    dataset = indexed_dataset(20)
    first = _epochs(DataLoader(make_options(process=(0, 2), seed=1), dataset, batch_size=2, shuffle=True), 1)
    second = _epochs(DataLoader(make_options(process=(0, 2), seed=2), dataset, batch_size=2, shuffle=True), 1)
    assert first != second


def test_distributed_shuffle_reaches_persistent_workers():
    dataset = indexed_dataset(24)
    expected = _epochs(DataLoader(make_options(process=(1, 2), seed=3), dataset, batch_size=2, shuffle=True), 3)
    with_workers = DataLoader(make_options(process=(1, 2), seed=3), dataset, batch_size=2, shuffle=True,
                              num_workers=2)
    assert with_workers.persistent_workers
    assert _epochs(with_workers, 3) == expected
