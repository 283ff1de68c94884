"""Host overhead per training step: a tiny MLP trained by a hand-written eager loop vs openpop
with device_iterations 1, 16 and 256 on the eager and the compiled backend
(``Options.openpopBackend``), and a hand-written ``torch.compile``d step as the anchor, measured
side by side in this run (compiled programs are built before the timing; their first-call
seconds are printed). The ``GA=`` rows accumulate each step's gradients over ``--accumulation``
micro-batches of ``micro-batch / accumulation`` samples (the same samples per step; the compiled
program runs them as a ``while_loop``, ``runtime/compiled/micro_batches.py``). The ``no rollback``
rows run the same with ``Training.rollbackFailedCalls(False)``: their ratio to the default rows
is what making a failed host call roll back costs (``runtime/transaction.py``).

    python benchmarks/host_overhead.py [--steps 2048] [--clock cpu] [--accumulation 4]
        [--bert-steps 64] [--bert-micro-batch 2]

The ``CNN`` rows train a small CNN with BatchNorm and dropout (buffers written in forward, random
masks drawn in the program) with a batch of 16 8x8 images per step: its own eager loop, the same
loop with ``torch.compile(model)`` (the optimizer eager, as a user would write it), and openpop's
compiled backend at DI=64; their ratios are to the CNN's eager loop. ``CNN convolutions alone`` is
a floor under every CNN row: its step's four convolution calls (two forwards, two
``convolution_backward``) run by aten on their own at the step's shapes, in the faster of the two
memory formats (contiguous; channels-last, which Inductor gives the program's convolutions on CPU).
Every variant, eager or compiled, calls these same oneDNN kernels, so no host-side saving takes a
row below that ratio.

The ``BERT-tiny`` rows (``--bert-steps 0`` leaves them out) train openpop-bert's
``PipelinedBertForPretraining`` with its MLM + NSP loss in the ``demo_tiny_128`` config (3 layers,
hidden 64, sequence 128, 20 masked tokens, dropout 0.1; one IPU, no gradient accumulation, loss
scaling 1) and its optimizer (AdamW without bias correction, ``openpop.bert.optimization``) on
generated tokens, ``--bert-micro-batch`` samples per step: the user's eager loop, the same loop
with ``torch.compile(model, fullgraph=True)`` and ``torch.compile(optimizer.step)`` (the peer: the
compiled optimizer step is torch's recipe; fullgraph falls back to graph breaks if Dynamo refuses),
and openpop-bert's own options (``openpop.bert.train.get_options``) at DI=16 on the eager and the
compiled backend. Their ratios are to the BERT eager loop and to the hand-compiled loop.

``--clock cpu`` times with this process's CPU time instead of wall time: on a machine shared with
other jobs (one torch thread here) it counts the work done, not the time spent waiting for a core.
Prints a table of microseconds per optimizer step and ratios to the eager loop, then one JSON line.
"""
import argparse
import copy
import json
import time

import torch
from _models import MLP

import poptorch
from openpop.bert.config import make_config
from openpop.bert.model import PipelinedBertForPretraining
from openpop.bert.optimization import get_optimizer
from openpop.bert.train import get_options


class CNN(torch.nn.Module):
    """Two conv-BatchNorm-ReLU layers, dropout, pooling and a linear head."""

    def __init__(self, channels=8):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, channels, 3, padding=1), torch.nn.BatchNorm2d(channels), torch.nn.ReLU(),
            torch.nn.Dropout(0.1),
            torch.nn.Conv2d(channels, channels, 3, padding=1), torch.nn.BatchNorm2d(channels), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
        self.head = torch.nn.Linear(channels, 10)

    def forward(self, x, y):
        out = self.head(self.body(x))
        return out, torch.nn.functional.cross_entropy(out, y)


CLOCK = time.perf_counter


def add_timing_args(parser, steps):
    """The options of the benchmarks timing a tiny MLP's steps (this one, ``compiled_state.py``)."""
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")


def use_timing_args(args):
    """``--clock`` picks this module's ``CLOCK``; one torch thread."""
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(1)


