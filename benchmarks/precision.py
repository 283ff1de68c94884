"""Training-step speed of a small transformer through poptorch.trainingModel: fp32 vs bf16
autocast (``opts.Precision.autocast()``), measured side by side in this run.

    python benchmarks/precision.py [--layers 4 --d-model 512 --seq 128 --batch 8 --repeats 7]

Both variants train copies of the same model on the same data with AdamW. Each repeat times
``--calls`` host calls of ``--device-iterations`` optimizer steps per variant, interleaved so
machine load hits both alike; the best repeat counts. Prints ms per optimizer step, sequences
per second, the bf16/fp32 speed ratio and each variant's last loss, then one JSON line.
"""
import argparse
import copy
import json
import time

import torch
import torch.nn.functional as F

import poptorch


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
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def make_runner(base, autocast, args):
    model = copy.deepcopy(base)
    opts = poptorch.Options().deviceIterations(args.device_iterations)
    opts.showCompilationProgressBar(False)
    if autocast:
        opts.Precision.autocast(True, torch.bfloat16)
    optimizer = poptorch.optim.AdamW(model.parameters(), lr=1e-4)
    return poptorch.trainingModel(model, opts, optimizer)


def time_calls(runner, tokens, labels, calls):
    start = time.perf_counter()
    for _ in range(calls):
        loss = runner(tokens, labels)
    return (time.perf_counter() - start) / calls, float(loss)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--device-iterations", type=int, default=1)
    parser.add_argument("--calls", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.manual_seed(0)
    base = Encoder(args.layers, args.d_model, args.heads, args.vocab, args.dropout)
    rows = args.batch * args.device_iterations
    tokens = torch.randint(0, args.vocab, (rows, args.seq))
    labels = torch.roll(tokens, 1, dims=1)

    runners = {"fp32": make_runner(base, False, args), "bf16_autocast": make_runner(base, True, args)}
    for runner in runners.values():  # compile + one warm-up call each, not timed
        runner(tokens, labels)
    seconds = {name: [] for name in runners}
    losses = {}
    for _ in range(args.repeats):
        for name, runner in runners.items():
            per_call, losses[name] = time_calls(runner, tokens, labels, args.calls)
            seconds[name].append(per_call / args.device_iterations)
    best = {name: min(values) for name, values in seconds.items()}
    ratio = best["fp32"] / best["bf16_autocast"]

    params = sum(p.numel() for p in base.parameters())
    print(f"TransformerEncoder: {args.layers} layers, d_model {args.d_model}, seq {args.seq}, batch {args.batch}, "
          f"{params / 1e6:.1f} M parameters, {torch.get_num_threads()} threads, AdamW, trainingModel")
    print(f"{'variant':<16}{'ms/step':>10}{'seq/s':>9}{'last loss':>11}")
    for name in runners:
        print(f"{name:<16}{best[name] * 1e3:>10.1f}{args.batch / best[name]:>9.1f}{losses[name]:>11.4f}")
    print(f"bf16 autocast speed-up over fp32: {ratio:.2f}x")
    print(json.dumps({"benchmark": "precision", "ms_per_step": {k: v * 1e3 for k, v in best.items()},
                      "seq_per_s": {k: args.batch / v for k, v in best.items()},
                      "speedup_bf16_autocast_vs_fp32": ratio,
                      "config": {"layers": args.layers, "d_model": args.d_model, "seq": args.seq,
                                 "batch": args.batch, "threads": torch.get_num_threads()}}))


if __name__ == "__main__":
    main()
