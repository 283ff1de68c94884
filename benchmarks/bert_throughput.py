"""BERT-base (seq 128) pretraining throughput on this machine: openpop's trainingModel vs a
hand-written PyTorch loop, fp32 and bf16 autocast, with model FLOPs and an in-run matmul
calibration so MFU is measured against this machine's own peak.

    python benchmarks/bert_throughput.py [--micro-batch 8] [--gradient-accumulation 2] [--rounds 3]
        [--compiled] [--hand-compiled] [--compile-times] [--layers 12] [--dropout 0.1]

Same model (openpop-bert's PipelinedBertForPretraining, BERT-base, dropout 0.1, MLM on the 20
masked positions), same data (random tokens), same optimizer object (LAMB without bias
correction, the recipe's) for every variant. One step = ``gradient_accumulation`` micro-batches
and one optimizer update. Variants run interleaved, one timed step each per round after a
warm-up round (the order of the two loops alternates), so machine load hits them alike; the
best round gives the throughput, the median of per-round time ratios the openpop/hand ratio. The fp32 and bf16
matmul rates are measured at the start of every round on BERT-base's GEMM shapes (the best
counts as this machine's peak; float32 both aten's, MKL, and oneDNN's, which compiled regions use
where it is faster, e.g. on AMD CPUs: the faster one is the peak).

MFU = samples/s x model FLOPs per sample / measured matmul rate of the same precision, with
model FLOPs = 3 x forward FLOPs (openpop.bert.metrics.training_flops_per_sample).

``--compiled`` adds the compiled backend (``openpopBackend("compiled", unit=--unit)``; ``auto``
picks regions for BERT-base) per precision: its own
copy of the model (same initial weights) and optimizer, compiled in ``compile()``, timed in the
same rounds; the ratio is compiled / openpop eager. ``--hand-compiled`` adds the peer that counts:
the hand-written loop with the model and the optimizer step under ``torch.compile`` (its own copy,
same initial weights), and the ratios compiled / hand-compiled (target >= 1.0: openpop knows the
whole host call) and openpop eager / hand-compiled. ``--compile-times`` runs two fresh processes
that build the compiled trainingModel of the same config and call ``compile()`` with one new
executable cache directory: "first" compiles and fills it, "cached" should load every graph from
it; it prints their ``compileSeconds()``, the process CPU seconds (g++ children included) and
torch's split into Dynamo tracing and AOTAutograd + Inductor.

Targets: openpop >= 0.97x the hand-written loop; fp32 >= 30 % of the fp32 matmul rate;
bf16 autocast >= 2.5x fp32 throughput; compiled >= 1.1x openpop eager; BERT-base first compile
<= 60 s and cached compile <= 10 s on this 2-core machine.
"""
import argparse
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import poptorch
from openpop.bert.config import make_config
from openpop.bert.metrics import training_flops_per_sample
from openpop.bert.model import PipelinedBertForPretraining
from openpop.bert.optimization import get_optimizer
from openpop.bert.train import get_options
from openpop.runtime.compiled.onednn_matmuls import onednn_linear

from _machine import cpu_name

TARGETS = {"framework_tax": 0.97, "fp32_mfu": 0.30, "bf16_speedup": 2.5, "compiled_speedup": 1.1,
           "compiled_vs_hand_compiled": 1.0, "first_compile_seconds": 60.0, "cached_compile_seconds": 10.0}


def machine_info():
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version()}


