"""What carrying BatchNorm statistics and drawing dropout masks from torch's generator (aten's
random ops, Inductor's ``fallback_random``) costs the compiled backend: a tiny MLP with
BatchNorm and dropout trained by a hand-written eager loop, by openpop eager and compiled at
``deviceIterations(16)``, and the same MLP without BatchNorm and dropout compiled, side by side
in this run (programs built before the timing; interleaved, best of N).

    python benchmarks/compiled_state.py [--steps 1024] [--clock cpu]

Prints microseconds per optimizer step and ratios, then one JSON line.
"""
import argparse
import copy
import json

import torch

from host_overhead import add_timing_args, eager_loop, openpop_loop, use_timing_args


class StatefulMLP(torch.nn.Module):
    def __init__(self, width=32, stateful=True):
        super().__init__()
        self.fc1 = torch.nn.Linear(width, width)
        self.norm = torch.nn.BatchNorm1d(width) if stateful else torch.nn.Identity()
        self.drop = torch.nn.Dropout(0.1) if stateful else torch.nn.Identity()
        self.fc2 = torch.nn.Linear(width, 1)

    def forward(self, x, y):
        out = self.fc2(self.drop(torch.relu(self.norm(self.fc1(x)))))
        return out, torch.nn.functional.mse_loss(out, y)


ROWS = (("eager", "eager PyTorch loop"), ("openpop_eager", "openpop eager DI=16"),
        ("compiled", "openpop compiled DI=16"), ("compiled_plain", "compiled DI=16, no BN/dropout"))


def main():
    parser = argparse.ArgumentParser()
    add_timing_args(parser, steps=1024)
    args = parser.parse_args()
    use_timing_args(args)
    torch.manual_seed(0)
    model, plain = StatefulMLP(), StatefulMLP(stateful=False)
    xs = torch.randn(args.steps * args.micro_batch, 32)
    ys = torch.randn(args.steps * args.micro_batch, 1)
    timers, compile_seconds = {}, {}
    for name, base, backend in (("openpop_eager", model, "eager"), ("compiled", model, "compiled"),
                                ("compiled_plain", plain, "compiled")):
        timers[name], seconds = openpop_loop(copy.deepcopy(base), xs, ys, args.steps, args.micro_batch, 16,
                                             backend=backend)
        if backend == "compiled":
            compile_seconds[name] = seconds
    results = {"eager": [], **{name: [] for name in timers}}
    for _ in range(args.repeats):  # interleaved, best of N, so machine load hits all alike
        results["eager"].append(eager_loop(copy.deepcopy(model), xs, ys, args.steps, args.micro_batch))
        for name, timed in timers.items():
            results[name].append(timed())
    best = {k: min(v) * 1e6 for k, v in results.items()}
    print(f"{'variant':<32}{'us/step':>10}{'vs eager':>10}")
    for key, label in ROWS:
        print(f"{label:<32}{best[key]:>10.1f}{best[key] / best['eager']:>9.2f}x")
    state_cost = best["compiled"] / best["compiled_plain"]
    print(f"BatchNorm + dropout cost the compiled step {state_cost:.2f}x the plain MLP's; first call (compile) "
          "seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in compile_seconds.items()))
    print(json.dumps({"benchmark": "compiled_state", "clock": args.clock, "us_per_step": best,
                      "ratio_vs_eager": {k: best[k] / best["eager"] for k in best},
                      "compiled_state_vs_plain": state_cost, "compile_seconds": compile_seconds}))


if __name__ == "__main__":
    main()
