"""How an asynchronous loader starts its torch workers: forked from the loading process (never
through a fork server or interpreter of their own), once per loader, and reused every epoch;
the fork server that starts loading processes has torch and openpop imported already."""
import multiprocessing
import os

import pytest
import torch

from openpop.data import AsynchronousDataAccessor, DataLoader
from openpop.data.async_accessor import _context
from openpop.data.async_worker import fork_torch_workers_here
from openpop.enums import DataLoaderMode, SharingStrategy

from helpers.data_loading import indexed_dataset, make_options

START_METHODS = ("fork", "forkserver", "spawn")


class ProcessReportingDataset(torch.utils.data.Dataset):
    """Element i is (i, the process that loaded it, that process's parent, how it was started)."""

    def __len__(self):
        return 12

    def __getitem__(self, index):
        started_by = START_METHODS.index(multiprocessing.get_start_method())
        return torch.tensor([index, os.getpid(), os.getppid(), started_by])


def loaded_by(loader, epochs):
    """Per epoch: the element indices in order, and the set of (pid, parent pid, start method)."""
    seen = []
    for _ in range(epochs):
        rows = torch.cat([batch.clone() for batch in loader])
        seen.append((rows[:, 0].tolist(), {(pid, ppid, START_METHODS[how]) for _, pid, ppid, how in rows.tolist()}))
    return seen


# ForkServer is PopTorch's default; FileSystem spawns the loading process.
@pytest.mark.slow
@pytest.mark.parametrize("strategy", [SharingStrategy.ForkServer, SharingStrategy.FileSystem])
def test_torch_workers_fork_from_the_loading_process_once_per_loader(strategy):
    loader = DataLoader(make_options(), ProcessReportingDataset(), batch_size=2, num_workers=2,
                        mode=DataLoaderMode.Async, async_options={"sharing_strategy": strategy})
    loading_pid = loader._accessor._process.pid
    epochs = loaded_by(loader, 3)
    loader.terminate()
    for indices, _ in epochs:
        assert indices == list(range(12))
    workers = epochs[0][1]
    assert len(workers) == 2
    assert all(ppid == loading_pid and how == "fork" for _, ppid, how in workers)
    # persistent_workers defaults to True with workers: the same two processes every epoch.
    assert epochs[1][1] == epochs[2][1] == workers


def test_torch_loader_without_persistent_workers_forks_new_workers_each_epoch():
    torch_loader = torch.utils.data.DataLoader(ProcessReportingDataset(), batch_size=3, num_workers=2)
    accessor = AsynchronousDataAccessor(torch_loader, sharing_strategy=SharingStrategy.ForkServer)
    loading_pid = accessor._process.pid
    first, second = loaded_by(accessor, 2)
    accessor.terminate()
    assert first[0] == second[0] == list(range(12))
    assert all(ppid == loading_pid and how == "fork" for _, ppid, how in first[1] | second[1])
    assert not first[1] & second[1]  # the user's persistent_workers=False is kept


def test_only_a_loader_with_workers_and_no_chosen_context_is_made_to_fork():
    plain = torch.utils.data.DataLoader(indexed_dataset(4), num_workers=2)
    fork_torch_workers_here(plain)
    assert plain.multiprocessing_context is multiprocessing.get_context("fork")

    poptorch_loader = DataLoader(make_options(), indexed_dataset(4), num_workers=1)
    fork_torch_workers_here(poptorch_loader)
    assert poptorch_loader.multiprocessing_context is multiprocessing.get_context("fork")

    chosen = torch.utils.data.DataLoader(indexed_dataset(4), num_workers=2, multiprocessing_context="spawn")
    fork_torch_workers_here(chosen)
    assert chosen.multiprocessing_context is multiprocessing.get_context("spawn")

    in_process = torch.utils.data.DataLoader(indexed_dataset(4), num_workers=0)
    fork_torch_workers_here(in_process)
    assert in_process.multiprocessing_context is None

    batches = ["a", "b"]
    fork_torch_workers_here(batches)  # any other iterable is left alone
    assert batches == ["a", "b"]


def test_fork_server_preloads_torch_and_openpop():
    from multiprocessing import forkserver
    _context(SharingStrategy.ForkServer)
    preload = forkserver._forkserver._preload_modules
    assert "torch" in preload and "openpop" in preload


# --- what the workers load is what a synchronous loader gives -----------------------------
class AugmentedDataset(torch.utils.data.Dataset):
    """Element i is i plus noise drawn from the loading process's torch generator."""

    def __len__(self):
        return 24

    def __getitem__(self, index):
        return torch.tensor([float(index)]) + torch.rand(1)


class RangeIterable(torch.utils.data.IterableDataset):
    """0..n-1; ``share_between_workers`` gives each torch worker its own slice."""

    def __init__(self, n):
        self.start, self.end = 0, n

    def __iter__(self):
        for i in range(self.start, self.end):
            yield torch.tensor([float(i)])


def share_between_workers(worker_id):
    info = torch.utils.data.get_worker_info()
    dataset = info.dataset
    per_worker = (dataset.end - dataset.start) // info.num_workers
    dataset.start, dataset.end = worker_id * per_worker, (worker_id + 1) * per_worker


def epochs_of(loader, count):
    return [torch.cat([batch.clone() for batch in loader]) for _ in range(count)]


def test_worker_random_numbers_follow_the_seed_as_in_a_sync_loader():
    torch.manual_seed(3)
    sync = DataLoader(make_options(di=2), AugmentedDataset(), batch_size=2, shuffle=True, num_workers=2)
    expected = epochs_of(sync, 2)
    torch.manual_seed(3)
    loader = DataLoader(make_options(di=2), AugmentedDataset(), batch_size=2, shuffle=True, num_workers=2,
                        mode=DataLoaderMode.Async)
    got = epochs_of(loader, 2)
    loader.terminate()
    assert not torch.equal(expected[0], expected[1])  # new shuffle and noise each epoch
    for a, b in zip(got, expected):
        assert torch.equal(a, b)


def test_worker_init_fn_runs_in_each_forked_worker():
    options = dict(batch_size=3, num_workers=2, worker_init_fn=share_between_workers)
    sync = DataLoader(make_options(), RangeIterable(24), **options)
    expected = epochs_of(sync, 2)
    loader = DataLoader(make_options(), RangeIterable(24), mode=DataLoaderMode.Async, **options)
    got = epochs_of(loader, 2)
    loader.terminate()
    assert sorted(expected[0].flatten().tolist()) == list(range(24))  # each element once
    for a, b in zip(got, expected):
        assert torch.equal(a, b)
