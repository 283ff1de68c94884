"""Do eager steps get slower once another model in the same process has compiled and run (issue 32)?

Two identical worker processes each train a tiny MLP by openpop's eager backend
(``deviceIterations(16)``) and by a hand-written PyTorch loop (16 steps), and time the optimizer's
``step()`` alone; they take turns at rounds of these (never at once). Then one of them, the
subject, compiles a copy of the MLP on openpop's compiled backend (executable cache off, so
``torch.compile`` really runs) and runs two host calls; the other, the control, compiles nothing;
then the same rounds again. Each figure is the best round's CPU time per call of the worker's
thread (``time.thread_time``). ``after_vs_before`` is the subject's after / before;
``control_after_vs_before`` the control's, which moved only with the machine's load; ``ratio``,
the figure the target reads, is the first divided by the second. The Python frames and C
functions one call runs are counted in the subject before and after the compile.

What a compile leaves, both torch's: (1) every call of a ``torch.compile``d function allocates the
thread's functorch state, which the autograd engine then copies about three times per node of every
backward (~1 % of this MLP's eager step); openpop drops it after its compiled host calls
(``src/openpop/runtime/compiled/functorch_state.py``). (2) The first ``torch.compile`` in a process
runs Dynamo's ``TorchPatcher.patch()`` (``torch/_dynamo/eval_frame.py``), which wraps every
``torch.optim`` class's ``_init_group`` in ``torch._dynamo.disable``: each ``optimizer.step()``
then runs Dynamo's disable wrapper once per parameter group (four ``set_eval_frame`` calls, a
``getattr``, ``_callback_from_stance``, ``torch.compiler.is_exporting``), ~0.6 us a step for the
rest of the process, in every eager loop - the calls counted below differ by that wrapper only.

    python benchmarks/eager_after_compile.py [--rounds 8] [--calls 20]

Prints microseconds per call before and after, the ratios, the calls that differ, then one JSON line.
"""
import argparse
import gc
import json
import multiprocessing
import os
import sys
import time

import torch
from _models import MLP

import poptorch
from openpop.runtime.compiled import functorch_state

# The call counter the tests use (tests/helpers/call_counts.py), shared rather than copied.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests"))
from helpers.call_counts import calls_made

DEVICE_ITERATIONS = 16
MICRO_BATCH = 32


def training_model(backend):
    torch.manual_seed(0)
    model = MLP()
    options = poptorch.Options().deviceIterations(DEVICE_ITERATIONS).openpopBackend(backend)
    options.showCompilationProgressBar(False).enableExecutableCaching(None)
    return poptorch.trainingModel(model, options, torch.optim.SGD(model.parameters(), lr=0.01))


def init_group_wrapped() -> bool:
    """Whether torch's once-per-process patch (``TorchPatcher.patch``) has wrapped SGD's ``_init_group``."""
    return bool(getattr(torch.optim.SGD.__dict__["_init_group"], "_torchdynamo_disable", False))


def variants(xs, ys):
    """name -> (a call, how many times one round makes it)."""
    eager = training_model("eager")
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = xs[:MICRO_BATCH], ys[:MICRO_BATCH]

    def loop():
        for _ in range(DEVICE_ITERATIONS):
            optimizer.zero_grad()
            model(x, y)[1].backward()
            optimizer.step()

    loop()  # the optimizer step alone, on the gradients the loop leaves
    return {"openpop_eager": (lambda: eager(xs, ys), 1), "plain_loop": (loop, 1),
            "optimizer_step": (optimizer.step, 100)}


def one_round(calls, repeats):
    """name -> microseconds of this thread's CPU time per call."""
    times = {}
    for name, (call, per) in calls.items():
        started = time.thread_time()
        for _ in range(repeats * per):
            call()
        times[name] = (time.thread_time() - started) / (repeats * per) * 1e6
    return times


def counted(calls):
    """name -> Counter of the Python frames and C functions one call runs; the second of two
    calls (the first after a compile may fill a cache the compile evicted: typing's, e.g.)."""
    counts = {}
    for name, (call, _) in calls.items():
        calls_made(call, c_functions=True)
        counts[name] = calls_made(call, c_functions=True)
    return counts


