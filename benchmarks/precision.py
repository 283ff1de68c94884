"""Training-step speed of a small transformer through poptorch.trainingModel in float32, as
half-precision models written for IPUs (``.bfloat16()`` / ``.half()``, and
``opts.Precision.autocast()``) with the CPU's half kernels used as they are, and with openpop's
half-compute policy (``OPENPOP_HALF_COMPUTE=auto``: float32 arithmetic where half matmuls are
slow here) - all measured side by side in this run, with this machine's matmul rates.

    python benchmarks/precision.py [--layers 2 --d-model 256 --seq 64 --batch 8 --repeats 5 --threads N]
    python benchmarks/precision.py --dropout 0 --device-iterations 4 --variants fp32 fp32_compiled \
        bf16_autocast_policy bf16_autocast_compiled fp16_model_policy fp16_model_compiled

The ``*_compiled`` variants (not run by default: each compiles for a minute or more) run the same
model on the compiled backend (``openpopBackend("compiled")``; dropout must be 0 for it).

Every variant trains a copy of the same model on the same data with AdamW. Each repeat times one
host call of ``--device-iterations`` optimizer steps per variant, interleaved so machine load
hits all alike; the best repeat counts. Prints ms per optimizer step, each variant's time
relative to float32, the policy's choice and the matmul rates (float32, bfloat16, float16 at
``--matmul-size``, this run's thread count), then one JSON line.

Float16 overflow (``runtime/half_saturation.py``): ``fp16_model_policy`` runs as every eager
float16 model does, watched for overflow (none happens here); ``fp16_model_ieee`` with
``OPENPOP_HALF_OVERFLOW=inf`` (no watching); ``fp16_model_saturating`` with the saturating mode on
from the start (``rollbackFailedCalls(False)``), as a model runs once it has overflowed.
"""
import argparse
import copy
import json
import os
import time

import torch
import torch.nn.functional as F

import poptorch
from openpop.runtime import half_compute


class Encoder(torch.nn.Module):
    def __init__(self, layers, d_model, heads, vocab, dropout):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d_model)
        layer = torch.nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=dropout,
                                                 batch_first=True, norm_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(d_model, vocab)

    def forward(self, tokens, labels):
        logits = self.head(self.encoder(self.embed(tokens)))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))


# name: (model dtype, autocast dtype, OPENPOP_HALF_COMPUTE, backend[, float16 overflow: watched (default),
# "inf" or "saturating"])
VARIANTS = {
    "fp32": (torch.float32, None, "auto", "eager"),
    "bf16_model_native": (torch.bfloat16, None, "native", "eager"),
    "bf16_model_policy": (torch.bfloat16, None, "auto", "eager"),
    "fp16_model_native": (torch.float16, None, "native", "eager"),
    "fp16_model_policy": (torch.float16, None, "auto", "eager"),
    "fp16_model_ieee": (torch.float16, None, "auto", "eager", "inf"),
    "fp16_model_saturating": (torch.float16, None, "auto", "eager", "saturating"),
    "bf16_autocast_native": (torch.float32, torch.bfloat16, "native", "eager"),
    "bf16_autocast_policy": (torch.float32, torch.bfloat16, "auto", "eager"),
    "fp32_compiled": (torch.float32, None, "auto", "compiled"),
    "bf16_autocast_compiled": (torch.float32, torch.bfloat16, "auto", "compiled"),
    "fp16_model_compiled": (torch.float16, None, "auto", "compiled"),
}
DEFAULT_VARIANTS = [name for name, variant in VARIANTS.items() if variant[3] == "eager"]


def make_runner(base, args, dtype, autocast, setting, backend, overflow="watched"):
    model = copy.deepcopy(base).to(dtype)
    opts = poptorch.Options().deviceIterations(args.device_iterations).openpopBackend(backend)
    opts.showCompilationProgressBar(False)
    if autocast is not None:
        opts.Precision.autocast(True, autocast)
    if overflow == "saturating":
        opts.Training.rollbackFailedCalls(False)  # calls cannot run again: they saturate from the start
    optimizer = poptorch.optim.AdamW(model.parameters(), lr=1e-4)
    environment = {half_compute.SETTING_ENV: setting, "OPENPOP_HALF_OVERFLOW": "inf" if overflow == "inf" else None}
    previous = {name: os.environ.get(name) for name in environment}
    for name, value in environment.items():  # read when the model is wrapped
        os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
    try:
        return poptorch.trainingModel(model, opts, optimizer)
    finally:
        for name, value in previous.items():
            os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)


