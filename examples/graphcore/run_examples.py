"""Run Graphcore's PyTorch tutorials and examples, unmodified, on openpop (the table in README.md).

    python examples/graphcore/run_examples.py --examples ~/src/graphcore-examples \
        [--lightning-examples ~/src/pytorch-lightning-examples] [--work /tmp/gc_run] \
        [--only basics mnist ...] [--timeout 3600] [--list]

``--examples`` is a checkout of graphcore/examples, ``--lightning-examples`` one of
graphcore/pytorch-lightning-examples. Each example's folder is copied to ``WORK/<name>`` and the
script runs there with ``HOME=WORK/home-<size>``, where ``fake_datasets.py`` has written stand-ins
for the data sets it would download (nothing is downloaded: ``HF_HUB_OFFLINE=1``). The python
running this script runs the examples, so it needs what their requirements name: tqdm,
matplotlib, scikit-learn, pillow, psutil, octconv, text-unidecode, transformers, lightning,
and an importable torchvision (see README.md for the two-line patch that makes torchvision's
wheel import beside torch 2.13, and for CIFAR-10 stand-ins, ``OPENPOP_FAKE_DATA=1``).

Prints one line per example (status, seconds, the line that decided it) and a summary. Not run in
CI: the whole table takes about an hour on 2 cores.
"""
import argparse
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))

# Stand-in data set sizes (training images, test images) per HOME.
SIZES = {"small": (2000, 500), "tiny": (240, 64), "full": (60000, 10000)}


@dataclass
class Example:
    name: str
    repo: str  # "examples" or "lightning"
    folder: str  # inside the repository
    command: tuple[str, ...]  # after "python"
    expect: str  # printed by a successful run
    size: str = "small"
    needs: Optional[str] = None  # why it can't run here; it is still run, to show the failure


PYTORCH = "tutorials/tutorials/pytorch"
FEATURES = "tutorials/feature_examples/pytorch"
APPS = "tutorials/simple_applications"
NOTEBOOK = "exec(open('walkthrough_code_only.py').read())"  # runs as in Jupyter: no __main__.__file__

EXAMPLES = [
    Example("basics", "examples", f"{PYTORCH}/basics", ("walkthrough_code_only.py",), "IPU predicted class"),
    Example("data_loading", "examples", f"{PYTORCH}/efficient_data_loading", ("tuto_data_loading.py",),
            "IPU throughput"),
    Example("data_loading_walkthrough", "examples", f"{PYTORCH}/efficient_data_loading", ("-c", NOTEBOOK),
            "Dataloader with IPU training execution time"),
    Example("mixed_precision", "examples", f"{PYTORCH}/mixed_precision", ("walkthrough_code_only.py",),
            "Eval accuracy on IPU", size="tiny"),
    Example("mixed_precision_half", "examples", f"{PYTORCH}/mixed_precision",
            ("walkthrough_code_only.py", "--execution-half", "--optimizer-half", "--stochastic-rounding",
             "--partials-half"), "Eval accuracy on IPU", size="tiny"),
    Example("observing_tensors", "examples", f"{PYTORCH}/observing_tensors", ("anchor_tensor_example.py",),
            "Saved histogram"),
    Example("pipelining", "examples", f"{PYTORCH}/pipelining",
            ("mnist_pipeline.py", "--strategy", "pipelined", "--epochs", "1", "--batch-size", "4",
             "--device-iterations", "2", "--gradient-accumulation", "8", "--test-batch-size", "8"),
            "Accuracy on test set"),
    Example("pipelining_sharded_offload", "examples", f"{PYTORCH}/pipelining",
            ("mnist_pipeline.py", "--strategy", "sharded", "--offload-optimiser", "--epochs", "1",
             "--batch-size", "4", "--device-iterations", "2", "--gradient-accumulation", "8",
             "--test-batch-size", "8"), "Accuracy on test set"),
    Example("mnist", "examples", f"{APPS}/pytorch/mnist", ("mnist_poptorch_code_only.py", "--epochs", "1"),
            "Accuracy on test set"),
    Example("bert_inference", "examples", f"{APPS}/pytorch/bert", ("bert_inference.py",), "Answer:"),
    Example("system_analyser_mnist", "examples", "tutorials/tutorials/popvision/system_analyser_instrumentation",
            ("poptorch_mnist.py",), "Eval accuracy", size="full"),
    Example("system_analyser_mnist_complete", "examples",
            "tutorials/tutorials/popvision/system_analyser_instrumentation", ("poptorch_mnist_complete.py",),
            "Eval accuracy", size="full", needs="libpvti (PopVision trace library of the Poplar SDK)"),
    Example("octconv", "examples", f"{FEATURES}/octconv",
            ("octconv_example.py", "--conv-mode", "multi-octave", "--epochs", "1", "--batches-per-step", "2",
             "--test-batch-size", "8"), "Accuracy on test set", needs="popart"),
    Example("popdist", "examples", f"{FEATURES}/popdist",
            ("popdist_training.py", "--epochs", "1", "--batch-size", "4", "--num-replicas", "2",
             "--dataloader-workers", "2"), "Validation accuracy", needs="popdist"),
    Example("custom_op", "examples", f"{FEATURES}/custom_op", ("poptorch_custom_op.py",), "",
            needs="leaky_relu_example/build/custom_ops.so, compiled against the Poplar SDK (make)"),
    Example("shakespeare_rnn", "examples", f"{APPS}/pytorch_lightning/shakespeare-rnn",
            ("train.py", "--ipus", "1", "--epochs", "1", "--text-file", "shakespeare.txt"), "",
            needs="Lightning < 2.0 (training_epoch_end)"),
    Example("lightning_simple", "lightning", "tutorials", ("simple_lightning_ipu.py",), "",
            needs="Lightning 1.x (Trainer(ipus=...), validation_epoch_end)"),
    Example("lightning_custom_losses", "lightning", "tutorials", ("custom_losses.py",), "difference",
            needs="Lightning 1.x (pytorch_lightning.plugins.IPUPlugin, Trainer(ipus=...))"),
]


