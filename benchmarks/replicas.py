"""Local replicas on their own devices: what the per-replica weight copies cost, and what they buy.

* CPU (always): ``replicationFactor(2)`` with both replicas on the CPU runs on one weight set.
  The per-replica copy path (gradient sum onto replica 0, broadcast after each step) is forced
  on the same model and data, so the ratio is the copy path's cost on one device; no speed-up
  is possible here, both replicas share the same two cores. Most of that cost is the cache
  holding two weight sets instead of one (the gradient sum and broadcast are ~2 ms of a ~30 ms
  call here); on GPUs each replica's weights live on its own device.
* GPUs (two or more): the same global batch on 1 GPU (``replicationFactor(1)``, the replicas'
  micro-batches accumulated instead) and on N GPUs (``replicationFactor(N)``, one replica each);
  the ratio is the data-parallel speed-up.

    python benchmarks/replicas.py [--steps 30]
"""
import argparse
import copy
import json
import time

import torch
import torch.nn.functional as F

import poptorch
from openpop.runtime.devices import DeviceMap


class MLP(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.layers = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU())
                                            for _ in range(4)))

    def forward(self, x, y):
        out = self.layers(x)
        return out, F.mse_loss(out, y)


def run(base, replicas, ga, steps, micro, width, device_map=None, force_copies=False):
    model = copy.deepcopy(base)
    opts = poptorch.Options().replicationFactor(replicas).showCompilationProgressBar(False)
    opts.Training.gradientAccumulation(ga)
    if device_map:
        opts.deviceMap(device_map)
    shares = DeviceMap.replicas_share_devices
    if force_copies:
        DeviceMap.replicas_share_devices = lambda self: False
    try:
        training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=1e-3))
        rows = replicas * ga * micro
        x, y = torch.randn(rows, width), torch.randn(rows, width)
        training(x, y)  # compile + warm-up
        assert training._session.replicas.own_weights == (force_copies or bool(device_map and replicas > 1))
    finally:
        DeviceMap.replicas_share_devices = shares
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        training(x, y)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    training.destroy()
    return steps * rows / elapsed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--gradient-accumulation", type=int, default=4)
    parser.add_argument("--micro-batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    base = MLP(args.width)
    common = dict(steps=args.steps, micro=args.micro_batch, width=args.width)
    ga = args.gradient_accumulation
    variants = {
        "cpu_shared_replicas": dict(replicas=2, ga=ga),
        "cpu_replica_copies": dict(replicas=2, ga=ga, force_copies=True),
    }
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus >= 2:
        variants["gpu_1_device"] = dict(replicas=1, ga=ga * gpus, device_map=["cuda:0"])
        variants["gpu_n_devices"] = dict(replicas=gpus, ga=ga, device_map=[f"cuda:{i}" for i in range(gpus)])
    best = dict.fromkeys(variants, 0.0)
    for _ in range(args.repeats):  # interleaved, best of N
        for name, kw in variants.items():
            best[name] = max(best[name], run(base, **kw, **common))
    print(f"{'variant':<24}{'samples/s':>12}")
    for name, rate in best.items():
        print(f"{name:<24}{rate:>12.0f}")
    result = {"benchmark": "replicas", "samples_per_s": best,
              "copies_time_vs_shared": best["cpu_shared_replicas"] / best["cpu_replica_copies"]}
    print(f"replica copies on the CPU: {result['copies_time_vs_shared']:.3f}x the time of shared replicas")
    if gpus >= 2:
        result["gpu_speedup_n_vs_1"] = best["gpu_n_devices"] / best["gpu_1_device"]
        print(f"{gpus} GPUs vs 1: {result['gpu_speedup_n_vs_1']:.2f}x samples/s")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
