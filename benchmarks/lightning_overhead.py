"""Lightning's overhead: a tiny MLP trained by Lightning's own CPU loop vs ``accelerator="ipu"``
(openpop's ``IPUStrategy``) on the eager backend with device_iterations 1, 8 and 64 and on the
compiled backend with device_iterations 64, side by side in this run: same model, data,
micro-batch size and number of optimizer steps; the step logs its loss with ``self.log``.

    python benchmarks/lightning_overhead.py [--steps 2048] [--micro-batch 32] [--repeats 3]
                                            [--eager-di 1 8 64] [--compiled-di 64]

With ``device_iterations=DI`` one Lightning batch runs DI optimizer steps inside openpop's
executor, so Lightning's per-batch work (hooks, logging, progress tracking) is paid once per DI
steps; the compiled backend (``OPENPOP_BACKEND=compiled``) also runs the DI steps as one
program. Every variant is timed from the end of its first batch to the end of training (the
compiled variants compile in their first host call). Prints samples/s and ratios to Lightning's
CPU loop, then one JSON line. Target (issue 15): >= 5x at DI=64 (compiled).
"""
import argparse
import copy
import json
import os
import time
import warnings

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import IPUStrategy  # resolved by openpop's import hook
from torch.utils.data import DataLoader

warnings.filterwarnings("ignore", ".*does not have many workers.*")
warnings.filterwarnings("ignore", ".*LeafSpec.*")


class MLP(pl.LightningModule):
    def __init__(self, width=32):
        super().__init__()
        self.fc1 = torch.nn.Linear(width, width)
        self.fc2 = torch.nn.Linear(width, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.fc2(torch.relu(self.fc1(x))), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class BatchedTensors(torch.utils.data.Dataset):
    """Tensors fetched a batch at a time (``__getitems__``), so that data loading costs the same
    small amount in every variant and the loops' own overhead is what is measured."""

    def __init__(self, *tensors):
        self.tensors = tensors

    def __len__(self):
        return len(self.tensors[0])

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __getitems__(self, indices):
        index = torch.as_tensor(indices)
        return tuple(t[index] for t in self.tensors)


def whole_batch(batch):
    return batch


class Timer(pl.Callback):
    """Wall time of the training loop after its first batch (compiles, first-call allocations),
    and the optimizer steps in that time."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == 0:
            self.first_steps = trainer.global_step
            self.started = time.perf_counter()

    def on_train_end(self, trainer, pl_module):
        self.seconds = time.perf_counter() - self.started
        self.steps = trainer.global_step - self.first_steps


TARGET_DI64 = 5.0


def run(model, data, micro, steps, device_iterations=None, backend=None):
    timer = Timer()
    if backend is None:
        os.environ.pop("OPENPOP_BACKEND", None)
    else:
        os.environ["OPENPOP_BACKEND"] = backend
    common = dict(max_epochs=1, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                  enable_model_summary=False, callbacks=[timer], num_sanity_val_steps=0)
    if device_iterations is None:
        trainer = pl.Trainer(accelerator="cpu", devices=1, **common)
    else:
        trainer = pl.Trainer(accelerator="ipu", devices=1, strategy=IPUStrategy(device_iterations=device_iterations),
                             **common)
    trainer.fit(model, DataLoader(data, batch_size=micro, collate_fn=whole_batch))
    assert trainer.global_step == steps, (trainer.global_step, steps)
    return timer.steps * micro / timer.seconds


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2048)
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--eager-di", type=int, nargs="*", default=[1, 8, 64],
                        help="device_iterations of the IPUStrategy variants on the eager backend")
    parser.add_argument("--compiled-di", type=int, nargs="*", default=[64],
                        help="device_iterations of the IPUStrategy variants on the compiled backend")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    base = MLP()
    x = torch.randn(args.steps * args.micro_batch, 32)
    data = BatchedTensors(x, x.sum(1, keepdim=True).sin())
    variants = {"lightning_cpu": (None, None)}
    labels = {"lightning_cpu": "Lightning CPU loop"}
    for backend, dis in (("eager", args.eager_di), ("compiled", args.compiled_di)):
        for di in dis:
            variants[f"ipu_{backend}_di{di}"] = (di, backend)
            labels[f"ipu_{backend}_di{di}"] = f"IPUStrategy {backend} DI={di}"
    results = {key: [] for key in variants}
    for _ in range(args.repeats):  # interleaved, best of N, so machine load hits all alike
        for key, (di, backend) in variants.items():
            results[key].append(run(copy.deepcopy(base), data, args.micro_batch, args.steps, di, backend))
    best = {key: max(values) for key, values in results.items()}
    ratio = {key: best[key] / best["lightning_cpu"] for key in best}
    print(f"{'variant':<28}{'samples/s':>12}{'vs CPU loop':>13}")
    for key, label in labels.items():
        print(f"{label:<28}{best[key]:>12.0f}{ratio[key]:>12.2f}x")
    target_key = "ipu_compiled_di64" if "ipu_compiled_di64" in ratio else "ipu_eager_di64"
    print(json.dumps({"benchmark": "lightning_overhead", "steps": args.steps, "micro_batch": args.micro_batch,
                      "samples_per_second": best, "ratio_vs_lightning_cpu": ratio,
                      "target_di64": TARGET_DI64, "met": ratio.get(target_key, 0.0) >= TARGET_DI64}))


if __name__ == "__main__":
    main()
