"""Pipelined execution overhead: a 4-block MLP trained with plain gradient accumulation vs
``PipelinedExecution`` over 4 virtual IPUs (recomputation off: the schedule's own cost; and on:
PopTorch's default, which re-runs each block's forward in backward), side by side in this run.
``pipelined_concurrent`` runs the several-device schedule (micro-batches on threads,
``OPENPOP_CONCURRENT_STAGES=on``) on the CPU: its ratio to ``pipelined_no_recompute`` is the
price of the threads and of summing gradients in micro-batch order. With CUDA GPUs present it
also compares 1 device with N devices.

    python benchmarks/pipeline.py [--steps 40]
"""
import argparse
import copy
import json
import os
import time

import torch
import torch.nn.functional as F

import poptorch


class FourBlockMLP(torch.nn.Module):
    def __init__(self, width, annotate):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU()) for _ in range(4))
        if annotate:
            for i, block in enumerate(self.blocks):
                poptorch.BeginBlock(block, ipu_id=i)

    def forward(self, x, y):
        for block in self.blocks:
            x = block(x)
        return x, F.mse_loss(x, y)


def run(base, annotate, recompute, steps, ga, micro, width, device_map=None, concurrent=None):
    if concurrent is not None:
        previous = os.environ.get("OPENPOP_CONCURRENT_STAGES")
        os.environ["OPENPOP_CONCURRENT_STAGES"] = "on" if concurrent else "off"
        try:
            return run(base, annotate, recompute, steps, ga, micro, width, device_map)
        finally:
            if previous is None:
                del os.environ["OPENPOP_CONCURRENT_STAGES"]
            else:
                os.environ["OPENPOP_CONCURRENT_STAGES"] = previous
    model = FourBlockMLP(width, annotate)
    model.load_state_dict(base.state_dict())
    opts = poptorch.Options().deviceIterations(1).showCompilationProgressBar(False)
    opts.Training.gradientAccumulation(ga)
    if not recompute:
        opts._Popart.set("autoRecomputation", 0)
    if device_map:
        opts.deviceMap(device_map)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=1e-3))
    x, y = torch.randn(ga * micro, width), torch.randn(ga * micro, width)
    training(x, y)  # compile + warm-up
    start = time.perf_counter()
    for _ in range(steps):
        training(x, y)
    elapsed = time.perf_counter() - start
    training.destroy()
    return steps * ga * micro / elapsed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--gradient-accumulation", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    base = FourBlockMLP(args.width, annotate=False)
    common = dict(steps=args.steps, ga=args.gradient_accumulation, micro=args.micro_batch, width=args.width)
    variants = {
        "plain_accumulation": dict(annotate=False, recompute=False),
        "pipelined_no_recompute": dict(annotate=True, recompute=False, concurrent=False),
        "pipelined_recompute": dict(annotate=True, recompute=True),
        "pipelined_concurrent": dict(annotate=True, recompute=False, concurrent=True),
    }
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus >= 2:
        variants["gpu_1_device"] = dict(annotate=True, recompute=False, device_map=["cuda:0"])
        variants["gpu_n_devices"] = dict(annotate=True, recompute=False,
                                         device_map=[f"cuda:{i}" for i in range(min(gpus, 4))])
    best = dict.fromkeys(variants, 0.0)
    for _ in range(args.repeats):  # interleaved, best of N
        for name, kw in variants.items():
            best[name] = max(best[name], run(copy.deepcopy(base), **kw, **common))
    plain = best["plain_accumulation"]
    print(f"{'variant':<26}{'samples/s':>12}{'time vs plain':>15}")
    for name, rate in best.items():
        print(f"{name:<26}{rate:>12.0f}{plain / rate:>14.3f}x")
    result = {"benchmark": "pipeline", "samples_per_s": best,
              "overhead_vs_plain": {name: plain / rate for name, rate in best.items()}}
    result["concurrent_vs_serial_time"] = best["pipelined_no_recompute"] / best["pipelined_concurrent"]
    if gpus >= 2:
        result["gpu_speedup_n_vs_1"] = best["gpu_n_devices"] / best["gpu_1_device"]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