def stand_in_home(work: str, size: str) -> str:
    home = os.path.join(work, f"home-{size}")
    if not os.path.isdir(os.path.join(home, ".torch")):
        train, test = SIZES[size]
        subprocess.run([sys.executable, os.path.join(HERE, "fake_datasets.py"), "--home", home, "--train", str(train),
                        "--test", str(test), "--bert"], check=True)
    return home


def prepare(example: Example, source: str, work: str) -> str:
    """A fresh copy of the example's folder, with the stand-ins it expects beside it."""
    target = os.path.join(work, example.name)
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(os.path.join(source, example.folder), target)
    if example.name == "basics" and not os.path.exists(os.path.join(target, "images", "trousers.jpg")):
        subprocess.run([sys.executable, "-c", "import fake_datasets, sys; fake_datasets.trousers_jpg(sys.argv[1])",
                        os.path.join(target, "images", "trousers.jpg")], check=True, cwd=HERE)
    if example.repo == "lightning":  # these read FashionMNIST from ./FashionMNIST
        os.makedirs(os.path.join(target, "FashionMNIST"), exist_ok=True)
        link = os.path.join(target, "FashionMNIST", "FashionMNIST")
        if not os.path.exists(link):
            os.symlink(os.path.join(stand_in_home(work, example.size), ".torch", "datasets", "FashionMNIST"), link)
    if example.name == "shakespeare_rnn" and not os.path.exists(os.path.join(target, "shakespeare.txt")):
        with open(os.path.join(target, "shakespeare.txt"), "w") as stream:  # the README downloads it
            # 2 host calls' worth: 2 x (batch 4 x 500 device iterations) chunks of 20 characters
            stream.write("To be, or not to be, that is the question.\n" * 2000)
    return target


def run(example: Example, source: str, work: str, timeout: float):
    cwd = prepare(example, source, work)
    env = dict(os.environ, HOME=stand_in_home(work, example.size), HF_HUB_OFFLINE="1", OPENPOP_FAKE_DATA="1",
               MPLBACKEND="Agg", PYTHONUNBUFFERED="1")
    started = time.monotonic()
    log = os.path.join(work, example.name + ".log")
    with open(log, "w") as stream:
        try:
            done = subprocess.run([sys.executable, *example.command], cwd=cwd, env=env, stdout=stream,
                                  stderr=subprocess.STDOUT, timeout=timeout)
            code = done.returncode
        except subprocess.TimeoutExpired:
            code = None
    seconds = time.monotonic() - started
    with open(log, errors="replace") as stream:
        lines = [line.strip() for line in stream.read().replace("\r", "\n").splitlines() if line.strip()]
    if code is None:
        return "timeout", seconds, lines[-1] if lines else "", log
    if code == 0 and (not example.expect or any(example.expect in line for line in lines)):
        decisive = next((line for line in reversed(lines) if example.expect and example.expect in line), "")
        return "pass", seconds, decisive, log
    error = next((line for line in reversed(lines) if "Error" in line or "error" in line), lines[-1] if lines else "")
    return f"fail (exit {code})", seconds, error, log


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", help="checkout of graphcore/examples")
    parser.add_argument("--lightning-examples", help="checkout of graphcore/pytorch-lightning-examples")
    parser.add_argument("--work", default="/tmp/openpop_graphcore_examples")
    parser.add_argument("--only", nargs="*", help="names of the examples to run (default: all)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per example")
    parser.add_argument("--list", action="store_true", help="print the table's commands and exit")
    args = parser.parse_args()
    selected = [e for e in EXAMPLES if not args.only or e.name in args.only]
    if args.list:
        for example in selected:
            print(f"{example.name:<32} {example.folder}: python {' '.join(example.command)}")
        return
    sources = {"examples": args.examples, "lightning": args.lightning_examples}
    os.makedirs(args.work, exist_ok=True)
    results = []
    for example in selected:
        source = sources[example.repo]
        if source is None:
            print(f"{example.name:<32} skipped: no --{example.repo.replace('lightning', 'lightning-examples')} "
                  f"checkout given", flush=True)
            continue
        status, seconds, line, _log = run(example, source, args.work, args.timeout)
        note = f" [needs {example.needs}]" if example.needs and status != "pass" else ""
        print(f"{example.name:<32} {status:<14} {seconds:7.0f}s  {line[:150]}{note}", flush=True)
        results.append(status)
    print(f"{results.count('pass')} passed, {len(results) - results.count('pass')} failed")


if __name__ == "__main__":
    main()
