"""AsynchronousDataAccessor and the DataLoader's Async modes: same data as the synchronous loader,
shared-memory slots, epochs, error texts, and never hanging (on errors, dead workers or at exit)."""
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from torch.utils.data import TensorDataset

from openpop.data import AsynchronousDataAccessor, DataLoader
from openpop.data.async_accessor import WorkerTraceback
from openpop.enums import DataLoaderMode, SharingStrategy
from openpop.errors import Error

from helpers.data_loading import indexed_dataset, make_options
from helpers.processes import alive, wait_gone

FORK = {"sharing_strategy": SharingStrategy.Fork}
SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def snapshot(batch):
    """A copy that outlives the accessor's shared-memory slot."""
    if isinstance(batch, torch.Tensor):
        return batch.clone()
    if isinstance(batch, (list, tuple)):
        return type(batch)(snapshot(b) for b in batch)
    if isinstance(batch, dict):
        return {k: snapshot(v) for k, v in batch.items()}
    return batch


def epoch(iterable):
    return [snapshot(batch) for batch in iterable]


def assert_same_batches(got, expected):
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        if isinstance(b, torch.Tensor):
            assert torch.equal(a, b)
        elif isinstance(b, (list, tuple)):
            assert type(a) is type(b)
            assert_same_batches(list(a), list(b))
        elif isinstance(b, dict):
            assert a.keys() == b.keys()
            assert_same_batches(list(a.values()), list(b.values()))
        else:
            assert a == b


# Datasets live at module level so that forkserver and spawn workers can import them.
class RaisingDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        if index == 5:
            raise ValueError(f"cannot load element {index}")
        return torch.tensor([float(index)])


class CountingDataset(torch.utils.data.Dataset):
    """Counts the elements loaded, in memory shared with forked workers."""

    def __init__(self, n):
        self.n = n
        self.loaded = multiprocessing.get_context("fork").Value("i", 0)

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        with self.loaded.get_lock():
            self.loaded.value += 1
        return torch.tensor([float(index)])


class NamedDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, index):
        return {"x": torch.full((2,), float(index)), "name": f"item{index}"}


class SlowDataset(torch.utils.data.Dataset):
    """10 ms per element and 10 000 elements: a test that ends within its bound (60 s, for a busy
    machine) has seen the loader stop early; reading to the end takes 100 s."""

    def __len__(self):
        return 10000

    def __getitem__(self, index):
        time.sleep(0.01)
        return torch.tensor([float(index)])


def _fail_to_unpickle():
    raise RuntimeError("this dataset cannot be rebuilt in another process")


