"""Activation memory of a pipelined training host call, eager vs the compiled backend, as the
gradient accumulation grows: 4 blocks of Linear(1024) + tanh on 4 virtual IPUs of one CPU,
micro-batch 2048 (one activation tensor: 8 MiB), ``PipelinedExecution`` with PopTorch's
recomputation on (eager) - the compiled program does not recompute (docs/guides/compiled-backend.md).

Each variant runs in a process of its own with glibc's ``MALLOC_MMAP_THRESHOLD_`` at 64 KiB, so
that freed tensors leave the resident set; the number is the resident-set peak of the second
host call (``VmHWM`` reset just before it) above the resident set when it starts. Each process
has an Inductor cache of its own (a fresh directory), so the first call's wall seconds are a
first compile; ``CPU s`` is the CPU time of the variant's whole process tree (Inductor builds its
C++ kernels in worker processes; it includes starting Python and torch and the second call). An
accumulation below 7 (a 4-stage pipeline needs at least 7) runs ``ShardedExecution``: the
compiled program is the same, eager runs the blocks one after another.

    python benchmarks/pipeline_memory.py [--accumulations 8 16]
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import torch
from _models import FourBlocks

import poptorch

WIDTH, MICRO_BATCH = 1024, 2048


def _status(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) // 1024 for line in status if line.startswith(field))


def measure(backend, accumulation):
    """MiB above the call's starting resident set at the peak of one host call; the first
    call's wall and CPU seconds."""
    torch.set_num_threads(1)
    model = FourBlocks(WIDTH, summed=True)
    opts = poptorch.Options().outputMode(poptorch.OutputMode.Final).openpopBackend(backend)
    opts.Training.gradientAccumulation(accumulation)
    opts.setExecutionStrategy(poptorch.PipelinedExecution() if accumulation >= 7 else poptorch.ShardedExecution())
    opts.showCompilationProgressBar(False)
    pop = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.01))
    x, t = torch.randn(accumulation * MICRO_BATCH, WIDTH), torch.randn(accumulation * MICRO_BATCH, WIDTH)
    wall, cpu = time.perf_counter(), time.process_time()
    pop(x, t)  # compiles
    first_call = (time.perf_counter() - wall, time.process_time() - cpu)
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # resets VmHWM
    start = _status("VmRSS")
    pop(x, t)
    assert pop._dispatch.compiled.last == backend
    return _status("VmHWM") - start, first_call


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--accumulations", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--child", nargs=2, metavar=("BACKEND", "GA"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        peak, (wall, cpu) = measure(args.child[0], int(args.child[1]))
        print(peak, wall, cpu)
        return
    peaks, first_calls = {}, {}
    for accumulation in args.accumulations:
        for backend in ("eager", "compiled"):
            with tempfile.TemporaryDirectory(prefix="pipeline-memory-inductor-") as cache:
                env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", TORCHINDUCTOR_CACHE_DIR=cache)
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                done = subprocess.run([sys.executable, __file__, "--child", backend, str(accumulation)], env=env,
                                      capture_output=True, text=True, check=True)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            peak, wall = done.stdout.split()[-3:-1]
            peaks[f"{backend}_ga{accumulation}"] = int(peak)
            first_calls[f"{backend}_ga{accumulation}"] = {"wall_s": float(wall), "cpu_s": float(cpu)}
    print(f"{'variant':<16}{'peak MiB':>10}{'vs eager':>10}{'first call s':>14}{'(CPU s)':>9}")
    for accumulation in args.accumulations:
        for backend in ("eager", "compiled"):
            name = f"{backend}_ga{accumulation}"
            print(f"{name:<16}{peaks[name]:>10}{peaks[name] / peaks[f'eager_ga{accumulation}']:>9.2f}x"
                  f"{first_calls[name]['wall_s']:>14.1f}{first_calls[name]['cpu_s']:>9.1f}")
    print(json.dumps({"benchmark": "pipeline_memory", "activation_mib_per_micro_batch_tensor": 8,
                      "peak_mib": peaks, "first_call_seconds": first_calls}))


if __name__ == "__main__":
    main()