def matmul_rate(dtype, tokens, hidden, intermediate, repeats=3, library="aten"):
    """Best GFLOP/s over BERT's training GEMM shapes (forward, data-grad, weight-grad) of
    ``torch.mm`` (library "aten": MKL for float32 in the PyPI wheels, oneDNN for bfloat16) or of
    oneDNN's float32 GEMM (library "onednn", what the compiled backend's regions use where it is
    faster: runtime/compiled/onednn_matmuls.py)."""
    best = 0.0
    shapes = [(tokens, hidden, intermediate), (tokens, intermediate, hidden), (hidden, tokens, intermediate),
              (tokens, hidden, 3 * hidden)]
    for m, k, n in shapes:
        a = torch.randn(m, k).to(dtype)
        b = torch.randn(k, n).to(dtype)
        product = functools.partial(torch.mm, a, b) if library == "aten" else functools.partial(onednn_linear, a, b.t())
        product()
        for _ in range(repeats):
            start = time.perf_counter()
            product()
            seconds = time.perf_counter() - start
            best = max(best, 2.0 * m * k * n / seconds / 1e9)
    return best


def make_batches(config, steps, seed=0):
    generator = torch.Generator().manual_seed(seed)
    n = config.micro_batch_size * config.gradient_accumulation
    batches = []
    for _ in range(steps):
        batches.append([
            torch.randint(5, config.vocab_size, (n, config.sequence_length), generator=generator),
            torch.ones(n, config.sequence_length, dtype=torch.long),
            (torch.arange(config.sequence_length) >= config.sequence_length // 2).long().expand(n, -1).contiguous(),
            torch.randint(0, config.sequence_length, (n, config.mask_tokens), generator=generator),
            torch.randint(5, config.vocab_size, (n, config.mask_tokens), generator=generator),
            torch.randint(0, 2, (n, 1), generator=generator),
        ])
    return batches


class HandWritten:
    """The loop a PyTorch user writes for the same math: per micro-batch forward (autocast for
    bf16), loss x loss_scaling / GA, backward; gradients divided by loss_scaling; optimizer step
    and zero_grad. Sums the returned losses as openpop's OutputMode.Sum does. (The recipe's
    optimizer carries loss_scaling=16384, which openpop applies for real.)"""

    def __init__(self, model, optimizer, config, precision):
        self.model, self.optimizer, self.config = model, optimizer, config
        self.autocast = precision == "bf16"

    def step(self, batch):
        ga, mb = self.config.gradient_accumulation, self.config.micro_batch_size
        total = 0.0
        scale = float(getattr(self.optimizer, "loss_scaling", 1.0))
        for g in range(ga):
            micro = [t[g * mb:(g + 1) * mb] for t in batch]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
                outputs = self.model(*micro)
            (outputs[0] * (scale / ga)).backward()
            total = total + outputs[0].detach()
        if scale != 1.0:
            grads = [p.grad for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]
            torch._foreach_mul_(grads, 1.0 / scale)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total


class HandCompiled(HandWritten):
    """The PyTorch user's best loop on this machine: the same loop as ``HandWritten`` with the
    model under ``torch.compile`` (default mode: the forward + backward of a micro-batch compiled
    whole where Dynamo can, graph breaks otherwise) and the optimizer step under ``torch.compile``
    too (torch's recipe for a compiled optimizer); ``compile()`` compiles both once, untimed."""

    def __init__(self, model, optimizer, config, precision, batch):
        super().__init__(torch.compile(model), optimizer, config, precision)
        self._optimizer_step = torch.compile(optimizer.step)
        self.compile_seconds = self._warm(batch)

    def _warm(self, batch):
        """One step, twice (first: compile; second: the guards that depend on state the first
        step created, e.g. the optimizer's moments), on copies so the weights do not move."""
        state = {k: v.clone() for k, v in self.model.state_dict().items()}
        started = time.perf_counter()
        for _ in range(2):
            self.step(batch)
        self.model.load_state_dict(state)
        self.optimizer.state.clear()
        return time.perf_counter() - started

    def step(self, batch):
        optimizer_step = self.optimizer.step
        self.optimizer.step = self._optimizer_step
        try:
            return super().step(batch)
        finally:
            self.optimizer.step = optimizer_step


class OpenPop:
    """openpop-bert's own setup: poptorch.trainingModel with the app's options, compiled once."""

    def __init__(self, model, optimizer, config, precision, batch, backend="eager", unit=None):
        options = get_options(config.replace(precision=precision)).openpopBackend(backend, unit=unit)
        self.executor = poptorch.trainingModel(model, options, optimizer)
        self.executor.compile(*batch)

    def step(self, batch):
        return self.executor(*batch)[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--gradient-accumulation", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4, help="timed rounds (after one warm-up round)")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--layers", type=int, default=12, help="encoder layers (12 = BERT-base)")
    parser.add_argument("--dropout", type=float, default=None, help="hidden dropout (default: the config's, 0.1)")
    parser.add_argument("--compiled", action="store_true", help="add the compiled backend's rows")
    parser.add_argument("--hand-compiled", action="store_true",
                        help="add the hand-written loop under torch.compile (model and optimizer step): the peer "
                             "the compiled backend is measured against")
    parser.add_argument("--unit", default="auto", choices=["auto", "program", "regions"],
                        help="the compiled backend's unit (auto: regions for BERT-base)")
    parser.add_argument("--compile-times", action="store_true",
                        help="only measure first and cached compile() times of the compiled backend")
    args = parser.parse_args()

    config = make_bench_config(args)
    if args.compile_times:
        return compile_times(args)
    batches = make_batches(config, 2)
    samples_per_step = config.micro_batch_size * config.gradient_accumulation
    flops = training_flops_per_sample(config)
    tokens = config.micro_batch_size * config.sequence_length

    # One model and optimizer per precision, shared by its two loops (the executor trains the
    # user's own parameters); both models start from the same weights.
    pairs = []
    for precision in args.precisions:
        torch.manual_seed(0)
        model = PipelinedBertForPretraining(config).parallelize(lambda line: None).train()
        optimizer = get_optimizer(config, model)
        variants = [("hand", HandWritten(model, optimizer, config, precision)),
                    ("openpop", OpenPop(model, optimizer, config, precision, batches[0]))]
        if args.compiled:  # a model of its own: one training executor per model
            torch.manual_seed(0)
            model = PipelinedBertForPretraining(config).parallelize(lambda line: None).train()
            started = time.perf_counter()
            compiled = OpenPop(model, get_optimizer(config, model), config, precision, batches[0], backend="compiled",
                               unit=args.unit)
            variants.append(("compiled", compiled))
            print(f"compiled {precision}: compile() took {time.perf_counter() - started:.1f} s "
                  f"(unit {compiled.executor._dispatch.compiled.selection.unit})", flush=True)
        if args.hand_compiled:  # a model and optimizer of their own, same initial weights
            torch.manual_seed(0)
            model = PipelinedBertForPretraining(config).parallelize(lambda line: None).train()
            peer = HandCompiled(model, get_optimizer(config, model), config, precision, batches[0])
            variants.append(("handcompiled", peer))
            print(f"hand-compiled {precision}: torch.compile took {peer.compile_seconds:.1f} s", flush=True)
        pairs.append((precision, variants))
    seconds = {f"{kind}_{p}": [] for p, variants in pairs for kind, _ in variants}
    rates = {"fp32_aten": [], "fp32_onednn": [], "bf16": []}
    print(f"BERT-base L{config.num_hidden_layers} H{config.hidden_size} seq {config.sequence_length}: micro-batch "
          f"{config.micro_batch_size} x accumulation {config.gradient_accumulation} = {samples_per_step} samples/step, "
          f"{flops / 1e9:.1f} GFLOP/sample, {torch.get_num_threads()} threads", flush=True)
    for round_index in range(args.rounds + 1):
        warmup = round_index == 0
        for dtype, key, library in ((torch.float32, "fp32_aten", "aten"), (torch.float32, "fp32_onednn", "onednn"),
                                    (torch.bfloat16, "bf16", "aten")):
            if library == "onednn" and not torch.backends.mkldnn.is_available():
                continue
            rates[key].append(matmul_rate(dtype, tokens, config.hidden_size, config.intermediate_size, library=library))
        batch = batches[round_index % len(batches)]
        for precision, variants in pairs:
            order = list(variants)
            if round_index % 2:
                order.reverse()  # alternate who goes first
            for kind, variant in order:
                name = f"{kind}_{precision}"
                start = time.perf_counter()
                float(variant.step(batch))
                elapsed = time.perf_counter() - start
                if not warmup:
                    seconds[name].append(elapsed)
                print(f"  round {round_index}{' (warm-up)' if warmup else ''}: {name:<13} {elapsed:6.2f} s/step  "
                      f"{samples_per_step / elapsed:5.2f} samples/s  (load {os.getloadavg()[0]:.1f})", flush=True)

    libraries = {k: max(v) for k, v in rates.items() if v}
    # This machine's float32 peak: the faster library's (MFU of eager, which runs aten's, is
    # against it too: what the machine can do, not what one library does)
    peak = {"fp32": max(libraries["fp32_aten"], libraries.get("fp32_onednn", 0.0)), "bf16": libraries["bf16"]}
    throughput = {name: samples_per_step / min(v) for name, v in seconds.items()}
    result = {"benchmark": "bert_throughput", "machine": machine_info(), "model": "BERT-base seq 128",
              "micro_batch": config.micro_batch_size, "gradient_accumulation": config.gradient_accumulation,
              "samples_per_step": samples_per_step, "gflop_per_sample": round(flops / 1e9, 2),
              "matmul_gflops": {k: round(v, 1) for k, v in {**peak, **libraries}.items()},
              "samples_per_sec": {k: round(v, 3) for k, v in throughput.items()}}
    ratios, mfu = {}, {}
    for precision in args.precisions:
        hand, ours = throughput[f"hand_{precision}"], throughput[f"openpop_{precision}"]
        # Paired by round (same machine load), the median of hand time / openpop time.
        paired = [h / o for h, o in zip(seconds[f"hand_{precision}"], seconds[f"openpop_{precision}"])]
        ratios[precision] = round(statistics.median(paired), 3)
        mfu[f"openpop_{precision}"] = round(ours * flops / 1e9 / peak[precision], 3)
        mfu[f"hand_{precision}"] = round(hand * flops / 1e9 / peak[precision], 3)
    result["openpop_vs_hand"] = ratios
    result["openpop_vs_hand_best_rounds"] = {p: round(throughput[f"openpop_{p}"] / throughput[f"hand_{p}"], 3)
                                             for p in args.precisions}
    result["mfu_vs_measured_matmul"] = mfu
    if args.compiled:
        result["compiled_vs_openpop_eager"] = {
            p: round(statistics.median(e / c for e, c in zip(seconds[f"openpop_{p}"], seconds[f"compiled_{p}"])), 3)
            for p in args.precisions}
        for precision in args.precisions:
            mfu[f"compiled_{precision}"] = round(throughput[f"compiled_{precision}"] * flops / 1e9 / peak[precision], 3)
    if args.hand_compiled:
        result["openpop_eager_vs_hand_compiled"] = {
            p: round(statistics.median(h / o for h, o in zip(seconds[f"handcompiled_{p}"], seconds[f"openpop_{p}"])), 3)
            for p in args.precisions}
        if args.compiled:
            result["compiled_vs_hand_compiled"] = {
                p: round(statistics.median(h / c for h, c in zip(seconds[f"handcompiled_{p}"],
                                                                  seconds[f"compiled_{p}"])), 3)
                for p in args.precisions}
    if {"fp32", "bf16"} <= set(args.precisions):
        result["bf16_vs_fp32"] = round(throughput["openpop_bf16"] / throughput["openpop_fp32"], 3)
        result["mfu_bf16_vs_fp32_matmul"] = round(throughput["openpop_bf16"] * flops / 1e9 / peak["fp32"], 3)
        # The ceiling of any bf16 speed-up: how much faster this machine's bf16 matmuls are
        # (AMX: ~6x; AVX512-BF16 without AMX: ~2x).
        result["matmul_bf16_vs_fp32"] = round(peak["bf16"] / peak["fp32"], 2)
    checks = {}
    if ratios:
        checks["framework_tax>=0.97"] = min(ratios.values()) >= TARGETS["framework_tax"]
    if "fp32" in args.precisions:
        checks["fp32_mfu>=30%"] = mfu["openpop_fp32"] >= TARGETS["fp32_mfu"]
    if "bf16_vs_fp32" in result:
        checks["bf16>=2.5x_fp32"] = result["bf16_vs_fp32"] >= TARGETS["bf16_speedup"]
    if args.compiled:
        slowest = min(result["compiled_vs_openpop_eager"].values())
        checks["compiled>=1.1x_eager"] = slowest >= TARGETS["compiled_speedup"]
    if "compiled_vs_hand_compiled" in result:
        checks["compiled>=1.0x_hand_compiled"] = min(result["compiled_vs_hand_compiled"].values()) >= \
            TARGETS["compiled_vs_hand_compiled"]
    result["targets_met"] = checks

    print()
    print(f"{'variant':<16}{'samples/s':>10}{'GFLOP/s':>9}{'MFU':>7}")
    for name, value in throughput.items():
        precision = name.split("_")[1]
        print(f"{name:<16}{value:>10.2f}{value * flops / 1e9:>9.1f}{value * flops / 1e9 / peak[precision]:>7.1%}")
    onednn = f", oneDNN {libraries['fp32_onednn']:.0f}" if "fp32_onednn" in libraries else ""
    print(f"measured matmul peak: fp32 {peak['fp32']:.0f} GFLOP/s (aten {libraries['fp32_aten']:.0f}{onednn}), "
          f"bf16 {peak['bf16']:.0f} GFLOP/s")
    for precision, ratio in ratios.items():
        print(f"openpop / hand-written ({precision}, median of per-round ratios): {ratio:.3f}x")
    for precision, ratio in result.get("compiled_vs_openpop_eager", {}).items():
        print(f"compiled / openpop eager ({precision}, median of per-round ratios): {ratio:.3f}x")
    for precision, ratio in result.get("compiled_vs_hand_compiled", {}).items():
        print(f"compiled / hand-compiled loop ({precision}, median of per-round ratios): {ratio:.3f}x")
    for precision, ratio in result.get("openpop_eager_vs_hand_compiled", {}).items():
        print(f"openpop eager / hand-compiled loop ({precision}, median of per-round ratios): {ratio:.3f}x")
    if "bf16_vs_fp32" in result:
        print(f"bf16 autocast / fp32 (openpop): {result['bf16_vs_fp32']:.2f}x "
              f"(bf16 / fp32 matmul rate on this machine: {result['matmul_bf16_vs_fp32']:.2f}x)")
    print("targets: " + ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in checks.items()))
    print(json.dumps(result), flush=True)


