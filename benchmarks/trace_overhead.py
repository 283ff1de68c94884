"""What tracing costs: openpop's spans when tracing is off, and a traced window when it is on.

    python benchmarks/trace_overhead.py [--steps 1024]

* off: a tiny MLP (the worst case: host overhead dominates) trained with tracing off, against
  the same run with the executor's ``host_call`` decorator bypassed; plus the cost of one
  ``trace.span()`` call when off, times the spans per step, relative to a step.
  The data loader's ``WaitSpans`` wrapper when off: its cost per ``next()`` (one per host call).
* on: a 4-stage pipelined model, host calls inside a ``TraceSession`` window (torch.profiler on
  all threads, stage spans, activation-memory hooks) against calls outside it (same process).

Prints a table and one JSON line.
"""
import argparse
import copy
import json
import tempfile
import time
import timeit

import torch
from _models import MLP, FourBlocks

import poptorch
from openpop.runtime import eager as eager_module
from openpop.runtime import trace


def mlp_seconds_per_step(base, xs, ys, steps, micro, di, bypass):
    opts = poptorch.Options().deviceIterations(di)
    opts.showCompilationProgressBar(False)
    model = copy.deepcopy(base)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.01))
    per_call = micro * di
    training.compile(xs[:per_call], ys[:per_call])
    decorated = eager_module._steps  # the eager backend's host call, decorated by trace.host_call
    if bypass:
        eager_module._steps = decorated.__wrapped__
    try:
        start = time.perf_counter()
        for i in range(steps // di):
            training(xs[i * per_call:(i + 1) * per_call], ys[i * per_call:(i + 1) * per_call])
        seconds = (time.perf_counter() - start) / steps
    finally:
        eager_module._steps = decorated
    training.destroy()
    return seconds


def pipelined_call_seconds(calls, traced_calls, directory):
    torch.manual_seed(0)
    opts = poptorch.Options().deviceIterations(4)
    opts.Training.gradientAccumulation(8)
    opts.setExecutionStrategy(poptorch.PipelinedExecution())
    opts.showCompilationProgressBar(False)
    model = FourBlocks(256)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.01))
    x, y = torch.randn(4 * 8 * 16, 256), torch.randn(4 * 8 * 16, 256)
    training(x, y)  # compile
    times = {True: [], False: []}
    with trace.TraceSession(directory, calls=traced_calls):
        for index in range(calls):
            start = time.perf_counter()
            training(x, y)
            times[index + 1 in traced_calls].append(time.perf_counter() - start)
    training.destroy()
    return min(times[False]), min(times[True])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    micro, di = 32, 16
    base = MLP()
    xs, ys = torch.randn(args.steps * micro, 32), torch.randn(args.steps * micro, 1)
    results = {"off": [], "bypassed": []}
    for _ in range(args.repeats):  # interleaved, best of N
        results["off"].append(mlp_seconds_per_step(base, xs, ys, args.steps, micro, di, bypass=False))
        results["bypassed"].append(mlp_seconds_per_step(base, xs, ys, args.steps, micro, di, bypass=True))
    off, bypassed = min(results["off"]), min(results["bypassed"])
    span_seconds = min(timeit.repeat(lambda: trace.span("forward").__enter__(), number=100_000, repeat=5)) / 100_000
    spans_per_step = 5  # forward, backward, gradient_reduction, optimizer_step (+ output collection per call)
    span_share = spans_per_step * span_seconds / off
    # poptorch.DataLoader's iterator: one WaitSpans.__next__ per host call (di steps).
    plain = min(timeit.repeat("next(it)", setup="it = iter(range(10**8))", number=100_000, repeat=5)) / 100_000
    wrapped = min(timeit.repeat("next(it)", setup="it = WaitSpans(iter(range(10**8)))", number=100_000, repeat=5,
                                globals={"WaitSpans": trace.WaitSpans})) / 100_000
    loader_share = (wrapped - plain) / (di * off)
    with tempfile.TemporaryDirectory() as directory:
        untraced, traced = pipelined_call_seconds(8, range(3, 5), directory)
    print(f"{'measurement':<44}{'value':>14}")
    print(f"{'MLP step, tracing off (us)':<44}{off * 1e6:>14.1f}")
    print(f"{'MLP step, decorator bypassed (us)':<44}{bypassed * 1e6:>14.1f}")
    print(f"{'off vs bypassed':<44}{off / bypassed:>13.3f}x")
    print(f"{'one span() call when off (ns)':<44}{span_seconds * 1e9:>14.1f}")
    print(f"{'spans per MLP step / step time':<44}{span_share:>13.4%}")
    print(f"{'loader next() wrapper when off (ns)':<44}{(wrapped - plain) * 1e9:>14.1f}")
    print(f"{'loader wrapper per MLP step / step time':<44}{loader_share:>13.4%}")
    print(f"{'4-stage host call, untraced (ms)':<44}{untraced * 1e3:>14.2f}")
    print(f"{'4-stage host call, traced window (ms)':<44}{traced * 1e3:>14.2f}")
    print(f"{'traced vs untraced':<44}{traced / untraced:>13.3f}x")
    print(json.dumps({"benchmark": "trace_overhead", "mlp_us_per_step_off": off * 1e6,
                      "mlp_us_per_step_bypassed": bypassed * 1e6, "off_vs_bypassed": off / bypassed,
                      "span_off_ns": span_seconds * 1e9, "span_share_of_step": span_share,
                      "loader_wrapper_off_ns": (wrapped - plain) * 1e9, "loader_wrapper_share_of_step": loader_share,
                      "pipelined_call_ms_untraced": untraced * 1e3, "pipelined_call_ms_traced": traced * 1e3,
                      "traced_vs_untraced": traced / untraced}))


if __name__ == "__main__":
    main()