class UnpicklableInWorker(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        return torch.tensor([float(index)])

    def __reduce__(self):
        return _fail_to_unpickle, ()


# --- same data as the synchronous loader ------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("strategy", [SharingStrategy.Fork, SharingStrategy.ForkServer])
def test_async_loader_matches_sync_loader_over_epochs(strategy):
    dataset = indexed_dataset(37)
    torch.manual_seed(11)
    sync = DataLoader(make_options(di=2, r=2), dataset, batch_size=2, shuffle=True)
    expected = [epoch(sync) for _ in range(3)]
    torch.manual_seed(11)  # the worker's shuffling continues from the parent's random state
    loader = DataLoader(make_options(di=2, r=2), dataset, batch_size=2, shuffle=True, mode=DataLoaderMode.Async,
                        async_options={"sharing_strategy": strategy})
    assert len(loader) == len(sync) == 4
    for expected_epoch in expected:
        assert_same_batches(epoch(loader), expected_epoch)
    loader.terminate()


def test_sharing_strategy_by_name_or_number():
    """YAML configs name the strategy (Graphcore's conformer: sharing_strategy: "SharedMemory");
    anything else is refused before a worker starts, naming the choices."""
    dataset = indexed_dataset(6)
    expected = epoch(DataLoader(make_options(), dataset, batch_size=2))
    for strategy in ("SharedMemory", int(SharingStrategy.Fork)):
        loader = DataLoader(make_options(), dataset, batch_size=2, mode=DataLoaderMode.Async,
                            async_options={"sharing_strategy": strategy})
        assert_same_batches(epoch(loader), expected)
        loader.terminate()
    with pytest.raises(ValueError, match="'shared' is not a poptorch.SharingStrategy.*SharedMemory, FileSystem"):
        AsynchronousDataAccessor(dataset, sharing_strategy="shared")


@pytest.mark.parametrize("n,worker_size,drop_last", [(37, 3, True), (37, 3, False), (10, 3, True),
                                                      (40, None, False), (23, 8, False)])
def test_async_rebatched_matches_sync_loader(n, worker_size, drop_last):
    dataset = indexed_dataset(n)
    sync = DataLoader(make_options(di=2, ga=2), dataset, batch_size=2, drop_last=drop_last)
    loader = DataLoader(make_options(di=2, ga=2), dataset, batch_size=2, drop_last=drop_last,
                        mode=DataLoaderMode.AsyncRebatched, rebatched_worker_size=worker_size, async_options=FORK)
    assert loader.combinedBatchSize == 8
    assert len(loader) == len(sync)
    for _ in range(2):
        assert_same_batches(epoch(loader), epoch(sync))
    loader.terminate()


def test_async_with_drop_last_false_is_rebatched_and_keeps_the_short_batch():
    dataset = indexed_dataset(11)
    loader = DataLoader(make_options(di=2), dataset, batch_size=2, drop_last=False, mode=DataLoaderMode.Async,
                        async_options=FORK)
    assert loader._mode == DataLoaderMode.AsyncRebatched
    assert len(loader) == 3
    assert [b[1].tolist() for b in epoch(loader)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10]]
    loader.terminate()


def test_async_distributed_shuffle_matches_sync():
    dataset = indexed_dataset(30)
    sync = DataLoader(make_options(di=2, process=(1, 2), seed=5), dataset, batch_size=2, shuffle=True)
    loader = DataLoader(make_options(di=2, process=(1, 2), seed=5), dataset, batch_size=2, shuffle=True,
                        mode=DataLoaderMode.Async, async_options=FORK)
    for _ in range(3):
        assert_same_batches(epoch(loader), epoch(sync))
    loader.terminate()


@pytest.mark.parametrize("load_indefinitely", [True, False])
@pytest.mark.parametrize("early_preload", [True, False])
def test_accessor_over_a_torch_loader(load_indefinitely, early_preload):
    dataset = indexed_dataset(20)
    torch_loader = torch.utils.data.DataLoader(dataset, batch_size=3, drop_last=False)
    accessor = AsynchronousDataAccessor(torch_loader, buffer_size=2, load_indefinitely=load_indefinitely,
                                        early_preload=early_preload, **FORK)
    assert len(accessor) == 7
    expected = epoch(torch_loader)  # the short last batch travels through the queue
    for _ in range(3):
        assert_same_batches(epoch(accessor), expected)
    accessor.terminate()


def test_accessor_rebatches_a_torch_loader():
    torch_loader = torch.utils.data.DataLoader(indexed_dataset(20), batch_size=3)
    accessor = AsynchronousDataAccessor(torch_loader, rebatched_size=4, **FORK)
    assert len(accessor) == 5
    assert [b[1].tolist() for b in epoch(accessor)] == [list(range(i, i + 4)) for i in range(0, 20, 4)]
    accessor.terminate()


def test_accessor_with_torch_workers_and_non_tensor_leaves():
    torch_loader = torch.utils.data.DataLoader(NamedDataset(), batch_size=2, num_workers=2)
    accessor = AsynchronousDataAccessor(torch_loader, **FORK)
    expected = epoch(torch_loader)
    assert_same_batches(epoch(accessor), expected)
    assert_same_batches(epoch(accessor), expected)
    accessor.terminate()


class CountingIterable(torch.utils.data.IterableDataset):
    def __iter__(self):
        for i in range(19):
            yield torch.tensor([float(i)]), i