def worker(connection, repeats):
    """One process of the pair: builds the variants, then answers the parent's requests."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    xs = torch.randn(DEVICE_ITERATIONS * MICRO_BATCH, 32)
    ys = torch.randn(DEVICE_ITERATIONS * MICRO_BATCH, 1)
    calls, kept = variants(xs, ys), []
    for call, per in calls.values():  # warm-up
        for _ in range(5 * per):
            call()
    while True:
        request = connection.recv()
        if request == "round":
            connection.send(one_round(calls, repeats))
        elif request == "count":
            connection.send((init_group_wrapped(), functorch_state.present(), counted(calls)))
        elif request == "compile":
            gc.collect()
            started = time.perf_counter()
            compiled = training_model("compiled")
            compiled(xs, ys)
            compiled(xs, ys)
            seconds = time.perf_counter() - started
            kept.append(compiled)  # alive, as a user's would be
            gc.collect()
            connection.send((compiled._dispatch.compiled.last, seconds))
        else:
            return


def python_and_c(counter) -> str:
    """``"<Python frames>/<C functions>"`` in a count of ``calls_made``."""
    python = sum(v for k, v in counter.items() if k[0] != "C")
    return f"{python}/{sum(counter.values()) - python}"


def best(rounds, name):
    return min(r[name] for r in rounds)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=20, help="calls per variant per round")
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    pipes, processes = {}, []
    for role in ("subject", "control"):
        parent_end, child_end = context.Pipe()
        process = context.Process(target=worker, args=(child_end, args.calls), daemon=True)
        process.start()
        pipes[role] = parent_end
        processes.append(process)

    def ask(role, request):
        pipes[role].send(request)
        return pipes[role].recv()

    def phase():
        """role -> the rounds; the two processes take turns (never at once), first one then the other."""
        rounds = {"subject": [], "control": []}
        for index in range(args.rounds):
            for role in (("subject", "control") if index % 2 == 0 else ("control", "subject")):
                rounds[role].append(ask(role, "round"))
        return rounds

    wrapped_before, functorch_before, counts_before = ask("subject", "count")
    before = phase()
    backend, compile_seconds = ask("subject", "compile")
    wrapped_after, functorch_after, counts_after = ask("subject", "count")
    after = phase()
    for role in pipes:
        pipes[role].send("quit")
    for process in processes:
        process.join(timeout=30)

    names = list(counts_before)
    us = {when: {name: best(rounds["subject"], name) for name in names} for when, rounds in
          (("before", before), ("after", after))}
    control = {when: {name: best(rounds["control"], name) for name in names} for when, rounds in
               (("before", before), ("after", after))}
    raw = {name: us["after"][name] / us["before"][name] for name in names}
    drift = {name: control["after"][name] / control["before"][name] for name in names}
    ratio = {name: raw[name] / drift[name] for name in names}
    added = {name: dict(counts_after[name] - counts_before[name]) for name in names}
    removed = {name: dict(counts_before[name] - counts_after[name]) for name in names}

    print(f"the subject process compiled a copy on the {backend} backend and ran it ({compile_seconds:.1f} s); "
          f"torch's _init_group wrapper: before {wrapped_before}, after {wrapped_after}; the thread's functorch "
          f"state: before {functorch_before}, after {functorch_after}")
    print(f"{'variant':<16}{'us before':>11}{'us after':>11}{'after/before':>14}{'control':>9}{'ratio':>8}"
          f"{'py/C calls before':>19}{'after':>12}")
    for name in names:
        print(f"{name:<16}{us['before'][name]:>11.2f}{us['after'][name]:>11.2f}{raw[name]:>14.3f}"
              f"{drift[name]:>9.3f}{ratio[name]:>8.3f}"
              f"{python_and_c(counts_before[name]):>19}{python_and_c(counts_after[name]):>12}")
    print("(control: the same rounds' after/before in a process that compiled nothing; ratio: after/before "
          "divided by it)")
    for name in names:
        if added[name] or removed[name]:
            print(f"{name}: calls added {added[name]}, removed {removed[name]}")
    print(json.dumps({"benchmark": "eager_after_compile", "clock": "thread", "rounds": args.rounds,
                      "device_iterations": DEVICE_ITERATIONS, "compiled_backend": backend,
                      "us_before": us["before"], "us_after": us["after"], "after_vs_before": raw,
                      "control_after_vs_before": drift, "ratio": ratio,
                      "worst_step_ratio": max(ratio["openpop_eager"], ratio["plain_loop"]),
                      "calls_added": {k: {"/".join(n): c for n, c in v.items()} for k, v in added.items()},
                      "calls_removed": {k: {"/".join(n): c for n, c in v.items()} for k, v in removed.items()},
                      "init_group_wrapped": {"before": wrapped_before, "after": wrapped_after},
                      "functorch_state": {"before": functorch_before, "after": functorch_after},
                      "compile_seconds": compile_seconds}))


if __name__ == "__main__":
    main()
