"""Soak, bounded: does a long run keep its resources flat? Host calls of a small model on the
eager and on the compiled backend, epochs of the asynchronous data loader with torch workers, and
compiled models built and dropped one after another.

    python benchmarks/soak.py [--calls 5000] [--epochs 100] [--rebuilds 30] [--samples 50]
        [--warmup 0.2] [--only eager compiled loader rebuild]

Each soak runs in a process of its own (nothing one leaves behind shows in another).

* eager, compiled: a ``trainingModel`` (MLP 32-64-4, SGD with momentum, ``deviceIterations(2)``)
  called with fresh input tensors each call, its loss read; every 50th call also steps an LR
  scheduler, runs an ``inferenceModel`` of the same weights (uploaded to it again) and reads the
  perf counters. ``--samples`` samples over the run.
* loader: ``poptorch.DataLoader`` in ``DataLoaderMode.Async`` with 2 torch workers (persistent),
  3x32x32 float images, 16 combined batches of 32 per epoch; one sample per epoch. A loader made,
  run one epoch and terminated first opens what a process keeps for all its loaders (the fork
  server and its pipes, multiprocessing's shared heap) and is the baseline for after the soak's
  loader is terminated.
* rebuild: the MLP's compiled ``trainingModel`` built, called 3 times and dropped, ``--rebuilds``
  times; one sample per model, fitted after the 10th.

Sampled: anonymous resident memory (``/proc/<pid>/statm``: resident less shared pages; the total
is shown too, for information: its file-backed pages - libtorch's code - come and go with the
machine's memory pressure, 70 MB at a time), open file descriptors (``/proc/<pid>/fd``), Python
objects tracked by the gc, and shared memory: the bytes of ``/dev/shm`` files the processes map
or hold open (deleted ones included: torch unlinks its segments once mapped), each file counted
once, plus ``/dev/shm`` files named after one of the processes (``torch_<pid>_*``, ``pym-<pid>-*``:
left behind by a process that died before unlinking them). The loader's figures are the main
process's and, separately, its loading process's with that one's torch workers (sampled once two
samples in a row agree: ``settled_tree_sample``).

Slopes are least-squares fits over the samples after the first ``--warmup`` fraction (warm-up:
caches, allocator arenas, the compile). Verdict "flat" when anonymous RSS grows less than 16 KiB
per 1000 host calls (16 bytes a call; glibc's heap moves by whole pages now and then) or 64 KiB
per epoch, and fds, gc objects and shm bytes do not grow at all (the last sample after warm-up no
higher than the first; the loader's processes: by slope). Rebuilt compiled models: at most 256 KiB
and 200 objects per model, what torch itself keeps per compiled graph (see ``summarize_rebuilds``).
Prints a table per soak, then one JSON line.
"""
import argparse
import array
import functools
import gc
import json
import os
import subprocess
import sys
import time

import torch

# The /proc readers the soak tests use (tests/helpers/process_resources.py), shared rather than copied.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests"))
from helpers.process_resources import PAGE, descendants, fd_targets, rss_kib, shm_files

RSS_KIB_PER_1000_CALLS = 16.0
RSS_KIB_PER_EPOCH = 64.0
RSS_KIB_PER_MODEL = 256.0
REBUILD_WARMUP_MODELS = 10


# ---------------------------------------------------------------------- probes (/proc)
def rss_total_kib(pid="self") -> int:
    with open(f"/proc/{pid}/statm") as stream:
        return int(stream.read().split()[1]) * PAGE // 1024


def named_shm(pids) -> dict:
    """``{name: bytes}`` of /dev/shm files named after one of ``pids``."""
    marks = tuple(f"torch_{pid}_" for pid in pids) + tuple(f"pym-{pid}-" for pid in pids)
    found = {}
    for name in os.listdir("/dev/shm"):
        if name.startswith(marks):
            try:
                found[name] = os.stat(os.path.join("/dev/shm", name)).st_size
            except OSError:
                pass
    return found


