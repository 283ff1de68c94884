"""Data loaders with torch workers: first-batch latency and steady-state throughput of torch's
DataLoader vs openpop's DataLoader in Sync and Async modes (same dataset, workers, batch size and
persistent workers), measured side by side in this run.

    python benchmarks/loader_startup.py [--workers 2] [--batch-size 16] [--batches 150] [--rounds 3]

* first batch: from constructing the loader to holding its first batch (new worker processes).
* next epoch: the first batch of the second epoch (the workers are kept: persistent_workers).
* samples/s: the batches after the first one of an epoch.

The first Async loader of a process also starts the fork server that every later one forks its
loading process from (one interpreter start with torch and openpop imported); it is reported on
its own line. ``async, workers via own fork server`` is what every Async loader did before the
loading process forked its torch workers itself: it passes ``multiprocessing_context="forkserver"``,
which makes the loading process start a fork server of its own for its workers.
Variants are interleaved round by round and the best round is kept, so machine load hits all alike.
Prints a table with ratios to torch's DataLoader, then one JSON line.
"""
import argparse
import json
import statistics
import time

import torch

import poptorch


class DecodedImages(torch.utils.data.Dataset):
    """A 3x32x32 float image and a label per index, made with a little per-item work (like a decode
    and a normalisation)."""

    def __init__(self, size):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(index)
        pixels = torch.randint(0, 256, (3, 32, 32), generator=generator, dtype=torch.uint8)
        image = (pixels.float() / 255.0 - 0.5) / 0.25
        return image, index % 10


def make_loader(variant, args):
    dataset = DecodedImages(args.batch_size * (args.batches + 1))
    common = dict(batch_size=args.batch_size, num_workers=args.workers, drop_last=True)
    if variant == "torch":
        return torch.utils.data.DataLoader(dataset, persistent_workers=True, **common)
    opts = poptorch.Options()
    if variant == "sync":
        return poptorch.DataLoader(opts, dataset, **common)
    if variant == "async_own_forkserver":
        return poptorch.DataLoader(opts, dataset, mode=poptorch.DataLoaderMode.Async,
                                   multiprocessing_context="forkserver", **common)
    return poptorch.DataLoader(opts, dataset, mode=poptorch.DataLoaderMode.Async, **common)


def measure(variant, args):
    start = time.perf_counter()
    loader = make_loader(variant, args)
    iterator = iter(loader)
    next(iterator)
    first_batch = time.perf_counter() - start
    start = time.perf_counter()
    rest = sum(1 for _ in iterator)
    samples_per_s = rest * args.batch_size / (time.perf_counter() - start)
    start = time.perf_counter()
    next(iter(loader))
    next_epoch = time.perf_counter() - start
    if hasattr(loader, "terminate"):
        loader.terminate()
    else:
        del loader  # torch's persistent workers stop with their iterator
    return {"first_batch_s": first_batch, "next_epoch_first_batch_s": next_epoch, "samples_per_s": samples_per_s}


LABELS = {
    "torch": "torch DataLoader",
    "sync": "openpop Sync",
    "async": "openpop Async",
    "async_first_in_process": "openpop Async, first of process",
    "async_own_forkserver": "async, workers via own fork server",
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--batches", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)

    rounds = {name: [] for name in LABELS}
    rounds["async_first_in_process"].append(measure("async", args))  # starts the fork server
    for _ in range(args.rounds):
        for variant in ("torch", "sync", "async", "async_own_forkserver"):
            rounds[variant].append(measure(variant, args))

    best = {name: {"first_batch_s": min(r["first_batch_s"] for r in runs),
                   "next_epoch_first_batch_s": min(r["next_epoch_first_batch_s"] for r in runs),
                   "samples_per_s": max(r["samples_per_s"] for r in runs)}
            for name, runs in rounds.items()}
    base = best["torch"]
    print(f"{args.workers} workers, batch {args.batch_size}, {args.batches} batches per epoch, "
          f"best of {args.rounds} rounds")
    print(f"{'loader':<38}{'first batch':>12}{'vs torch':>9}{'next epoch':>12}{'samples/s':>11}{'vs torch':>9}")
    for name, label in LABELS.items():
        row = best[name]
        print(f"{label:<38}{row['first_batch_s'] * 1e3:>10.0f}ms{row['first_batch_s'] / base['first_batch_s']:>8.2f}x"
              f"{row['next_epoch_first_batch_s'] * 1e3:>10.1f}ms{row['samples_per_s']:>11.0f}"
              f"{row['samples_per_s'] / base['samples_per_s']:>8.2f}x")
    print(json.dumps({
        "benchmark": "loader_startup",
        "first_batch_s": {name: row["first_batch_s"] for name, row in best.items()},
        "next_epoch_first_batch_s": {name: row["next_epoch_first_batch_s"] for name, row in best.items()},
        "samples_per_s": {name: row["samples_per_s"] for name, row in best.items()},
        "first_batch_vs_torch": {name: row["first_batch_s"] / base["first_batch_s"] for name, row in best.items()},
        "samples_per_s_vs_torch": {name: row["samples_per_s"] / base["samples_per_s"] for name, row in best.items()},
        "async_first_batch_median_s": statistics.median(r["first_batch_s"] for r in rounds["async"]),
        "previous_vs_now_first_batch": best["async_own_forkserver"]["first_batch_s"] / best["async"]["first_batch_s"],
        "config": {"workers": args.workers, "batch_size": args.batch_size, "batches": args.batches,
                   "rounds": args.rounds},
    }))


if __name__ == "__main__":
    main()