def matmul_rate(dtype, size, repeats=3):
    """GFLOP/s of a size x size x size matmul in ``dtype`` (best of ``repeats`` after a warm-up)."""
    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size ** 3 / best / 1e9


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--device-iterations", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--matmul-size", type=int, default=512)
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, choices=list(VARIANTS))
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    base = Encoder(args.layers, args.d_model, args.heads, args.vocab, args.dropout)
    rows = args.batch * args.device_iterations
    tokens = torch.randint(0, args.vocab, (rows, args.seq))
    labels = torch.roll(tokens, 1, dims=1)

    rates = {str(dtype).replace("torch.", ""): matmul_rate(dtype, args.matmul_size)
             for dtype in (torch.float32, torch.bfloat16, torch.float16)}
    runners = {name: make_runner(base, args, *VARIANTS[name]) for name in args.variants}
    for runner in runners.values():  # compile + one warm-up call each, not timed
        runner(tokens, labels)
    seconds = {name: [] for name in runners}
    losses = {}
    for _ in range(args.repeats):
        for name, runner in runners.items():
            start = time.perf_counter()
            losses[name] = float(runner(tokens, labels))
            seconds[name].append((time.perf_counter() - start) / args.device_iterations)
    best = {name: min(values) for name, values in seconds.items()}
    baseline = best.get("fp32")
    relative = {name: value / baseline for name, value in best.items()} if baseline else {}
    policy = half_compute.HalfComputePolicy("auto")
    chosen = {str(dtype).replace("torch.", ""): ("native" if policy.all_native("cpu", dtype) else "float32 compute")
              for dtype in half_compute.LOW_PRECISION}
    measured = {f"{str(d).replace('torch.', '')}_{family}": [round(half, 2), round(full, 2)]
                for (d, family), (half, full) in half_compute.CPU_SPEEDS.rates().items()}

    params = sum(p.numel() for p in base.parameters())
    print(f"TransformerEncoder: {args.layers} layers, d_model {args.d_model}, seq {args.seq}, batch {args.batch}, "
          f"{params / 1e6:.1f} M parameters, {torch.get_num_threads()} threads, AdamW, trainingModel")
    print(f"matmul {args.matmul_size}^3 GFLOP/s: " + ", ".join(f"{k} {v:.1f}" for k, v in rates.items()))
    print(f"policy (auto) on this CPU ({torch.backends.cpu.get_cpu_capability()}): "
          + ", ".join(f"{k} -> {v}" for k, v in chosen.items()))
    print(f"{'variant':<24}{'ms/step':>10}{'x fp32 time':>13}{'last loss':>11}")
    for name in runners:
        ratio = f"{relative[name]:.2f}" if relative else "-"
        print(f"{name:<24}{best[name] * 1e3:>10.1f}{ratio:>13}{losses[name]:>11.4f}")
    for dtype in ("bf16", "fp16"):
        native, chosen_run = f"{dtype}_model_native", f"{dtype}_model_policy"
        if native in best and chosen_run in best:
            print(f"{dtype} model: the policy runs it {best[native] / best[chosen_run]:.1f}x faster than as written")
    if {"fp16_model_ieee", "fp16_model_policy", "fp16_model_saturating"} <= set(best):
        ieee = best["fp16_model_ieee"]
        print(f"fp16 model against IEEE overflow: watched for overflow {best['fp16_model_policy'] / ieee:.2f}x the "
              f"time, saturating every op {best['fp16_model_saturating'] / ieee:.2f}x")
    print(json.dumps({"benchmark": "precision", "ms_per_step": {k: round(v * 1e3, 2) for k, v in best.items()},
                      "time_vs_fp32": {k: round(v, 3) for k, v in relative.items()},
                      "policy": chosen, "policy_rates_gflops_half_vs_fp32": measured,
                      "matmul_gflops": {k: round(v, 2) for k, v in rates.items()},
                      "last_loss": losses,
                      "config": {"layers": args.layers, "d_model": args.d_model, "seq": args.seq,
                                 "batch": args.batch, "threads": torch.get_num_threads()}}))


if __name__ == "__main__":
    main()
