"""Host memory kept in the process vs glibc's defaults (``OPENPOP_HOST_MEMORY=retain|release``),
BERT-base (seq 128) training steps on this machine.

    python benchmarks/host_memory.py [--layers 12] [--steps 4] [--rounds 2] [--precision fp32]
        [--backend eager|compiled]

The setting is process-wide, so each variant runs in processes of its own, alternating
(release, retain, release, retain, ...), each building openpop-bert's trainingModel (same
config, weights and data as ``bert_throughput.py``) and timing ``--steps`` steps after one
warm-up step. Prints per variant the median step time, the minor page faults per step (pages
touched for the first time: a kernel entry and a page zeroed each) and the peak resident memory,
the median of the paired retain/release speed-ups, and a JSON line.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from openpop.runtime.host_memory import SETTING_ENV


def worker(args):
    import torch
    from bert_throughput import OpenPop, make_batches, make_bench_config

    from openpop.bert.model import PipelinedBertForPretraining
    from openpop.bert.optimization import get_optimizer
    config = make_bench_config(args)
    batches = make_batches(config, 2)
    torch.manual_seed(0)
    model = PipelinedBertForPretraining(config).parallelize(lambda line: None).train()
    runner = OpenPop(model, get_optimizer(config, model), config, args.precision, batches[0], backend=args.backend)
    from openpop.runtime import host_memory
    seconds, faults = [], []
    for step in range(args.steps + 1):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        started = time.perf_counter()
        float(runner.step(batches[step % 2]))
        if step:  # the first step is the warm-up
            seconds.append(time.perf_counter() - started)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(json.dumps({"retained": host_memory.retain_freed_memory(), "seconds": seconds, "faults": faults,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}), flush=True)


def run_variant(args, setting):
    env = dict(os.environ, **{SETTING_ENV: setting})
    command = [sys.executable, __file__, "--worker", "--layers", str(args.layers), "--steps", str(args.steps),
               "--precision", args.precision, "--backend", args.backend]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=os.path.dirname(__file__))
    if done.returncode != 0:
        sys.exit(f"{setting} worker failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=12, help="encoder layers (12 = BERT-base)")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per process (after one warm-up step)")
    parser.add_argument("--rounds", type=int, default=2, help="pairs of processes (release, retain)")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--backend", default="eager", choices=["eager", "compiled"])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.micro_batch, args.gradient_accumulation, args.dropout = 8, 2, None
    if args.worker:
        return worker(args)

    from _machine import cpu_name
    runs = {"release": [], "retain": []}
    for round_index in range(args.rounds):
        for setting in ("release", "retain"):
            run = run_variant(args, setting)
            runs[setting].append(run)
            print(f"round {round_index} {setting:<8} step {statistics.median(run['seconds']):6.3f} s  "
                  f"faults/step {int(statistics.median(run['faults'])):>7}  peak RSS {run['peak_rss_mb']} MB"
                  f"  (retained: {run['retained']})", flush=True)
    summary = {}
    for setting, setting_runs in runs.items():
        summary[setting] = {
            "step_seconds": round(statistics.median(s for run in setting_runs for s in run["seconds"]), 3),
            "faults_per_step": int(statistics.median(f for run in setting_runs for f in run["faults"])),
            "peak_rss_mb": max(run["peak_rss_mb"] for run in setting_runs)}
    # Paired by round (neighbouring processes see the same machine load).
    speedup = statistics.median(statistics.median(release["seconds"]) / statistics.median(retain["seconds"])
                                for release, retain in zip(runs["release"], runs["retain"]))
    print()
    for setting, row in summary.items():
        print(f"{setting:<8} {row['step_seconds']:6.3f} s/step  {row['faults_per_step']:>7} faults/step "
              f"({row['faults_per_step'] * resource.getpagesize() / 1e9:.2f} GB touched afresh)  "
              f"peak RSS {row['peak_rss_mb']} MB")
    print(f"retain / release speed-up (median of paired rounds): {speedup:.3f}x")
    print(json.dumps({"benchmark": "host_memory", "cpu": cpu_name(), "cores": os.cpu_count(),
                      "model": f"BERT L{args.layers} seq 128, micro-batch 8 x GA 2", "precision": args.precision,
                      "backend": args.backend, "variants": summary, "retain_speedup": round(speedup, 3)}), flush=True)


if __name__ == "__main__":
    main()
