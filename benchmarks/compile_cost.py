"""Calibration of the ``auto`` rule's compile-cost estimate (``runtime/compiled/compile_cost.py``):
for a range of models, the estimate's inputs (aten ops of one probe micro-batch, unrolled
micro-batches, trained tensors) and the compiled backend's real compile time, cold (a fresh
process with an empty Inductor cache, one compile thread so that g++'s CPU time is counted: CPU
seconds are what the fit uses, as they hardly depend on the machine's load) and warm (a second
executor of the same model in that process); then the least-squares fit of
``seconds = a + b * ops * unrolled + c * tensors``.

    python benchmarks/compile_cost.py [--cases mlp,mlp_ga4,bn,conv,pipe4_ga8,bert_l1,bert_l1_ga2,bert_l2,bert_l4]

The default cases take ~5 minutes here (``run_all.py``'s limit is 15); the table in RESULTS.md also has
``bert_l1_ga2,bert_l2,bert_l4`` (``bert_l<layers>_ga<accumulation>``: any layers and accumulation).

Each case runs in its own process (the estimate a fresh process would make); prints a table and
one JSON line. Compile times depend on the machine's load: the table prints ``uptime``'s.
"""
import argparse
import copy
import json
import os
import resource
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

import poptorch

CASES = ("mlp", "mlp_ga4", "bn", "conv", "pipe4_ga8", "bert_l1")


class BatchNormMLP(torch.nn.Module):
    def __init__(self, width=32):
        super().__init__()
        self.fc1, self.bn = torch.nn.Linear(width, width), torch.nn.BatchNorm1d(width)
        self.fc2 = torch.nn.Linear(width, 1)

    def forward(self, x, y):
        out = self.fc2(torch.relu(self.bn(self.fc1(x))))
        return out, F.mse_loss(out, y)


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 16, 3, padding=1)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x, labels):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.relu(self.conv2(x)).mean((2, 3))
        out = self.fc(x)
        return out, F.cross_entropy(out, labels)


def build(case):
    """``(model, options, optimizer, batch)`` of one case, compiled backend not chosen yet."""
    from _models import MLP, FourBlocks
    ga = int(case.rsplit("_ga", 1)[1]) if "_ga" in case else 1
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(ga)
    micro = 8 * ga
    if case.startswith("bert"):
        from bert_throughput import make_batches

        from openpop.bert.config import make_config
        from openpop.bert.model import PipelinedBertForPretraining
        from openpop.bert.optimization import get_optimizer
        from openpop.bert.train import get_options
        layers = int(case.split("_")[1][1:])
        config = make_config("cpu_base_128", micro_batch_size=8, gradient_accumulation=ga, device_iterations=1,
                             replication_factor=1, num_hidden_layers=layers, ipus_per_replica=1,
                             layers_per_ipu=[layers], loss_scaling=1.0, optimizer="LAMBNoBiasCorrection",
                             precision="fp32")
        model = PipelinedBertForPretraining(config).parallelize(lambda line: None).train()
        return model, get_options(config), get_optimizer(config, model), make_batches(config, 1)[0]
    if case.startswith("mlp"):
        model, batch = MLP(), (torch.randn(micro, 32), torch.randn(micro, 1))
    elif case == "bn":
        model, batch = BatchNormMLP(), (torch.randn(micro, 32), torch.randn(micro, 1))
    elif case == "conv":
        model, batch = ConvNet(), (torch.randn(micro, 3, 16, 16), torch.randint(0, 10, (micro,)))
    else:
        model, batch = FourBlocks(width=64), (torch.randn(micro, 64), torch.randn(micro, 64))
        opts.setExecutionStrategy(poptorch.PipelinedExecution())
    return model, opts, torch.optim.SGD(model.parameters(), lr=0.01), batch