@pytest.mark.parametrize("mode,drop_last", [(DataLoaderMode.Async, True), (DataLoaderMode.AsyncRebatched, False)])
def test_async_iterable_dataset_matches_sync(mode, drop_last):
    sync = DataLoader(make_options(di=2), CountingIterable(), batch_size=2, drop_last=drop_last)
    loader = DataLoader(make_options(di=2), CountingIterable(), batch_size=2, drop_last=drop_last, mode=mode,
                        rebatched_worker_size=3, async_options=FORK)
    for _ in range(2):
        assert_same_batches(epoch(loader), epoch(sync))
    loader.terminate()


@pytest.mark.slow
def test_spawned_worker_with_the_file_system_strategy():
    loader = DataLoader(make_options(r=2), indexed_dataset(9), batch_size=2)
    accessor = AsynchronousDataAccessor(loader, sharing_strategy=SharingStrategy.FileSystem)
    assert_same_batches(epoch(accessor), epoch(loader))
    accessor.terminate()


def test_accessor_over_a_plain_iterable():
    batches = [torch.full((2, 2), float(i)) for i in range(5)]
    accessor = AsynchronousDataAccessor(batches, **FORK)
    assert len(accessor) == 5
    assert_same_batches(epoch(accessor), batches)
    accessor.terminate()


# --- shared-memory slots and the buffer -------------------------------------------------
def test_batches_live_in_reused_shared_memory_slots():
    loader = DataLoader(make_options(), indexed_dataset(12), batch_size=2)
    accessor = AsynchronousDataAccessor(loader, buffer_size=2, **FORK)
    storages = set()
    for x, y in accessor:
        assert x.is_shared() and y.is_shared()
        storages.add(x.untyped_storage().data_ptr())
    assert len(storages) == 2  # one per slot, whatever the number of batches
    first = next(iter(accessor))
    kept = snapshot(first)
    assert torch.equal(first[1], torch.tensor([0, 1]))
    first[1].fill_(-1)  # writing into a slot doesn't corrupt later batches: each one is copied in whole
    assert_same_batches(epoch(accessor), epoch(loader))
    assert torch.equal(kept[1], torch.tensor([0, 1]))
    accessor.terminate()


def _wait_for_value(value, expected, timeout=5.0):
    deadline = time.monotonic() + timeout
    while value.value < expected and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # and it stays there
    return value.value


@pytest.mark.parametrize("buffer_size", [1, 3])
def test_buffer_size_bounds_the_batches_loaded_ahead(buffer_size):
    dataset = CountingDataset(50)
    loader = torch.utils.data.DataLoader(dataset, batch_size=1)
    accessor = AsynchronousDataAccessor(loader, buffer_size=buffer_size, early_preload=True, **FORK)
    assert _wait_for_value(dataset.loaded, buffer_size) == buffer_size
    iterator = iter(accessor)
    for taken in range(1, 4):
        assert next(iterator)[0].item() == taken - 1
        # The batch being used keeps its slot until the next one is requested.
        assert _wait_for_value(dataset.loaded, buffer_size + taken - 1) == buffer_size + taken - 1
    accessor.terminate()


# --- epochs ---------------------------------------------------------------------------
def test_each_iter_is_one_epoch_and_breaking_early_restarts_cleanly():
    loader = DataLoader(make_options(), indexed_dataset(30), batch_size=3)
    expected = epoch(loader)
    accessor = AsynchronousDataAccessor(loader, buffer_size=2, **FORK)
    for i, _ in enumerate(accessor):
        if i == 2:
            break
    assert_same_batches(epoch(accessor), expected)
    it = iter(accessor)
    assert iter(it) is it  # iter() on an epoch that hasn't started doesn't skip it
    assert_same_batches(epoch(it), expected)
    accessor.terminate()


def test_next_raises_stop_iteration_once_per_epoch():
    accessor = AsynchronousDataAccessor(DataLoader(make_options(), indexed_dataset(4), batch_size=2), **FORK)
    assert next(accessor)[1].tolist() == [0, 1]
    assert next(accessor)[1].tolist() == [2, 3]
    with pytest.raises(StopIteration):
        next(accessor)
    assert next(accessor)[1].tolist() == [0, 1]  # the next epoch
    accessor.terminate()