def eager_loop(model, xs, ys, steps, micro, compiled=False):
    """The user's own loop; ``compiled``: with ``torch.compile(model)`` (built before the timing)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if compiled:
        model = torch.compile(model)
        for _ in range(2):  # compile (and a recompile for the second call's state) outside the timing
            model(xs[:micro], ys[:micro])[1].backward()
        optimizer.zero_grad(set_to_none=True)
    start = CLOCK()
    for i in range(steps):
        x, y = xs[i * micro:(i + 1) * micro], ys[i * micro:(i + 1) * micro]
        optimizer.zero_grad(set_to_none=True)
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
    return (CLOCK() - start) / steps


def convolution_floor(cnn, images, steps, micro):
    """Time ``steps`` x the CNN step's convolution calls alone (module docstring), in each memory
    format; returns the faster format's seconds per step. The arguments are built before the
    timing and each format runs once untimed (oneDNN sets its kernels up on a first call)."""
    first, second = (m for m in cnn.modules() if isinstance(m, torch.nn.Conv2d))
    x = images[:micro]
    hidden = torch.randn(micro, second.in_channels, *x.shape[2:]).relu()  # as the ReLU after the first layer
    best = float("inf")
    backward = torch.ops.aten.convolution_backward.default
    for layout in (torch.contiguous_format, torch.channels_last):
        calls = []
        for inp, conv, mask in ((x, first, [False, True, True]), (hidden, second, [True, True, True])):
            inp = inp.contiguous(memory_format=layout)
            weight, bias = conv.weight.detach().contiguous(memory_format=layout), conv.bias.detach()
            grad = torch.randn(micro, conv.out_channels, *x.shape[2:]).contiguous(memory_format=layout)
            forward_args = (inp, weight, bias, conv.stride, conv.padding)
            backward_args = (grad, inp, weight, [conv.out_channels], list(conv.stride), list(conv.padding),
                             list(conv.dilation), False, [0, 0], 1, mask)
            calls.append((forward_args, backward_args))

        def run(count, calls=calls):
            for _ in range(count):
                for forward_args, backward_args in calls:
                    torch.nn.functional.conv2d(*forward_args)
                    backward(*backward_args)
        run(1)
        start = CLOCK()
        run(steps)
        best = min(best, (CLOCK() - start) / steps)
    return best


def hand_compiled_loop(model, xs, ys, steps, micro):
    """The anchor: a hand-written functional training step (``torch.func.grad`` + SGD in place)
    compiled by ``torch.compile``, called once per step. Returns a function timing ``steps``."""
    params = {name: p.detach() for name, p in model.named_parameters()}

    def loss_of(ps, x, y):
        return torch.func.functional_call(model, ps, (x, y))[1]

    @torch.compile(fullgraph=True, dynamic=False)
    def step(ps, x, y):
        grads = torch.func.grad(loss_of)(ps, x, y)
        for name, p in ps.items():
            p.sub_(grads[name] * 0.01)

    step(params, xs[:micro], ys[:micro])  # compile outside the timing

    def timed():
        start = CLOCK()
        for i in range(steps):
            step(params, xs[i * micro:(i + 1) * micro], ys[i * micro:(i + 1) * micro])
        return (CLOCK() - start) / steps
    return timed


def openpop_loop(model, xs, ys, steps, micro, device_iterations, rollback=True, backend="eager", accumulation=1):
    """Build (and for the compiled backend compile, outside the timing) a training model; a step
    takes ``micro`` samples as ``accumulation`` micro-batches. Returns a function timing ``steps``
    optimizer steps and the seconds the build took."""
    opts = poptorch.Options().deviceIterations(device_iterations).openpopBackend(backend)
    opts.Training.gradientAccumulation(accumulation)
    opts.showCompilationProgressBar(False)
    opts.Training.rollbackFailedCalls(rollback)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.01))
    per_call = micro * device_iterations
    started = time.perf_counter()
    training.compile(xs[:per_call], ys[:per_call])
    if backend == "compiled":
        training(xs[:per_call], ys[:per_call])  # torch.compile runs on the first call
    build_seconds = time.perf_counter() - started
    calls = steps // device_iterations

    def timed():
        start = CLOCK()
        for i in range(calls):
            training(xs[i * per_call:(i + 1) * per_call], ys[i * per_call:(i + 1) * per_call])
        return (CLOCK() - start) / (calls * device_iterations)
    return timed, build_seconds


ROWS = (("eager", "eager PyTorch loop"), ("di1", "openpop DI=1"),
        ("di1_no_rollback", "openpop DI=1 no rollback"), ("di16", "openpop DI=16"),
        ("di16_no_rollback", "openpop DI=16 no rollback"), ("di256", "openpop DI=256"),
        ("compiled_di1", "openpop compiled DI=1"), ("compiled_di16", "openpop compiled DI=16"),
        ("compiled_di256", "openpop compiled DI=256"), ("hand_compiled", "hand torch.compile step"),
        ("di16_ga", "openpop DI=16 GA={}"), ("compiled_di1_ga", "openpop compiled DI=1 GA={}"),
        ("compiled_di16_ga", "openpop compiled DI=16 GA={}"))
CNN_ROWS = (("cnn_eager", "CNN eager PyTorch loop"), ("cnn_hand_compiled", "CNN loop, torch.compile(model)"),
            ("cnn_di64", "CNN openpop DI=64"), ("cnn_compiled_di64", "CNN openpop compiled DI=64"),
            ("cnn_convolutions", "CNN convolutions alone"))
CNN_MICRO = 16
BERT_ROWS = (("bert_eager", "BERT-tiny eager PyTorch loop"), ("bert_hand_compiled", "BERT-tiny loop, torch.compile"),
             ("bert_di16", "BERT-tiny openpop DI=16"), ("bert_compiled_di16", "BERT-tiny openpop compiled DI=16"))
BERT_DI = 16


def bert_config(micro):
    """openpop-bert's ``demo_tiny_128`` on one IPU, one micro-batch per step, DI=16, loss scaling 1."""
    return make_config("demo_tiny_128", micro_batch_size=micro, gradient_accumulation=1,
                       device_iterations=BERT_DI, replication_factor=1, ipus_per_replica=1, layers_per_ipu=[3],
                       loss_scaling=1.0, precision="fp32", threads=1)