def _cpu_seconds():
    """This process's CPU time and its reaped children's (g++ runs as a child with one compile thread)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def compiled_once(model, opts, optimizer_of, batch):
    """A fresh ``auto`` executor: its estimate at the first (eager) call, then its compile forced
    (the rental paid at once). Returns ``(CompileCost, compile seconds, compile CPU seconds)``."""
    executor = poptorch.trainingModel(model, opts, optimizer_of(model))
    executor(*batch)
    selection = executor._dispatch.compiled.selection
    cost = selection.cost
    selection.compile_after = 0.0
    cpu = _cpu_seconds()
    executor(*batch)
    cpu = _cpu_seconds() - cpu
    assert executor._dispatch.compiled.last == "compiled", selection.declined
    seconds = executor._dispatch.compiled.compile_seconds
    executor.destroy()
    return cost, seconds, cpu


def worker(case):
    torch.manual_seed(0)
    model, opts, optimizer, batch = build(case)
    opts.openpopBackend("auto").showCompilationProgressBar(False)
    lr = optimizer.param_groups[0]["lr"]
    kind = type(optimizer)
    if case.startswith("bert"):
        from openpop.bert.optimization import get_optimizer
        config = model.config

        def optimizer_of(m):
            return get_optimizer(config, m)
    else:
        def optimizer_of(m):
            return kind(m.parameters(), lr=lr)
    twin = copy.deepcopy(model)
    cost, cold, cpu = compiled_once(model, opts, optimizer_of, batch)
    warm_cost, warm, _ = compiled_once(twin, opts, optimizer_of, batch)
    print(json.dumps({"case": case, "ops": cost.ops, "unrolled": cost.unrolled, "tensors": cost.tensors,
                      "optimizer": kind.__name__, "estimate": cost.seconds, "cold_seconds": cold,
                      "cold_cpu_seconds": cpu, "warm_estimate": warm_cost.seconds, "warm_flagged": warm_cost.warm,
                      "warm_seconds": warm}))


def fit(rows):
    """Least squares of cold compile CPU seconds on (1, ops * unrolled, tensors)."""
    a = torch.tensor([[1.0, r["ops"] * r["unrolled"], r["tensors"]] for r in rows], dtype=torch.float64)
    b = torch.tensor([r["cold_cpu_seconds"] for r in rows], dtype=torch.float64)
    if len(rows) < 3:
        return None
    return torch.linalg.lstsq(a, b.unsqueeze(1)).solution.squeeze(1).tolist()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    rows = []
    print(f"{'case':12} {'ops':>6} {'unroll':>6} {'tensors':>7} {'estimate':>9} {'cold s':>8} {'cold CPU-s':>10} "
          f"{'warm est':>8} {'warm s':>7} {'load':>5}", flush=True)
    for case in args.cases.split(","):
        with tempfile.TemporaryDirectory(prefix="openpop-compile-cost-") as cache:
            # one compile thread: g++ runs as this process's child, so its CPU time is counted
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TORCHINDUCTOR_COMPILE_THREADS="1")
            env.pop("POPTORCH_CACHE_DIR", None)
            env.pop("OPENPOP_COMPILE_AFTER", None)
            done = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", case],
                                  capture_output=True, text=True, env=env)
        if done.returncode != 0:
            print(f"{case}: worker failed:\n{done.stderr[-3000:]}", flush=True)
            continue
        row = json.loads(done.stdout.strip().splitlines()[-1])
        row["load"] = os.getloadavg()[0]
        rows.append(row)
        print(f"{case:12} {row['ops']:6d} {row['unrolled']:6d} {row['tensors']:7d} {row['estimate']:9.1f} "
              f"{row['cold_seconds']:8.1f} {row['cold_cpu_seconds']:10.1f} {row['warm_estimate']:8.1f} "
              f"{row['warm_seconds']:7.1f} "
              f"{row['load']:5.1f}", flush=True)
    coefficients = fit(rows)
    if coefficients is not None:
        print("fit: seconds = {:.2f} + {:.5f} * ops * unrolled + {:.3f} * tensors".format(*coefficients))
    print(json.dumps({"benchmark": "compile_cost", "rows": rows, "fit": coefficients}))


if __name__ == "__main__":
    main()
