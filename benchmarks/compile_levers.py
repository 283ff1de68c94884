"""What cuts the compiled backend's first compile of BERT: each variant (Inductor config, g++
optimisation level) compiles the same BERT program in a fresh process with an empty Inductor
cache, then times a few compiled steps; the variants' compile CPU seconds (g++ included) and
step times are compared with the baseline's.

    python benchmarks/compile_levers.py [--layers 2] [--variants base,O1,...] [--steps 3] [--keep DIR]
    python benchmarks/compile_levers.py --interleaved LAYERS ROUNDS

A variant is ``name`` from ``VARIANTS``: Inductor config patches, the optimisation level g++
compiles Inductor's CPU kernels with (torch 2.13 hard-codes ``-O3`` for them in
``cpp_builder._get_optimization_cflags``), ``unbatched`` (each kernel its own g++ run, as before
``runtime/compiled/kernel_batch.py``) or ``stacked`` (an experiment: LAMB over the same-shape
tensors of a group stacked, one computation per shape). ``--interleaved`` builds the program
with and without ``stacked`` in one process and times their steps interleaved.

Each process: one compile thread (so g++ runs as this process's child and its CPU time is
counted), one torch thread; compile CPU seconds = the process's own + its children's during
``compile()``; step time = best thread-CPU time of ``--steps`` host calls (CPU time: this
machine is shared, wall time follows its load). The baseline's eager openpop step is timed the
same way (the >= 1.1x target). Prints a table and one JSON line.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

VARIANTS = {
    "base": {},
    "O2": {"opt": "O2"},
    "O1": {"opt": "O1"},
    "O0": {"opt": "O0"},
    "nopch": {"config": {"cpp_cache_precompile_headers": False}},
    "combo": {"config": {"combo_kernels": True}},
    "nofusion": {"config": {"max_fusion_size": 1}},
    "fusion16": {"config": {"max_fusion_size": 16}},
    "aggressive": {"config": {"aggressive_fusion": True}},
    "nopattern": {"config": {"pattern_matcher": False}},
    "simd0": {"config": {"cpp.simdlen": 0}},
    "threads2": {"config": {"compile_threads": 2}},
    "cppwrapper": {"config": {"cpp_wrapper": True}},
    "unbatched": {"unbatched": True},
    "stacked": {"stacked_lamb": True},
}


def _cpu_seconds():
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def apply_variant(variant):
    import torch._inductor.config as inductor_config
    from torch._inductor import cpp_builder
    inductor_config.compile_threads = 1
    for key, value in variant.get("config", {}).items():
        target = inductor_config
        *path, leaf = key.split(".")
        for part in path:
            target = getattr(target, part)
        setattr(target, leaf, value)
    if variant.get("unbatched"):  # Inductor builds each C++ kernel with its own g++ run
        import contextlib

        from openpop.runtime.compiled import inductor
        inductor.batched_kernels = contextlib.nullcontext
    if variant.get("stacked_lamb"):
        _stack_lamb_updates()
    builds = []
    original_run = cpp_builder._run_compile_cmd

    def timed_run(cmd_line, cwd):
        start = time.perf_counter()
        original_run(cmd_line, cwd)
        builds.append((time.perf_counter() - start, cmd_line))
    cpp_builder._run_compile_cmd = timed_run
    level = variant.get("opt")
    if level:
        original = cpp_builder._get_optimization_cflags

        def cflags(cpp_compiler, min_optimize=False):
            flags, ldflags = original(cpp_compiler, min_optimize)
            return [level if f == "O3" else f for f in flags], ldflags
        cpp_builder._get_optimization_cflags = cflags
    return builds


def _stack_lamb_updates(only_marked=False):
    """Experiment: LAMB over same-shape tensors of a group stacked (one computation per shape)."""
    import torch

    from openpop.runtime.compiled.functional_optim import FunctionalOptimizer
    original = FunctionalOptimizer.update

    def lamb_rows(p, g, st, h, bias_correction):
        rows = (-1,) + (1,) * (p.dim() - 1)
        step = st["step"] + 1.0
        m = torch.lerp(st["exp_avg"], g, 1.0 - h["beta1"])
        v = st["exp_avg_sq"] * h["beta2"] + g * g * (1.0 - h["beta2"])
        if bias_correction:
            denom = torch.sqrt(v) / torch.sqrt(1.0 - torch.pow(h["beta2"], step)).reshape(rows) + h["eps"]
            update = m / (1.0 - torch.pow(h["beta1"], step)).reshape(rows) / denom
        else:
            update = m / (torch.sqrt(v) + h["eps"])
        update = update + h["weight_decay"] * p
        dims = tuple(range(1, p.dim()))
        r1 = torch.minimum(torch.linalg.vector_norm(p, dim=dims), h["max_weight_norm"])
        r2 = torch.linalg.vector_norm(update, dim=dims)
        ratio = torch.where((r1 > 0) & (r2 > 0), r1 / r2, torch.ones_like(r1)).reshape(rows)
        return p - h["lr"] * (update * ratio), {"step": step, "exp_avg": m, "exp_avg_sq": v}

    def update(self, params, grads, state, hyper):
        if self.family != "lamb" or self.static[1] is not None or any(p.dtype != torch.float32 for p in params) \
                or (only_marked and not getattr(self.optimizer, "_levers_stacked", False)):
            return original(self, params, grads, state, hyper)
        new_params, new_state = [None] * len(params), [None] * len(params)
        start = 0
        for group, h in zip(self.static[2], hyper):
            buckets = {}
            for k in range(start, start + group[0]):
                buckets.setdefault(tuple(params[k].shape), []).append(k)
            for ks in buckets.values():
                st = {key: torch.stack([state[k][key] for k in ks]) for key in ("step", "exp_avg", "exp_avg_sq")}
                p, st = lamb_rows(torch.stack([params[k] for k in ks]), torch.stack([grads[k] for k in ks]), st, h,
                                  group[5])
                for i, k in enumerate(ks):
                    new_params[k] = p[i]
                    new_state[k] = {key: value[i] for key, value in st.items()}
            start += group[0]
        return new_params, new_state
    FunctionalOptimizer.update = update


def worker(name, layers, steps, eager):
    import torch
    builds = apply_variant(VARIANTS[name])
    torch.set_num_threads(1)
    from bert_throughput import make_batches, make_bench_config
    from torch._dynamo.utils import compilation_time_metrics as metrics

    import poptorch
    from openpop.bert.model import PipelinedBertForPretraining
    from openpop.bert.optimization import get_optimizer
    from openpop.bert.train import get_options
    args = argparse.Namespace(layers=layers, micro_batch=8, gradient_accumulation=2, dropout=None)
    config = make_bench_config(args)
    batch = make_batches(config, 1)[0]

    def executor(backend):
        torch.manual_seed(0)
        model = PipelinedBertForPretraining(config).parallelize(lambda line: None).train()
        options = get_options(config).openpopBackend(backend)
        return poptorch.trainingModel(model, options, get_optimizer(config, model))

    def step_seconds(run):
        best = float("inf")
        for _ in range(steps):
            start = time.thread_time()
            loss = float(run(*batch)[0])
            best = min(best, time.thread_time() - start)
        return best, loss

    compiled = executor("compiled")
    cpu, wall = _cpu_seconds(), time.perf_counter()
    if os.environ.get("LEVERS_PROFILE"):
        import cProfile
        profiler = cProfile.Profile()
        profiler.enable()
        compiled.compile(*batch)
        profiler.disable()
        profiler.dump_stats(os.environ["LEVERS_PROFILE"])
    else:
        compiled.compile(*batch)
    result = {"variant": name, "compile_cpu_seconds": _cpu_seconds() - cpu,
              "compile_wall_seconds": time.perf_counter() - wall,
              "gcc_runs": len(builds), "gcc_seconds": sum(b[0] for b in builds),
              "gcc_slowest": [(round(t, 2), c[-300:]) for t, c in sorted(builds, key=lambda b: -b[0])[:3]],
              "timers": {k: round(sum(v), 2) for k, v in metrics.items() if sum(v) > 0.5}}
    compiled(*batch)  # the first run
    result["step_cpu_seconds"], result["first_loss"] = step_seconds(compiled)
    if eager:
        plain = executor("eager")
        plain(*batch)
        result["eager_step_cpu_seconds"], _ = step_seconds(plain)
    print(json.dumps(result), flush=True)


def interleaved(layers, rounds):
    """Compiled step time with and without stacked LAMB, in one process, interleaved (best and median)."""
    import statistics

    import torch
    _stack_lamb_updates(only_marked=True)
    torch.set_num_threads(1)
    from bert_throughput import make_batches, make_bench_config

    import poptorch
    from openpop.bert.model import PipelinedBertForPretraining
    from openpop.bert.optimization import get_optimizer
    from openpop.bert.train import get_options
    config = make_bench_config(argparse.Namespace(layers=layers, micro_batch=8, gradient_accumulation=2,
                                                  dropout=None))
    batch = make_batches(config, 1)[0]
    runs = {}
    for name in ("base", "stacked"):
        torch.manual_seed(0)
        model = PipelinedBertForPretraining(config).parallelize(lambda line: None).train()
        optimizer = get_optimizer(config, model)
        optimizer._levers_stacked = name == "stacked"
        runs[name] = poptorch.trainingModel(model, get_options(config).openpopBackend("compiled"), optimizer)
        runs[name].compile(*batch)
        runs[name](*batch)
    times = {name: [] for name in runs}
    for i in range(rounds):
        for name in (("base", "stacked") if i % 2 else ("stacked", "base")):
            start = time.thread_time()
            float(runs[name](*batch)[0])
            times[name].append(time.thread_time() - start)
    ratio = statistics.median(s / b for s, b in zip(times["stacked"], times["base"]))
    print(json.dumps({"benchmark": "compile_levers_interleaved", "layers": layers,
                      "best": {k: min(v) for k, v in times.items()}, "median_stacked_over_base": ratio,
                      "load": os.getloadavg()[0]}), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--variants", default="base,O1")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--keep", default=None, help="keep each variant's Inductor cache under this directory")
    args = parser.parse_args()
    results = []
    for name in args.variants.split(","):
        with tempfile.TemporaryDirectory(prefix="openpop-levers-", dir=args.keep) as cache:
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, OMP_NUM_THREADS="1")
            command = [sys.executable, os.path.abspath(__file__), "--worker", name, str(args.layers),
                       str(args.steps), "1" if name == "base" else "0"]
            started = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, env=env)
            if done.returncode != 0:
                print(f"{name}: failed\n{done.stderr[-3000:]}", flush=True)
                continue
            result = json.loads(done.stdout.strip().splitlines()[-1])
            result["process_wall_seconds"] = time.perf_counter() - started
            result["load"] = os.getloadavg()[0]
            results.append(result)
            if args.keep:
                os.rename(cache, os.path.join(args.keep, name))
                os.makedirs(cache)
            eager = result.get("eager_step_cpu_seconds")
            print(f"{name:<11} compile {result['compile_cpu_seconds']:6.1f} CPU-s "
                  f"{result['compile_wall_seconds']:6.1f} s wall ({result['gcc_runs']} g++ runs, "
                  f"{result['gcc_seconds']:.1f} s), step {result['step_cpu_seconds']:.3f} CPU-s"
                  + (f" (eager {eager:.3f})" if eager else "")
                  + f", loss {result['first_loss']:.6f}, load {result['load']:.1f}", flush=True)
            slowest = sorted(result["timers"].items(), key=lambda kv: -kv[1])[:12]
            print("    " + ", ".join(f"{k} {v}" for k, v in slowest), flush=True)
    print(json.dumps({"benchmark": "compile_levers", "layers": args.layers, "results": results}), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if len(sys.argv) > 1 and sys.argv[1] == "--interleaved":
        interleaved(int(sys.argv[2]), int(sys.argv[3]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1")
    else:
        main()