# --- error texts ---------------------------------------------------------------------
def test_loader_that_already_has_an_accessor_is_rejected():
    loader = DataLoader(make_options(), indexed_dataset(8), mode=DataLoaderMode.Async, async_options=FORK)
    with pytest.raises(Error) as info:
        AsynchronousDataAccessor(loader)
    assert str(info.value) == (
        "The DataLoader already uses an AsynchronousDataAccessor internally. Either use the existing one or "
        "set mode='poptorch.DataLoaderMode.Sync' in the DataLoader.")
    loader.terminate()


@pytest.mark.parametrize("size", [1, 0, -2])
def test_rebatched_size_must_exceed_one(size):
    with pytest.raises(AssertionError, match="rebatched_size"):
        AsynchronousDataAccessor(indexed_dataset(8), rebatched_size=size, **FORK)


@pytest.mark.parametrize("source", [
    torch.utils.data.DataLoader(indexed_dataset(0), batch_size=2),
    DataLoader(make_options(di=4), indexed_dataset(3)),  # fewer elements than one combined batch
])
def test_empty_dataset_is_rejected(source):
    """PopTorch's text; when a poptorch.DataLoader's batching leaves no batch, openpop's line names the sizes."""
    with pytest.raises(Error) as info:
        AsynchronousDataAccessor(source, **FORK)
    if isinstance(source, DataLoader):
        assert str(info.value).startswith("The Dataset is empty\nopenpop: poptorch.DataLoader has no batch to give: "
                                          "the dataset has 3 elements and one host call takes a combined batch of 4 ")
    else:
        assert str(info.value) == "The Dataset is empty"


def test_empty_iterable_without_length_is_reported_when_iterated():
    accessor = AsynchronousDataAccessor(iter([]), **FORK)
    with pytest.raises(Error, match="^The Dataset is empty$"):
        next(iter(accessor))


def test_worker_failing_to_start_is_reported():
    # The dataset pickles but can't be rebuilt in the worker process.
    with pytest.raises(Error) as info:
        AsynchronousDataAccessor(UnpicklableInWorker(), sharing_strategy=SharingStrategy.ForkServer)
    assert str(info.value) == "AsynchronousDataAccessor worker thread failed to start (Check above for details)"
    # The dataset can't be pickled at all (forkserver needs it to be).
    unpicklable = TensorDataset(torch.zeros(4, 1))
    unpicklable.transform = lambda x: x
    with pytest.raises(Error, match="worker thread failed to start"):
        AsynchronousDataAccessor(unpicklable, sharing_strategy=SharingStrategy.ForkServer)


@pytest.mark.parametrize("strategy", [SharingStrategy.Fork, SharingStrategy.ForkServer])
def test_dataset_error_is_raised_in_the_parent_quickly(strategy):
    loader = torch.utils.data.DataLoader(RaisingDataset(), batch_size=2)
    accessor = AsynchronousDataAccessor(loader, sharing_strategy=strategy)
    start = time.monotonic()
    got = []
    with pytest.raises(ValueError, match="cannot load element 5") as info:
        for batch in accessor:
            got.append(batch.clone())
    assert time.monotonic() - start < 60  # (a hang, not a speed: the error arrives within a poll)
    assert [b.flatten().tolist() for b in got] == [[0.0, 1.0], [2.0, 3.0]]
    cause = info.value.__cause__
    assert isinstance(cause, WorkerTraceback)
    assert "__getitem__" in str(cause) and "ValueError: cannot load element 5" in str(cause)
    with pytest.raises(Error, match="stopped after an error: ValueError: cannot load element 5"):
        next(accessor)