def tree_sample(pids) -> dict:
    """RSS, fds and shared memory of the processes ``pids`` together."""
    alive = [pid for pid in pids if os.path.exists(f"/proc/{pid}")]
    return {"rss_kib": sum(rss_kib(pid) for pid in alive), "fds": sum(len(fd_targets(pid)) for pid in alive),
            "shm_bytes": sum(shm_files(alive).values()), "processes": len(alive)}


def settled_tree_sample(pids, tries=100, pause=0.02) -> dict:
    """``tree_sample`` once two in a row agree on fds and shm: the loading process goes on with
    the next epoch (``load_indefinitely``) until its slots and the torch workers' prefetch are full,
    and a sample taken while batches are in transit counts them twice or not at all."""
    last = tree_sample(pids)
    for _ in range(tries):
        time.sleep(pause)
        now = tree_sample(pids)
        if (now["fds"], now["shm_bytes"]) == (last["fds"], last["shm_bytes"]):
            return now
        last = now
    return last


def slope(xs, ys) -> float:
    """Least-squares slope of ys over xs."""
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    spread = sum((x - mean_x) ** 2 for x in xs)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread if spread else 0.0


class Samples:
    """Integer columns allocated before the soak, so that keeping its samples does not itself
    grow the process's memory (a list of dicts grows ~1 KiB a sample)."""

    def __init__(self, rows, *columns):
        self.columns = columns
        self.values = array.array("q", bytes(8 * rows * len(columns)))
        self.count = 0

    def record(self, *values):
        start = self.count * len(self.columns)
        for k, value in enumerate(values):
            self.values[start + k] = value
        self.count += 1

    def rows(self):
        width = len(self.columns)
        return [dict(zip(self.columns, self.values[i * width:(i + 1) * width])) for i in range(self.count)]


def after_warmup(samples, warmup):
    return samples[min(int(len(samples) * warmup), len(samples) - 2):]


