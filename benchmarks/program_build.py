"""How long a compiled program takes to build once its graphs are cached (Inductor's FX-graph cache
warm): what every new program pays - a new model of the same shapes, another output mode, a
re-trace - and what a suite of tests pays per compiled test.

A stack of ``Linear`` layers (width 64) trained with Adam, ``deviceIterations(3)``,
``gradientAccumulation(2)``, ``replicationFactor(2)``: one program holding two nested ``while_loop``s
(steps, micro-batches). Each build is the first host call of a fresh ``trainingModel`` after
``torch.compiler.reset()`` (Dynamo traces from nothing; Inductor loads its cached code), minus a
second call's time. Side by side: the same with ``OPENPOP_DISABLE_PASSES=flat_operands`` (Dynamo's
own pytree for the loops' operands), and the peer - a PyTorch user's training step (forward,
backward, ``Adam.step()``) under ``torch.compile``, built the same way, which covers one step where
openpop's program covers 12 micro-batches and 3 optimizer steps.

    python benchmarks/program_build.py [--layers 1 8 24] [--repeats 2]

Prints seconds per build (best of ``repeats``, after one build that warms the caches), the ratios,
then one JSON line.
"""
import argparse
import json
import os
import sys
import time

import torch

import poptorch
from openpop.runtime.compiled import passes

from _machine import cpu_name

WIDTH = 64
DI, GA, R, MICRO = 3, 2, 2, 4


class Stack(torch.nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers))

    def forward(self, x, target=None):
        for layer in self.layers:
            x = torch.relu(layer(x))
        if target is None:
            return x
        return x, torch.nn.functional.mse_loss(x, target)


def build_seconds(run, *args):
    """The first call of ``run(*args)`` after ``torch.compiler.reset()`` less a second call's time."""
    torch.compiler.reset()
    start = time.perf_counter()
    run(*args)
    first = time.perf_counter() - start
    start = time.perf_counter()
    run(*args)
    return first - (time.perf_counter() - start)


def openpop_build(layers, disabled):
    os.environ[passes.DISABLE_ENV] = disabled
    model = Stack(layers)
    options = poptorch.Options().deviceIterations(DI).replicationFactor(R).openpopBackend("compiled")
    options.Training.gradientAccumulation(GA)
    options.showCompilationProgressBar(False).enableExecutableCaching(None)
    training = poptorch.trainingModel(model, options, poptorch.optim.Adam(model.parameters(), lr=1e-3))
    rows = DI * GA * R * MICRO
    return build_seconds(training, torch.randn(rows, WIDTH), torch.randn(rows, WIDTH))


def hand_build(layers):
    model = Stack(layers)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, t = torch.randn(MICRO, WIDTH), torch.randn(MICRO, WIDTH)

    @torch.compile(fullgraph=False)
    def step(x, t):
        loss = torch.nn.functional.mse_loss(model(x), t)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return build_seconds(step, x, t)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 8, 24])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    os.environ["OPENPOP_EXECUTABLE_CACHE"] = "0"
    kinds = {"openpop": lambda n: openpop_build(n, ""),
             "openpop_pytree": lambda n: openpop_build(n, "flat_operands"),
             "hand_compiled_step": hand_build}
    rows = {}
    print(f"{cpu_name()}, torch {torch.__version__}, one thread; seconds per build, warm caches, best of "
          f"{args.repeats}")
    print(f"{'layers':>6} {'openpop':>8} {'no flat_operands':>17} {'hand step':>10} {'pass gain':>10} "
          f"{'vs hand':>8}")
    for layers in args.layers:
        for build in kinds.values():  # warm the caches (Inductor's cold compile is not measured)
            build(layers)
        best = {name: float("inf") for name in kinds}
        for _ in range(args.repeats):  # interleaved: the machine's load moves all three alike
            for name, build in kinds.items():
                best[name] = min(best[name], build(layers))
        row = {**{name: round(value, 3) for name, value in best.items()},
               "pass_gain": round(best["openpop_pytree"] / best["openpop"], 3),
               "vs_hand_compiled_step": round(best["openpop"] / best["hand_compiled_step"], 3)}
        rows[layers] = row
        print(f"{layers:>6} {row['openpop']:>8.2f} {row['openpop_pytree']:>17.2f} {row['hand_compiled_step']:>10.2f} "
              f"{row['pass_gain']:>9.2f}x {row['vs_hand_compiled_step']:>7.2f}x", flush=True)
    print(json.dumps({"benchmark": "program_build", "cpu": cpu_name(), "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