def make_bench_config(args):
    dropout = {} if args.dropout is None else {"hidden_dropout_prob": args.dropout}
    return make_config("cpu_base_128", micro_batch_size=args.micro_batch,
                       gradient_accumulation=args.gradient_accumulation, device_iterations=1, replication_factor=1,
                       num_hidden_layers=args.layers, ipus_per_replica=1, layers_per_ipu=[args.layers],
                       loss_scaling=1.0, optimizer="LAMBNoBiasCorrection", precision="fp32", **dropout)


def _cpu_seconds():
    import resource
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def compile_worker(args, precision, cache_dir):
    """A fresh process: the compiled trainingModel's compile() with the executable cache; one JSON line."""
    from torch._dynamo.utils import compilation_time_metrics as metrics

    from openpop.runtime.compile_cache import CompileCache, watch_compiles
    config = make_bench_config(args)
    torch.manual_seed(0)
    model = PipelinedBertForPretraining(config).parallelize(lambda line: None).train()
    options = get_options(config.replace(precision=precision)).openpopBackend("compiled", unit=args.unit)
    options.enableExecutableCaching(cache_dir)
    executor = poptorch.trainingModel(model, options, get_optimizer(config, model))
    batch = make_batches(config, 1)[0]
    cpu = _cpu_seconds()
    with watch_compiles(CompileCache.at(cache_dir)) as outcome:
        executor.compile(*batch)
    cpu = _cpu_seconds() - cpu
    started = time.perf_counter()
    loss = float(executor(*batch)[0])
    # torch's timers that both ways of compiling (torch.compile, and aot_compile for a program
    # saved whole) record: Dynamo's bytecode trace, AOTAutograd with Inductor under it
    tracing = sum(metrics.get("bytecode_tracing", []))
    backend = sum(metrics.get("create_aot_dispatcher_function", []))
    print(json.dumps({"compile_seconds": executor.compileSeconds(), "cpu_seconds": cpu,
                      "dynamo_seconds": tracing,
                      "backend_seconds": backend, "first_step_seconds": time.perf_counter() - started,
                      "first_loss": loss, "loaded_from_cache": outcome.loaded_from_cache,
                      "outcome": outcome.describe()}), flush=True)