# ---------------------------------------------------------------------- the soaks (workers)
class MLP(torch.nn.Module):
    """32 -> 64 -> 4, ReLU, MSE loss: a host call's work is small, so what each call keeps shows."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 4)

    def forward(self, x, target):
        out = self.fc2(torch.relu(self.fc1(x)))
        return out, torch.nn.functional.mse_loss(out, target)


def options(backend):
    import poptorch
    opts = poptorch.Options().deviceIterations(2).openpopBackend(backend)
    opts.showCompilationProgressBar(False)
    return opts


def host_call_soak(args):
    import poptorch
    torch.set_num_threads(1)  # a tiny model: one thread, and the other core stays free
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9999)
    training = poptorch.trainingModel(model, options(args.worker), optimizer)
    inference = poptorch.inferenceModel(model, options(args.worker))
    generator = torch.Generator().manual_seed(0)
    every = max(args.calls // args.samples, 1)
    samples = Samples(args.calls // every, "calls", "rss_kib", "rss_total_kib", "fds", "objects", "shm_bytes")
    me, started = os.getpid(), time.perf_counter()
    for call in range(1, args.calls + 1):
        x, target = torch.randn(16, 32, generator=generator), torch.randn(16, 4, generator=generator)
        _, loss = training(x, target)
        float(loss.mean())
        if call % 50 == 0:
            scheduler.step()
            training.setOptimizer(optimizer)
            inference(x, target)
            training.getPerfCounters()
        if call % every == 0:
            gc.collect()
            samples.record(call, rss_kib(), rss_total_kib(), len(fd_targets()), len(gc.get_objects()),
                           sum(shm_files([me]).values()))
    seconds = time.perf_counter() - started
    print(json.dumps({"samples": samples.rows(), "seconds": seconds, "last_backend": training._dispatch.compiled.last}))


def rebuild_soak(args):
    """Compiled models built, run 3 host calls and dropped, one after another."""
    import weakref

    import poptorch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    samples = Samples(args.rebuilds, "models", "rss_kib", "rss_total_kib", "fds", "objects")
    alive, started = [], time.perf_counter()
    for built in range(1, args.rebuilds + 1):
        model = MLP()
        training = poptorch.trainingModel(model, options("compiled"), torch.optim.SGD(model.parameters(), lr=0.01))
        for _ in range(3):
            training(torch.randn(16, 32), torch.randn(16, 4))
        last = training._dispatch.compiled.last
        alive.append(weakref.ref(model))
        del model, training
        gc.collect()
        gc.collect()  # a program's finalizer runs in the first pass, freeing a cycle for the second
        samples.record(built, rss_kib(), rss_total_kib(), len(fd_targets()), len(gc.get_objects()))
    seconds = time.perf_counter() - started
    print(json.dumps({"samples": samples.rows(), "seconds": seconds, "last_backend": last,
                      "models_alive": sum(ref() is not None for ref in alive)}))


class Images(torch.utils.data.Dataset):
    """Element i: a 3x32x32 float image made from i, and its label (module level: the loading
    process, started by the fork server, unpickles it)."""

    def __init__(self, size):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(index)
        return torch.rand(3, 32, 32, generator=generator), index % 10


def make_loader(workers, batch, batches):
    import poptorch
    dataset = Images(batch * batches)
    opts = poptorch.Options().deviceIterations(2)
    return poptorch.DataLoader(opts, dataset, batch_size=batch // 2, num_workers=workers,
                               mode=poptorch.DataLoaderMode.Async)


def loader_soak(args):
    torch.manual_seed(0)
    me = os.getpid()

    def main_sample():
        return {"rss_kib": rss_kib(), "rss_total_kib": rss_total_kib(), "fds": len(fd_targets()),
                "shm_bytes": sum(shm_files([me]).values())}

    warm = make_loader(args.workers, 32, 16)  # opens what the process keeps for every loader
    sum(1 for _ in warm)
    warm.terminate()
    del warm
    gc.collect()
    before = {**main_sample(), "fd_targets": sorted(fd_targets()), "children": sorted(descendants(me)),
              "named_shm": named_shm([me])}
    loader = make_loader(args.workers, 32, 16)
    loading = loader._accessor._process.pid
    samples = Samples(args.epochs, "epoch", "elements", "rss_kib", "rss_total_kib", "fds", "shm_bytes",
                      "loader_rss_kib", "loader_fds", "loader_shm_bytes", "loader_processes", "named_shm_bytes")
    started, seen_pids = time.perf_counter(), {me, loading}
    for epoch in range(1, args.epochs + 1):
        count = 0
        for images, labels in loader:
            count += int(labels.shape[0])
            float(images[0, 0, 0, 0])
        tree = [loading] + descendants(loading)
        seen_pids.update(tree)
        main, loading_tree = main_sample(), settled_tree_sample(tree)
        samples.record(epoch, count, main["rss_kib"], main["rss_total_kib"], main["fds"], main["shm_bytes"],
                       loading_tree["rss_kib"],
                       loading_tree["fds"], loading_tree["shm_bytes"], loading_tree["processes"],
                       sum(named_shm(seen_pids).values()))
    seconds = time.perf_counter() - started
    workers = descendants(loading)
    loader.terminate()
    del loader, images, labels
    gc.collect()
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{pid}") for pid in [loading] + workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    after = {**main_sample(), "fd_targets": sorted(fd_targets()), "children": sorted(descendants(me)),
             "named_shm": named_shm(seen_pids)}
    left = [pid for pid in [loading] + workers if os.path.exists(f"/proc/{pid}")]
    print(json.dumps({"samples": samples.rows(), "seconds": seconds, "before": before, "after": after,
                      "loader_processes_left": left, "torch_workers": len(workers)}))


# ---------------------------------------------------------------------- the report
def run_worker(name, args):
    command = [sys.executable, os.path.abspath(__file__), "--worker", name, "--calls", str(args.calls),
               "--epochs", str(args.epochs), "--samples", str(args.samples), "--workers", str(args.workers),
               "--rebuilds", str(args.rebuilds)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("OPENPOP_BACKEND", None)
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=os.path.dirname(__file__))
    if done.returncode != 0:
        sys.exit(f"{name} soak failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def fit_rows(samples, warmup, x, rows, per):
    """Per row ``(label, column, unit)``: first, first fitted and last values, and the slope per
    ``per`` of ``x`` over the samples after warm-up."""
    kept = after_warmup(samples, warmup)
    xs = [s[x] for s in kept]
    fitted = {}
    for label, column, unit in rows:
        fitted[label] = {"slope": slope(xs, [s[column] for s in kept]) * per,
                         "growth": kept[-1][column] - kept[0][column]}
        print(f"  {label:<22}{samples[0][column]:>11} -> {kept[0][column]:>11} -> {samples[-1][column]:>11} "
              f"{unit:<4} slope {fitted[label]['slope']:+11.3f} {unit}")
    return kept, fitted


def summarize_host_calls(name, run, warmup):
    samples = run["samples"]
    print(f"{name}: {samples[-1]['calls']} host calls in {run['seconds']:.1f} s (ran on: {run['last_backend']}), "
          f"{len(samples)} samples; first, first fitted ({int(warmup * 100)}%), last; slope per 1000 calls")
    _, fitted = fit_rows(samples, warmup, "calls", [
        ("RSS (anonymous)", "rss_kib", "KiB"), ("RSS (total, info)", "rss_total_kib", "KiB"),
        ("open fds", "fds", ""), ("gc objects", "objects", ""), ("shm mapped", "shm_bytes", "B")], 1000)
    flat = (fitted["RSS (anonymous)"]["slope"] < RSS_KIB_PER_1000_CALLS
            and all(fitted[k]["growth"] <= 0 for k in ("open fds", "gc objects", "shm mapped")))
    print(f"  verdict: {'flat' if flat else 'GROWS'}")
    return {"calls": samples[-1]["calls"], "seconds": round(run["seconds"], 1), "ran_on": run["last_backend"],
            "rss_kib_per_1000_calls": round(fitted["RSS (anonymous)"]["slope"], 3),
            "rss_total_kib_per_1000_calls": round(fitted["RSS (total, info)"]["slope"], 3),
            "fds_per_1000_calls": round(fitted["open fds"]["slope"], 4),
            "objects_per_1000_calls": round(fitted["gc objects"]["slope"], 3),
            "shm_bytes_per_1000_calls": round(fitted["shm mapped"]["slope"], 3),
            "growth_after_warmup": {k: v["growth"] for k, v in fitted.items()}, "flat": flat}


def summarize_loader(run, warmup):
    samples = run["samples"]
    print(f"loader: {len(samples)} epochs of {samples[-1]['elements']} elements in {run['seconds']:.1f} s, "
          f"{run['torch_workers']} torch workers; first, first fitted, last; slope per epoch")
    _, fitted = fit_rows(samples, warmup, "epoch", [
        ("main RSS (anonymous)", "rss_kib", "KiB"), ("main RSS (total, info)", "rss_total_kib", "KiB"),
        ("main open fds", "fds", ""), ("main shm mapped", "shm_bytes", "B"),
        ("loader RSS (anonymous)", "loader_rss_kib", "KiB"), ("loader open fds", "loader_fds", ""),
        ("loader shm mapped", "loader_shm_bytes", "B"), ("/dev/shm files named", "named_shm_bytes", "B")], 1)
    before, after = run["before"], run["after"]
    released = {
        "fds": after["fds"] - before["fds"], "shm_bytes": after["shm_bytes"] - before["shm_bytes"],
        "fd_targets_left": sorted(set(after["fd_targets"]) - set(before["fd_targets"])),
        "children_left": sorted(set(after["children"]) - set(before["children"])),
        "named_shm_left": sorted(set(after["named_shm"]) - set(before["named_shm"])),
        "loader_processes_left": run["loader_processes_left"]}
    clean = (released["fds"] <= 0 and released["shm_bytes"] <= 0 and not released["children_left"]
             and not released["named_shm_left"] and not released["loader_processes_left"])
    # The loader's processes are sampled once settled (settled_tree_sample), the main process as it is:
    # its fds and shm must not move at all.
    flat = (fitted["main RSS (anonymous)"]["slope"] < RSS_KIB_PER_EPOCH
            and fitted["loader RSS (anonymous)"]["slope"] < RSS_KIB_PER_EPOCH
            and all(fitted[k]["growth"] <= 0 for k in ("main open fds", "main shm mapped", "/dev/shm files named"))
            and fitted["loader open fds"]["slope"] < 0.05 and fitted["loader shm mapped"]["slope"] < PAGE / 20)
    print(f"  after terminate vs before the loader: fds {released['fds']:+d}, shm {released['shm_bytes']:+d} B, "
          f"processes left {released['loader_processes_left'] or 'none'}, /dev/shm files left "
          f"{released['named_shm_left'] or 'none'}")
    print(f"  verdict: {'flat' if flat else 'GROWS'}; released on terminate: {'yes' if clean else 'NO'}")
    return {"epochs": len(samples), "elements_per_epoch": samples[-1]["elements"],
            "seconds": round(run["seconds"], 1), "torch_workers": run["torch_workers"],
            "per_epoch": {k: round(v["slope"], 3) for k, v in fitted.items()},
            "growth_after_warmup": {k: v["growth"] for k, v in fitted.items()},
            "released": released, "flat": flat, "released_on_terminate": clean}


def summarize_rebuilds(run, warmup):
    samples = run["samples"]
    # Torch's first 8 compiled graphs of a process also fill a bounded cache (~780 objects each,
    # 120 per graph after): the fit starts after the 10th model.
    warmup = max(warmup, min(REBUILD_WARMUP_MODELS / len(samples), 0.5))
    print(f"rebuild: {len(samples)} compiled models built, run and dropped in {run['seconds']:.1f} s "
          f"({run['models_alive']} still alive); first, first fitted, last; slope per model")
    _, fitted = fit_rows(samples, warmup, "models", [
        ("RSS (anonymous)", "rss_kib", "KiB"), ("RSS (total, info)", "rss_total_kib", "KiB"),
        ("open fds", "fds", ""), ("gc objects", "objects", "")], 1)
    # What torch keeps per compiled graph whatever openpop does: Inductor's loaded output-code
    # module (PyCodeCache), Dynamo's per-code state and its 128-entry cache of decoded bytecode.
    bounded = (fitted["RSS (anonymous)"]["slope"] < RSS_KIB_PER_MODEL and fitted["gc objects"]["slope"] < 200
               and fitted["open fds"]["growth"] <= 0 and run["models_alive"] == 0)
    print(f"  verdict: {'within torch own per-compile residue' if bounded else 'GROWS'}")
    return {"models": len(samples), "seconds": round(run["seconds"], 1), "models_alive": run["models_alive"],
            "per_model": {k: round(v["slope"], 3) for k, v in fitted.items()}, "within_residue": bounded}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=5000, help="host calls per backend")
    parser.add_argument("--epochs", type=int, default=100, help="epochs of the async loader")
    parser.add_argument("--rebuilds", type=int, default=30, help="compiled models built and dropped")
    parser.add_argument("--samples", type=int, default=50, help="samples over the host calls")
    parser.add_argument("--workers", type=int, default=2, help="torch workers of the loader")
    parser.add_argument("--warmup", type=float, default=0.2, help="fraction of the samples left out of the fits")
    parser.add_argument("--only", nargs="+", default=list(SOAKS), choices=list(SOAKS))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return {"loader": loader_soak, "rebuild": rebuild_soak}.get(args.worker, host_call_soak)(args)

    from _machine import cpu_name
    results = {}
    for name in args.only:
        results[name] = SOAKS[name](run_worker(name, args), args.warmup)
        print(flush=True)
    verdict = all(r.get("flat", True) and r.get("released_on_terminate", True) and r.get("within_residue", True)
                  for r in results.values())
    print(f"verdict: {'flat' if verdict else 'GROWS'}")
    print(json.dumps({"benchmark": "soak", "cpu": cpu_name(), "cores": os.cpu_count(), "warmup": args.warmup,
                      **results, "flat": verdict}))


SOAKS = {"eager": functools.partial(summarize_host_calls, "eager"),
         "compiled": functools.partial(summarize_host_calls, "compiled"),
         "loader": summarize_loader, "rebuild": summarize_rebuilds}

if __name__ == "__main__":
    main()