def bert_data(config, samples, seed=0):
    """Generated pretraining inputs of ``samples`` rows: tokens, attention mask, token types, the
    masked positions and their labels, the NSP label (``PipelinedBertForPretraining``'s order)."""
    generator = torch.Generator().manual_seed(seed)
    length, masked = config.sequence_length, config.mask_tokens
    return [torch.randint(5, config.vocab_size, (samples, length), generator=generator),
            torch.ones(samples, length, dtype=torch.long),
            (torch.arange(length) >= length // 2).long().expand(samples, -1).contiguous(),
            torch.randint(0, length, (samples, masked), generator=generator),
            torch.randint(5, config.vocab_size, (samples, masked), generator=generator),
            torch.randint(0, 2, (samples, 1), generator=generator)]


def bert_model(config):
    torch.manual_seed(0)  # every variant starts from the same weights
    return PipelinedBertForPretraining(config).parallelize(lambda line: None).train()


def bert_hand_loop(config, data, steps, compiled=False):
    """The user's loop: forward, ``loss.backward()``, ``optimizer.step()``, ``zero_grad``, one
    micro-batch per step. ``compiled``: the model under ``torch.compile(fullgraph=True)`` (graph
    breaks allowed if Dynamo refuses it whole) and the optimizer step under ``torch.compile``,
    both compiled outside the timing. Returns a function timing ``steps`` and the mode used."""
    model = bert_model(config)
    optimizer = get_optimizer(config, model)
    micro = config.micro_batch_size
    run_model, optimizer_step, mode = model, optimizer.step, "eager"
    if compiled:
        optimizer_step = torch.compile(optimizer.step)
        for fullgraph in (True, False):
            run_model = torch.compile(model, fullgraph=fullgraph)
            try:
                for i in range(2):  # compile; the second step's optimizer state recompiles the step
                    run_model(*[t[i * micro:(i + 1) * micro] for t in data])[0].backward()
                    optimizer_step()
                    optimizer.zero_grad(set_to_none=True)
                mode = "fullgraph" if fullgraph else "graph breaks"
                break
            except Exception:  # Dynamo refused the whole graph: the user's next try allows breaks
                if not fullgraph:
                    raise
                optimizer.zero_grad(set_to_none=True)
                torch._dynamo.reset()
                optimizer_step = torch.compile(optimizer.step)

    def timed():
        start = CLOCK()
        for i in range(steps):
            loss = run_model(*[t[i * micro:(i + 1) * micro] for t in data])[0]
            loss.backward()
            optimizer_step()
            optimizer.zero_grad(set_to_none=True)
        return (CLOCK() - start) / steps
    return timed, mode


def bert_openpop_loop(config, data, steps, backend):
    """openpop-bert's options (``get_options``) on ``backend`` at DI=16; compiled (and, for the
    compiled backend, run once) outside the timing. Returns a function timing ``steps`` and the
    seconds the build took."""
    model = bert_model(config)
    opts = get_options(config).openpopBackend(backend)
    opts.showCompilationProgressBar(False)
    training = poptorch.trainingModel(model, opts, get_optimizer(config, model))
    per_call = config.micro_batch_size * BERT_DI
    started = time.perf_counter()
    training.compile(*[t[:per_call] for t in data])
    if backend == "compiled":
        training(*[t[:per_call] for t in data])
    build_seconds = time.perf_counter() - started

    def timed():
        start = CLOCK()
        for c in range(steps // BERT_DI):
            training(*[t[c * per_call:(c + 1) * per_call] for t in data])
        return (CLOCK() - start) / (steps // BERT_DI * BERT_DI)
    return timed, build_seconds


def main():
    parser = argparse.ArgumentParser()
    add_timing_args(parser, steps=2048)
    parser.add_argument("--accumulation", type=int, default=4, help="micro-batches per step of the GA rows")
    parser.add_argument("--bert-steps", type=int, default=64,
                        help="optimizer steps per round of the BERT-tiny rows (a multiple of 16; 0: no BERT rows)")
    parser.add_argument("--bert-micro-batch", type=int, default=2, help="samples per step of the BERT-tiny rows")
    args = parser.parse_args()
    use_timing_args(args)
    torch.manual_seed(0)
    base = MLP()
    xs = torch.randn(args.steps * args.micro_batch, 32)
    ys = torch.randn(args.steps * args.micro_batch, 1)

    variants = {"di1": (1, True, "eager"), "di1_no_rollback": (1, False, "eager"), "di16": (16, True, "eager"),
                "di16_no_rollback": (16, False, "eager"), "di256": (256, True, "eager"),
                "compiled_di1": (1, True, "compiled"), "compiled_di16": (16, True, "compiled"),
                "compiled_di256": (256, True, "compiled"), "di16_ga": (16, True, "eager"),
                "compiled_di1_ga": (1, True, "compiled"), "compiled_di16_ga": (16, True, "compiled")}
    timers, compile_seconds = {}, {}
    for name, (di, rollback, backend) in variants.items():  # built once: compiled programs are reused
        accumulation = args.accumulation if name.endswith("_ga") else 1
        timers[name], seconds = openpop_loop(copy.deepcopy(base), xs, ys, args.steps, args.micro_batch, di,
                                             rollback, backend, accumulation)
        if backend == "compiled":
            compile_seconds[name] = seconds
    timers["hand_compiled"] = hand_compiled_loop(copy.deepcopy(base), xs, ys, args.steps, args.micro_batch)
    cnn = CNN()
    cnn_steps = args.steps // 4 // 64 * 64
    images = torch.randn(cnn_steps * CNN_MICRO, 3, 8, 8)
    labels = torch.randint(0, 10, (cnn_steps * CNN_MICRO,))
    for name, backend in (("cnn_di64", "eager"), ("cnn_compiled_di64", "compiled")):
        timers[name], seconds = openpop_loop(copy.deepcopy(cnn), images, labels, cnn_steps, CNN_MICRO, 64,
                                             backend=backend)
        if backend == "compiled":
            compile_seconds[name] = seconds
    hand_cnn = copy.deepcopy(cnn)
    timers["cnn_hand_compiled"] = lambda: eager_loop(hand_cnn, images, labels, cnn_steps, CNN_MICRO, compiled=True)
    timers["cnn_convolutions"] = lambda: convolution_floor(cnn, images, cnn_steps, CNN_MICRO)
    bert_steps, bert_mode = args.bert_steps // BERT_DI * BERT_DI, None
    if bert_steps:
        config = bert_config(args.bert_micro_batch)
        tokens = bert_data(config, bert_steps * config.micro_batch_size)
        timers["bert_eager"], _ = bert_hand_loop(config, tokens, bert_steps)
        started = time.perf_counter()
        timers["bert_hand_compiled"], bert_mode = bert_hand_loop(config, tokens, bert_steps, compiled=True)
        compile_seconds["bert_hand_compiled"] = time.perf_counter() - started
        for name, backend in (("bert_di16", "eager"), ("bert_compiled_di16", "compiled")):
            timers[name], seconds = bert_openpop_loop(config, tokens, bert_steps, backend)
            if backend == "compiled":
                compile_seconds[name] = seconds
    results = {"eager": [], "cnn_eager": [], **{name: [] for name in timers}}
    for _ in range(args.repeats):  # interleaved, best of N, so machine load hits all alike
        results["eager"].append(eager_loop(copy.deepcopy(base), xs, ys, args.steps, args.micro_batch))
        results["cnn_eager"].append(eager_loop(copy.deepcopy(cnn), images, labels, cnn_steps, CNN_MICRO))
        for name, timed in timers.items():
            results[name].append(timed())
    best = {k: min(v) * 1e6 for k, v in results.items()}
    cnn_ratio = {k: best[k] / best["cnn_eager"] for k, _ in CNN_ROWS}
    print(f"{'variant':<28}{'us/step':>10}{'vs eager':>10}")
    for key, label in ROWS:
        print(f"{label.format(args.accumulation):<28}{best[key]:>10.1f}{best[key] / best['eager']:>9.2f}x")
    print(f"{'':<28}{'us/step':>10}{'vs CNN eager':>14}")
    for key, label in CNN_ROWS:
        print(f"{label:<30}{best[key]:>8.1f}{cnn_ratio[key]:>13.2f}x")
    bert_ratios = {}
    if bert_steps:
        bert_ratios = {"vs_eager": {k: best[k] / best["bert_eager"] for k, _ in BERT_ROWS},
                       "vs_hand_compiled": {k: best[k] / best["bert_hand_compiled"] for k, _ in BERT_ROWS}}
        print(f"{'':<34}{'us/step':>10}{'vs eager':>10}{'vs hand-compiled':>18}   (hand-compiled: {bert_mode})")
        for key, label in BERT_ROWS:
            print(f"{label:<34}{best[key]:>10.1f}{bert_ratios['vs_eager'][key]:>9.2f}x"
                  f"{bert_ratios['vs_hand_compiled'][key]:>17.2f}x")
    rollback_cost = {f"di{di}": best[f"di{di}"] / best[f"di{di}_no_rollback"] for di in (1, 16)}
    print("rollback cost (time with / without): " + ", ".join(f"{k} {v:.3f}x" for k, v in rollback_cost.items()))
    speedup = {"compiled_di256_vs_eager_loop": best["eager"] / best["compiled_di256"],
               "compiled_di1_vs_hand_compiled": best["hand_compiled"] / best["compiled_di1"]}
    print("compiled DI=256 is {:.1f}x faster than the eager loop; compiled DI=1 runs at {:.2f}x the hand-compiled "
          "step's speed; first call (compile) seconds: {}".format(
              speedup["compiled_di256_vs_eager_loop"], speedup["compiled_di1_vs_hand_compiled"],
              ", ".join(f"{k} {v:.1f}" for k, v in compile_seconds.items())))
    print(json.dumps({"benchmark": "host_overhead", "clock": args.clock, "us_per_step": best,
                      "ratio_vs_eager": {k: best[k] / best["eager"] for k in best
                                         if not k.startswith(("cnn", "bert"))},
                      "cnn_ratio_vs_eager": cnn_ratio,
                      "bert_ratio_vs_eager": bert_ratios.get("vs_eager"),
                      "bert_ratio_vs_hand_compiled": bert_ratios.get("vs_hand_compiled"),
                      "bert": bert_steps and {"config": "demo_tiny_128", "micro_batch": args.bert_micro_batch,
                                              "device_iterations": BERT_DI, "steps": bert_steps,
                                              "hand_compiled_mode": bert_mode},
                      "rollback_cost": rollback_cost, "compiled_speedup": speedup,
                      "compile_seconds": compile_seconds, "accumulation": args.accumulation}))


if __name__ == "__main__":
    main()