def compile_times(args):
    """First and cached compile of the compiled backend, each in a fresh process (module docstring)."""
    results = {}
    for precision in args.precisions:
        with tempfile.TemporaryDirectory(prefix="openpop-bert-cache-") as cache_dir:
            for run in ("first", "cached"):
                command = [sys.executable, os.path.abspath(__file__), "--compile-worker", precision, cache_dir,
                           "--layers", str(args.layers), "--micro-batch", str(args.micro_batch),
                           "--gradient-accumulation", str(args.gradient_accumulation), "--unit", args.unit]
                if args.dropout is not None:
                    command += ["--dropout", str(args.dropout)]
                env = dict(os.environ)
                env.pop("TORCHINDUCTOR_CACHE_DIR", None)
                started = time.perf_counter()
                done = subprocess.run(command, capture_output=True, text=True, env=env)
                if done.returncode != 0:
                    raise SystemExit(f"compile worker failed:\n{done.stderr[-4000:]}")
                result = json.loads(done.stdout.strip().splitlines()[-1])
                result["process_seconds"] = time.perf_counter() - started
                results[f"{run}_{precision}"] = result
                print(f"{run} compile ({precision}, L{args.layers}, unit {args.unit}): "
                      f"{result['compile_seconds']:.1f} s "
                      f"(Dynamo's trace {result['dynamo_seconds']:.1f} s, "
                      f"AOTAutograd/Inductor {result['backend_seconds']:.1f} s;"
                      f" {result['cpu_seconds']:.0f} CPU-s; load {os.getloadavg()[0]:.1f}) - {result['outcome']}",
                      flush=True)
    checks = {}
    if args.layers == 12 and "first_fp32" in results:
        checks["first_compile<=60s"] = results["first_fp32"]["compile_seconds"] <= TARGETS["first_compile_seconds"]
        checks["cached_compile<=10s"] = results["cached_fp32"]["compile_seconds"] <= TARGETS["cached_compile_seconds"]
    print(json.dumps({"benchmark": "bert_compile_times", "machine": machine_info(), "layers": args.layers,
                      "micro_batch": args.micro_batch, "gradient_accumulation": args.gradient_accumulation,
                      "results": results, "targets_met": checks}), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == "--compile-worker":
        precision, cache_dir = sys.argv[2], sys.argv[3]
        worker_parser = argparse.ArgumentParser()
        for flag, kind in (("--layers", int), ("--micro-batch", int), ("--gradient-accumulation", int),
                           ("--dropout", float)):
            worker_parser.add_argument(flag, type=kind, default=None)
        worker_parser.add_argument("--unit", default="auto")
        worker_args = worker_parser.parse_args(sys.argv[4:])
        compile_worker(worker_args, precision, cache_dir)
    else:
        main()