def test_worker_killed_is_reported():
    accessor = AsynchronousDataAccessor(torch.utils.data.DataLoader(SlowDataset(), batch_size=1), **FORK)
    next(iter(accessor))
    os.kill(accessor._process.pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(Error, match="exited unexpectedly"):
        for _ in accessor:
            pass
    assert time.monotonic() - start < 60  # (SlowDataset: reading to the end would take 100 s)
    with pytest.raises(Error, match="exited unexpectedly"):
        next(accessor)


def test_terminate_and_garbage_collection_stop_the_worker():
    accessor = AsynchronousDataAccessor(torch.utils.data.DataLoader(SlowDataset(), batch_size=1), **FORK)
    next(iter(accessor))
    pid = accessor._process.pid
    accessor.terminate()
    accessor.terminate()
    assert not alive(pid)
    with pytest.raises(Error, match="terminated"):
        next(accessor)
    other = AsynchronousDataAccessor(torch.utils.data.DataLoader(SlowDataset(), batch_size=1), **FORK)
    pid = other._process.pid
    del other
    assert wait_gone([pid], 30.0) == []


def _start_and_die(connection):
    accessor = AsynchronousDataAccessor(torch.utils.data.DataLoader(SlowDataset(), batch_size=1),
                                        early_preload=True, **FORK)
    connection.send(accessor._process.pid)
    os._exit(0)  # no clean-up at all


def test_worker_stops_when_its_parent_dies():
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    parent = context.Process(target=_start_and_die, args=(sender,))
    parent.start()
    worker_pid = receiver.recv()
    parent.join(10)
    assert wait_gone([worker_pid], 30.0) == []


# --- the interpreter always exits --------------------------------------------------------
SCRIPT_PREAMBLE = """
import sys, time, torch
from openpop.data import AsynchronousDataAccessor, DataLoader
from openpop.enums import SharingStrategy
from openpop.options import Options

class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 1000
    def __getitem__(self, index):
        time.sleep(0.001)
        if index == {fail_at}:
            raise KeyError("element {fail_at} is missing")
        return torch.tensor([float(index) ** 2])
"""


def run_script(directory, body, fail_at=-1, timeout=60):
    """Run ``body`` as a script; returns the result and when it exited (monotonic clock)."""
    script = directory / "script.py"  # a file, so that forkserver workers can import its dataset
    script.write_text(SCRIPT_PREAMBLE.format(fail_at=fail_at) + textwrap.dedent(body))
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout,
                            env=env)
    return result, time.monotonic()


@pytest.mark.slow
def test_interpreter_exits_with_live_accessors_and_abandoned_loops(tmp_path):
    result, exited = run_script(tmp_path, """
        if __name__ == "__main__":
            loader = DataLoader(Options(), Squares(), batch_size=2)
            untouched = AsynchronousDataAccessor(loader, early_preload=True)  # forkserver
            forked = AsynchronousDataAccessor(loader, sharing_strategy=SharingStrategy.Fork)
            for i, batch in enumerate(forked):
                if i == 3:
                    break  # abandoned mid-epoch, never terminated
            async_loader = DataLoader(Options(), Squares(), batch_size=4, mode=1,
                                      async_options={"sharing_strategy": SharingStrategy.Fork})
            print(next(iter(async_loader)).flatten().tolist(), flush=True)
            print([p.pid for p in (untouched._process, forked._process, async_loader._accessor._process)])
            print(time.monotonic())  # the system-wide clock: comparable with the test's
    """)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "[0.0, 1.0, 4.0, 9.0]"
    assert all(not alive(int(pid)) for pid in lines[1].strip("[]").split(","))
    # Clean-up and interpreter shutdown. A worker that ignores the stop request is killed only after
    # 2 x _STOP_GRACE_SECONDS (4 s), so three of them would take >= 12 s; a graceful exit takes ~1 s
    # idle but went past 5 s on a machine loaded 10 deep, hence 10 s.
    assert exited - float(lines[2]) < 30  # (a hang, not a speed: the exit waits on no worker)


@pytest.mark.slow
def test_uncaught_dataset_error_ends_the_script(tmp_path):
    result, _ = run_script(tmp_path, """
        if __name__ == "__main__":
            accessor = AsynchronousDataAccessor(DataLoader(Options(), Squares(), batch_size=2))
            for batch in accessor:
                pass
    """, fail_at=7)
    assert result.returncode == 1
    assert "KeyError: 'element 7 is missing'" in result.stderr
    assert "In the AsynchronousDataAccessor worker process" in result.stderr
