"""Compile BERT's repeated encoder layer once: what torch 2.13 allows, and what it would buy.

    python benchmarks/bert_regional.py [--layers 2] [--rounds 4] [--precisions fp32 bf16]

1. Hierarchical compilation inside the compiled backend's program: a tiny model with a
   ``ModuleList`` of identical layers whose forward is marked ``torch.compiler.nested_compile_region``
   (so Dynamo would trace it once and Inductor compile it once, ``invoke_subgraph``), compiled
   the way ``runtime/compiled/program.py`` compiles a step - ``torch.func.grad`` through
   ``torch.func.functional_call``, with and without a ``while_loop`` around it - and, for
   reference, a forward-only program. Prints which compile (Dynamo's error otherwise).
2. Regional compilation (torch's recipe) as the alternative: openpop's eager host call with the
   encoder layer's forward ``torch.compile``d once and shared by every layer (dropout masks kept
   as eager's with ``fallback_random``), against openpop eager on the same weights and data:
   the compile time of the layer (forward and backward, a fresh Inductor cache) and the
   per-round step-time ratio (interleaved rounds, median) in wall time and in this process's
   CPU time (steadier on a shared machine), per precision.

The decision these numbers supported is the compiled unit "regions" (docs/guides/compiled-backend.md,
"Program or regions").
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
from bert_throughput import OpenPop, machine_info, make_batches, make_bench_config


# --------------------------------------------------------------------------- 1. nested regions
class _Layer(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.inner = torch.nn.Linear(width, width)
        self.outer = torch.nn.Linear(width, width)

    def forward(self, x):
        return x + self.outer(torch.nn.functional.gelu(self.inner(x)))


class _Stack(torch.nn.Module):
    def __init__(self, width=8, depth=3):
        super().__init__()
        self.layers = torch.nn.ModuleList(_Layer(width) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x.pow(2).mean()


def nested_region_support():
    """{program shape: "ok" or Dynamo's error} for region-marked layers inside compiled programs."""
    from torch._higher_order_ops import while_loop
    from torch.func import functional_call

    model = _Stack()
    region = torch.compiler.nested_compile_region(lambda layer, x: _Layer.forward(layer, x))
    for layer in model.layers:
        layer.forward = region.__get__(layer)
    names = [n for n, _ in model.named_parameters()]
    params = [p.detach() for p in model.parameters()]
    data = torch.randn(2, 4, 8)

    def loss(ps, x):
        return functional_call(model, dict(zip(names, ps)), (x,))

    def step(ps, x):
        return [p - 0.1 * g for p, g in zip(ps, torch.func.grad(loss)(ps, x))]

    def shifted(ps, x):  # forward only: every parameter moved by the loss
        return [p - 0.1 * loss(ps, x) for p in ps]

    def looped(update):
        def program(ps, xs):
            def body(i, *carried):
                return (i + 1, *update(list(carried), xs.index_select(0, i.reshape(1))[0]))
            return while_loop(lambda i, *carried: i < xs.shape[0], body, (torch.tensor(0), *ps))[1:]
        return program

    programs = {"forward only": lambda ps, xs: loss(ps, xs[0]),
                "forward only inside while_loop": looped(shifted),
                "torch.func.grad + functional_call": lambda ps, xs: step(ps, xs[0]),
                "torch.func.grad inside while_loop": looped(step)}
    support = {}
    for name, program in programs.items():
        torch._dynamo.reset()
        try:
            with torch.no_grad():
                torch.compile(program, fullgraph=True, dynamic=False)(params, data)
            support[name] = "ok"
        except Exception as exc:  # Dynamo's errors have many types
            support[name] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"
    return support


# --------------------------------------------------------------------------- 2. regional compile
def build(config, precision, batch, regional):
    from openpop.bert.model import PipelinedBertForPretraining
    from openpop.bert.optimization import get_optimizer
    torch.manual_seed(0)
    model = PipelinedBertForPretraining(config).parallelize(lambda line: None).train()
    if regional:
        layers = model.bert.encoder.layer
        shared = torch.compile(type(layers[0]).forward, fullgraph=True, dynamic=False,
                               options={"fallback_random": True})
        for layer in layers:
            layer.forward = shared.__get__(layer)
    return OpenPop(model, get_optimizer(config, model), config, precision, batch)


def regional_vs_eager(args, precision):
    config = make_bench_config(args)
    batches = make_batches(config, 2)
    variants, first = {}, {}
    for kind in ("eager", "regional"):
        variants[kind] = build(config, precision, batches[0], regional=kind == "regional")
        torch.manual_seed(1)
        started = time.perf_counter()
        loss = float(variants[kind].step(batches[0]))  # the regional variant compiles here
        first[kind] = (time.perf_counter() - started, loss)
    seconds = {kind: [] for kind in variants}
    cpu = {kind: [] for kind in variants}
    for round_index in range(args.rounds):
        order = list(variants) if round_index % 2 == 0 else list(reversed(variants))
        for kind in order:
            started, started_cpu = time.perf_counter(), time.process_time()
            float(variants[kind].step(batches[round_index % 2]))
            seconds[kind].append(time.perf_counter() - started)
            cpu[kind].append(time.process_time() - started_cpu)
        print(f"  {precision} round {round_index}: " + "  ".join(
            f"{k} {seconds[k][-1]:.2f} s ({cpu[k][-1]:.2f} CPU-s)" for k in variants)
            + f"  (load {os.getloadavg()[0]:.1f})", flush=True)
    ratio = statistics.median(e / r for e, r in zip(seconds["eager"], seconds["regional"]))
    cpu_ratio = statistics.median(e / r for e, r in zip(cpu["eager"], cpu["regional"]))
    return {"layer_compile_seconds": round(first["regional"][0] - min(seconds["regional"]), 1),
            "first_losses": [first["eager"][1], first["regional"][1]],
            "regional_vs_eager": round(ratio, 3), "regional_vs_eager_cpu_time": round(cpu_ratio, 3)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--precisions", nargs="+", default=["fp32"], choices=["fp32", "bf16"])
    args = parser.parse_args()
    args.micro_batch, args.gradient_accumulation, args.dropout = 8, 2, None
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="openpop-regional-")  # a first compile
    support = nested_region_support()
    for name, outcome in support.items():
        print(f"nested_compile_region, {name}: {outcome}", flush=True)
    results = {}
    for precision in args.precisions:
        results[precision] = regional_vs_eager(args, precision)
        r = results[precision]
        print(f"regional compile ({precision}, L{args.layers}): layer compiled in ~{r['layer_compile_seconds']} s, "
              f"step time eager / regional {r['regional_vs_eager']:.3f}x wall, "
              f"{r['regional_vs_eager_cpu_time']:.3f}x CPU time (medians of rounds); first losses "
              f"{r['first_losses'][0]:.6f} / {r['first_losses'][1]:.6f}", flush=True)
    print(json.dumps({"benchmark": "bert_regional", "machine": machine_info(), "layers": args.layers,
                      "torch": torch.__version__, "nested_compile_region": support, "results": results,
                      "load": round(os.getloadavg()[0], 1)}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
