"""Peak host memory (RSS) of BERT-base training: openpop eager and compiled against the hand-written
PyTorch loop, and a 4-stage pipelined BERT-base with and without recomputation.

    python benchmarks/memory.py [--layers 12] [--micro-batch 8] [--gradient-accumulation 2] [--steps 3]
        [--variants hand eager compiled pipelined pipelined_recompute]

Each variant runs in a fresh process (the peak resident set size of a process, ``ru_maxrss``, only
grows): build the model (openpop-bert's PipelinedBertForPretraining, the same config as
``bert_throughput.py``), then ``--steps`` training steps of the same random batches, LAMB without bias
correction, fp32. Printed: each variant's peak RSS, what it was before the first step (torch,
model, optimizer, data), and the ratios to the hand-written loop. The pipelined variants place the
embedding and three encoder layers on each of four virtual IPUs (``layers_per_ipu`` 3,3,3,3) with
gradient accumulation 12 and micro-batches of 2; their ratio is recomputation on / off.
Target: openpop eager and compiled peak RSS <= 1.1x the hand-written loop's.
"""
import argparse
import json
import os
import resource
import subprocess
import sys

VARIANTS = ("hand", "eager", "compiled", "pipelined", "pipelined_recompute")
TARGET_VS_HAND = 1.1


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # (kilobytes on Linux)


def _current_mib() -> float:
    with open("/proc/self/statm") as stream:
        return int(stream.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def worker(args) -> dict:
    """One variant in this process; returns its memory figures."""
    import torch
    from bert_throughput import HandWritten, OpenPop, make_batches, make_bench_config

    from openpop.bert.model import PipelinedBertForPretraining
    from openpop.bert.optimization import get_optimizer

    torch.manual_seed(0)
    config = make_bench_config(args)
    if args.worker.startswith("pipelined"):
        config = config.replace(ipus_per_replica=4, layers_per_ipu=[args.layers // 4] * 4, micro_batch_size=2,
                                gradient_accumulation=12, recomputation=args.worker.endswith("recompute"))
    model = PipelinedBertForPretraining(config)
    model.train()
    optimizer = get_optimizer(config, model)
    batches = make_batches(config, args.steps)
    if args.worker == "hand":
        runner = HandWritten(model, optimizer, config, "fp32")
    else:
        backend = "compiled" if args.worker == "compiled" else "eager"
        runner = OpenPop(model, optimizer, config, "fp32", batches[0], backend=backend)
    before = _current_mib()
    for batch in batches:
        runner.step(batch)
    return {"variant": args.worker, "peak_rss_mib": _peak_mib(), "rss_before_steps_mib": before,
            "rss_after_steps_mib": _current_mib()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--gradient-accumulation", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--dropout", type=float, default=None)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    results = {}
    for variant in args.variants:
        command = [sys.executable, os.path.abspath(__file__), "--worker", variant, "--layers", str(args.layers),
                   "--micro-batch", str(args.micro_batch), "--gradient-accumulation", str(args.gradient_accumulation),
                   "--steps", str(args.steps)] + ([] if args.dropout is None else ["--dropout", str(args.dropout)])
        done = subprocess.run(command, capture_output=True, text=True, cwd=os.path.dirname(os.path.abspath(__file__)))
        if done.returncode != 0:
            raise SystemExit(f"{variant} failed:\n{done.stderr[-4000:]}")
        results[variant] = json.loads(done.stdout.strip().splitlines()[-1])
        r = results[variant]
        print(f"{variant:<22} peak {r['peak_rss_mib']:>8.0f} MiB   "
              f"before the steps {r['rss_before_steps_mib']:>8.0f} MiB", flush=True)
    record = {"benchmark": "memory", "layers": args.layers, "micro_batch": args.micro_batch,
              "gradient_accumulation": args.gradient_accumulation, "steps": args.steps,
              "peak_rss_mib": {k: v["peak_rss_mib"] for k, v in results.items()}}
    hand = results.get("hand", {}).get("peak_rss_mib")
    if hand:
        for name in ("eager", "compiled"):
            if name in results:
                record[f"{name}_peak_rss_vs_hand"] = results[name]["peak_rss_mib"] / hand
                print(f"{name} / hand-written loop: {record[f'{name}_peak_rss_vs_hand']:.3f}x "
                      f"(target <= {TARGET_VS_HAND})")
        record["peak_rss_vs_hand"] = max(record.get("eager_peak_rss_vs_hand", 0.0),
                                         record.get("compiled_peak_rss_vs_hand", 0.0)) or None
    if "pipelined" in results and "pipelined_recompute" in results:
        peaks = record["peak_rss_mib"]
        record["recompute_vs_not"] = peaks["pipelined_recompute"] / peaks["pipelined"]
        print(f"pipelined, recomputation on / off: {record['recompute_vs_not']:.3f}x")
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
