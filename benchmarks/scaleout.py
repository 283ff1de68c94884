"""Scale-out under poprun: weak-scaling efficiency of N instances vs 1, and the share of a step
spent in the cross-process gradient all-reduce.

* CPU (always): ``poprun --num-instances 1`` and ``--num-instances 2``, one thread per instance,
  the same per-instance batch (weak scaling), on an MLP of 4.2 M parameters (16.8 MB of fp32
  gradients per step) with a small batch, so that the all-reduce matters. Efficiency = time of
  a step on 1 instance / time of a step on 2 (1.0 is perfect). The 2-instance run is measured
  with the all-reduce overlapped with the backward pass (the default) and without
  (``OPENPOP_ALLREDUCE_OVERLAP=0``): without, the time inside ``GlobalReplication.all_reduce``
  is the whole communication, reported as a share of the step; with, it is the part the
  backward did not hide (exposed communication). Buckets of 4 MB (``OPENPOP_ALLREDUCE_BUCKET_MB``),
  one per layer, so that there is something to overlap.
* CPU, compiled: the 2-instance run again on the compiled backend (``openpopBackend("compiled")``,
  unit ``--compiled-unit``, default ``auto``: the program for this model), printed next to the eager
  rows with the unit that ran. In a program the all-reduce is part of the compiled step, so its
  time is not measured apart ("-"); in regions it is eager's and is.
* GPUs (two or more): the same with one instance per GPU (NCCL); skipped without CUDA.

Runs are interleaved and the best of ``--repeats`` is kept (the machine may be shared).

    python benchmarks/scaleout.py [--steps 20] [--repeats 2] [--compiled-unit auto|program|regions]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")


def worker(out: str, steps: int, width: int, micro: int, backend: str = "eager", unit: str = "auto") -> None:
    """One poprun instance: train, time the steps and the all-reduce, write the numbers."""
    import torch

    import popdist
    import popdist.poptorch
    import poptorch
    from openpop.runtime import distributed_reduce

    spent = [0.0]
    original = distributed_reduce.GlobalReplication.all_reduce

    def timed(self, params):
        started = time.perf_counter()
        try:
            return original(self, params)
        finally:
            spent[0] += time.perf_counter() - started

    distributed_reduce.GlobalReplication.all_reduce = timed
    popdist.init()
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(*layers)

        def forward(self, x, y):
            out = self.body(x)
            return out, torch.nn.functional.mse_loss(out, y)

    model = MLP()
    opts = popdist.poptorch.Options().showCompilationProgressBar(False).openpopBackend(backend, unit=unit)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9))
    x, y = torch.randn(micro, width), torch.randn(micro, width)
    for _ in range(3):
        training(x, y)  # compile, warm-up
    spent[0] = 0.0
    started = time.perf_counter()
    for _ in range(steps):
        training(x, y)
    elapsed = time.perf_counter() - started
    compiled = training._dispatch.compiled
    ran = compiled.last if backend == "eager" or compiled.last == "eager" else f"compiled {compiled.selection.unit}"
    with open(f"{out}.{popdist.getInstanceIndex()}", "w") as stream:
        json.dump({"step_seconds": elapsed / steps, "allreduce_seconds": spent[0] / steps, "ran": ran,
                   "params": sum(p.numel() for p in model.parameters()), "threads": torch.get_num_threads()}, stream)


def launch(instances: int, args, gpu: bool = False, overlap: bool = True, backend: str = "eager") -> dict:
    with tempfile.TemporaryDirectory() as directory:
        out = os.path.join(directory, "result")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH", "")) if p)
        env["OPENPOP_ALLREDUCE_OVERLAP"] = "1" if overlap else "0"
        env.setdefault("OPENPOP_ALLREDUCE_BUCKET_MB", "4")
        if not gpu:
            env["OMP_NUM_THREADS"] = "1"
            env["CUDA_VISIBLE_DEVICES"] = ""
        command = [sys.executable, "-m", "openpop.distributed.poprun", "--num-instances", str(instances),
                   "--num-replicas", str(instances), sys.executable, os.path.abspath(__file__), "--worker", out,
                   "--steps", str(args.steps), "--width", str(args.width), "--micro-batch", str(args.micro_batch),
                   "--backend", backend, "--compiled-unit", args.compiled_unit]
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"poprun failed ({done.returncode}):\n{done.stderr}")
        results = []
        for rank in range(instances):
            with open(f"{out}.{rank}") as stream:
                results.append(json.load(stream))
    # The job runs at the pace of its slowest instance.
    ran = sorted({r["ran"] for r in results})
    if backend == "compiled" and (len(ran) != 1 or not ran[0].startswith("compiled")):
        raise SystemExit(f"the compiled run ran {ran} in its instances, not one compiled unit")
    return {"step_seconds": max(r["step_seconds"] for r in results),
            "allreduce_seconds": max(r["allreduce_seconds"] for r in results), "ran": ran[0],
            "params": results[0]["params"], "threads": results[0]["threads"]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--backend", default="eager", help=argparse.SUPPRESS)  # (a worker's)
    parser.add_argument("--compiled-unit", default="auto", choices=("auto", "program", "regions"))
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.steps, args.width, args.micro_batch, args.backend, args.compiled_unit)
        return
    best = {}
    variants = {"1 instance": dict(instances=1), "2 instances": dict(instances=2),
                "2, no overlap": dict(instances=2, overlap=False), "2, compiled": dict(instances=2, backend="compiled")}
    for _ in range(args.repeats):
        for name, kw in variants.items():
            run = launch(args=args, **kw)
            if name not in best or run["step_seconds"] < best[name]["step_seconds"]:
                best[name] = run
    one, two, plain, compiled = best["1 instance"], best["2 instances"], best["2, no overlap"], best["2, compiled"]
    efficiency = one["step_seconds"] / two["step_seconds"]
    share = plain["allreduce_seconds"] / plain["step_seconds"]
    exposed = two["allreduce_seconds"] / two["step_seconds"]
    print(f"MLP {one['params'] / 1e6:.1f} M parameters, micro-batch {args.micro_batch}, one thread per instance")
    print(f"{'run':<16}{'step ms':>10}{'in all_reduce() ms':>20}  backend")
    for name, run in best.items():
        inside = run["ran"] == "compiled program"  # (the all-reduce is part of the compiled step)
        reduce_ms = "-" if inside else f"{run['allreduce_seconds'] * 1e3:.1f}"
        print(f"{name:<16}{run['step_seconds'] * 1e3:>10.1f}{reduce_ms:>20}  {run['ran']}")
    print(f"compiled vs eager, 2 instances: {two['step_seconds'] / compiled['step_seconds']:.2f}x eager's speed "
          f"({compiled['ran']})")
    print(f"weak-scaling efficiency, 2 instances vs 1 (CPU, gloo): {efficiency:.2f} "
          f"(without overlap {one['step_seconds'] / plain['step_seconds']:.2f})")
    print(f"communication share of a 2-instance step: {share:.1%} without overlap, {exposed:.1%} exposed with it")
    result = {"benchmark": "scaleout", "cpu_weak_scaling_efficiency_2_vs_1": efficiency,
              "cpu_weak_scaling_efficiency_2_vs_1_no_overlap": one["step_seconds"] / plain["step_seconds"],
              "cpu_allreduce_share_of_step": share, "cpu_exposed_allreduce_share_of_step": exposed,
              "cpu_step_ms": {name: run["step_seconds"] * 1e3 for name, run in best.items()},
              "cpu_compiled_unit": compiled["ran"],
              "cpu_compiled_speedup_2_instances": two["step_seconds"] / compiled["step_seconds"]}
    import torch
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus >= 2:
        gpu_one, gpu_n = launch(1, args, gpu=True), launch(gpus, args, gpu=True)
        result["gpu_weak_scaling_efficiency_n_vs_1"] = gpu_one["step_seconds"] / gpu_n["step_seconds"]
        result["gpus"] = gpus
        print(f"weak-scaling efficiency, {gpus} GPUs vs 1 (NCCL): {result['gpu_weak_scaling_efficiency_n_vs_1']:.2f}")
    else:
        print("GPUs: skipped (fewer than two CUDA devices)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
