"""Host overhead per training step: a tiny MLP trained by a hand-written eager loop vs openpop
with device_iterations 1, 16 and 256, measured side by side in this run. The ``no rollback``
rows run the same with ``Training.rollbackFailedCalls(False)``: their ratio to the default rows
is what making a failed host call roll back costs (``runtime/transaction.py``).

    python benchmarks/host_overhead.py [--steps 2048] [--clock cpu]

``--clock cpu`` times with this process's CPU time instead of wall time: on a machine shared with
other jobs (one torch thread here) it counts the work done, not the time spent waiting for a core.
Prints a table of microseconds per optimizer step and ratios to the eager loop, then one JSON line.
"""
import argparse
import copy
import json
import time

import torch

import poptorch


class MLP(torch.nn.Module):
    def __init__(self, width=32):
        super().__init__()
        self.fc1 = torch.nn.Linear(width, width)
        self.fc2 = torch.nn.Linear(width, 1)

    def forward(self, x, y):
        out = self.fc2(torch.relu(self.fc1(x)))
        return out, torch.nn.functional.mse_loss(out, y)


CLOCK = time.perf_counter


def eager_loop(model, xs, ys, steps, micro):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start = CLOCK()
    for i in range(steps):
        x, y = xs[i * micro:(i + 1) * micro], ys[i * micro:(i + 1) * micro]
        optimizer.zero_grad(set_to_none=True)
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
    return (CLOCK() - start) / steps


def openpop_loop(model, xs, ys, steps, micro, device_iterations, rollback=True):
    opts = poptorch.Options().deviceIterations(device_iterations)
    opts.showCompilationProgressBar(False)
    opts.Training.rollbackFailedCalls(rollback)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.01))
    per_call = micro * device_iterations
    training.compile(xs[:per_call], ys[:per_call])
    calls = steps // device_iterations
    start = CLOCK()
    for i in range(calls):
        training(xs[i * per_call:(i + 1) * per_call], ys[i * per_call:(i + 1) * per_call])
    return (CLOCK() - start) / (calls * device_iterations)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2048)
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = parser.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(1)
    torch.manual_seed(0)
    base = MLP()
    xs = torch.randn(args.steps * args.micro_batch, 32)
    ys = torch.randn(args.steps * args.micro_batch, 1)

    variants = {"di1": (1, True), "di1_no_rollback": (1, False), "di16": (16, True),
                "di16_no_rollback": (16, False), "di256": (256, True)}
    results = {"eager": [], **{name: [] for name in variants}}
    for _ in range(args.repeats):  # interleaved, best of N, so machine load hits all alike
        results["eager"].append(eager_loop(copy.deepcopy(base), xs, ys, args.steps, args.micro_batch))
        for name, (di, rollback) in variants.items():
            results[name].append(openpop_loop(copy.deepcopy(base), xs, ys, args.steps, args.micro_batch, di,
                                              rollback))
    best = {k: min(v) * 1e6 for k, v in results.items()}
    print(f"{'variant':<28}{'us/step':>10}{'vs eager':>10}")
    for key, label in (("eager", "eager PyTorch loop"), ("di1", "openpop DI=1"),
                       ("di1_no_rollback", "openpop DI=1 no rollback"), ("di16", "openpop DI=16"),
                       ("di16_no_rollback", "openpop DI=16 no rollback"), ("di256", "openpop DI=256")):
        print(f"{label:<28}{best[key]:>10.1f}{best[key] / best['eager']:>9.2f}x")
    rollback_cost = {f"di{di}": best[f"di{di}"] / best[f"di{di}_no_rollback"] for di in (1, 16)}
    print("rollback cost (time with / without): " + ", ".join(f"{k} {v:.3f}x" for k, v in rollback_cost.items()))
    print(json.dumps({"benchmark": "host_overhead", "clock": args.clock, "us_per_step": best,
                      "ratio_vs_eager": {k: best[k] / best["eager"] for k in best},
                      "rollback_cost": rollback_cost}))


if __name__ == "__main__":
    main()
