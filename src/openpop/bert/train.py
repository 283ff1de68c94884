"""``openpop-bert``: BERT pretraining with PopTorch's API, on openpop's runtime.

    openpop-bert --config cpu_tiny_128
    openpop-bert --config cpu_base_128 --dataset generated --training-steps 1
    python -m openpop.bert --config pretrain_base_128_pod4 --dataset generated --training-steps 1

Prints what the recipe prints (on stderr): the config, data loading, the device allocation,
compilation, one line per step with losses, accuracies and throughput, and the training
metrics. On a terminal the steps show as a progress bar; otherwise as plain lines.
"""
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

import poptorch

from ..runtime.compile_cache import CompileCache, CompileOutcome, compile_cache_for, watch_compiles
from ..runtime.compiled import backend_from_env
from ..runtime.half_compute import low_precision_is_faster
from . import checkpoint as ckpt
from . import messages
from .config import BertRunConfig
from .data import DataError, get_dataloader, get_dataset
from .instances import Instances
from .metrics import StepMetrics, metrics_text, reduce_outputs, step_description, throughput_text
from .model import PipelinedBertForPretraining
from .optimization import get_lr_scheduler, get_optimizer

# The backend without --backend / OPENPOP_BACKEND: the library's auto, as everywhere. Its choice is
# counted, not timed (runtime/compiled/selection.py): on the main job (demo_tiny_128, 150 steps) it
# runs eager to the end - the program's estimated compile is never paid back in so short a run -
# and on BERT-base it compiles the model's regions once the eager steps have cost the estimate.
DEFAULT_BACKEND = "auto"

BACKEND_CHOICE = {
    "auto": "auto - eager until the eager steps have cost as much as compiling is estimated to, then compiled "
            "(the model's regions or the whole step, by its FLOPs per op)",
    "eager": "eager - every step runs PyTorch's eager ops",
    "compiled": "compiled - every step runs compiled by torch.compile (an error if the model cannot be)",
}

RULE = "-----------------------------------------------------------"
HEADERS = {
    "data": "------------------- Data Loading Started ------------------",
    "compile": "---------- Compilation/Loading from Cache Started ---------",
    "training": "--------------------- Training Started --------------------",
    "metrics": "-------------------- Training Metrics ---------------------",
}


@dataclass
class TrainingResult:
    config: BertRunConfig
    steps: list[StepMetrics] = field(default_factory=list)
    start_step: int = 0
    data_seconds: float = 0.0
    compile_seconds: float = 0.0
    compile_outcome: Optional[CompileOutcome] = None
    training_seconds: float = 0.0
    checkpoints: list[str] = field(default_factory=list)
    model: Optional[torch.nn.Module] = None


# The steps' bar: a fixed-width bar, then the step rate, then the step's metrics (the postfix), so that
# a narrow terminal cuts the metrics' tail, never the bar or its rate.
STEP_BAR_FORMAT = ("{desc}: {percentage:3.0f}%|{bar:20}| {n_fmt}/{total_fmt} "
                   "[{elapsed}<{remaining}, {rate_fmt}{postfix}]")


class _Console:
    """Log lines on a stream; a tqdm bar for the steps when asked."""

    def __init__(self, stream, progress_bar: bool, quiet: bool = False):
        self._stream = stream
        self.progress_bar = progress_bar and not quiet
        self.quiet = quiet  # poprun instances other than 0
        self.bar = None

    @property
    def stream(self):
        return self._stream if self._stream is not None else sys.stderr

    def log(self, text: str = "") -> None:
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def start_steps(self, total: int, initial: int):
        if self.progress_bar:
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=initial, desc="Training", file=self.stream, leave=True,
                            bar_format=STEP_BAR_FORMAT)

    def step(self, metrics: StepMetrics, config: BertRunConfig) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"{throughput_text(metrics)} - {metrics_text(metrics)}", refresh=False)
            self.bar.update(1)
        else:
            self.log(f"{step_description(metrics, config)} {throughput_text(metrics)}")

    def end_steps(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def get_options(config: BertRunConfig, instances: Optional[Instances] = None) -> "poptorch.Options":
    """PopTorch options as the recipe sets them (IPU-only tuning omitted)."""
    opts = (instances or Instances()).new_options(config)  # replication: local replicas under poprun
    opts.autoRoundNumIPUs(True)
    opts.deviceIterations(config.device_iterations)
    opts.Training.gradientAccumulation(config.gradient_accumulation)
    opts.Training.accumulationAndReplicationReductionType(poptorch.ReductionType.Mean)
    if config.auto_loss_scaling:
        opts.Training.setAutomaticLossScaling(True)
    opts.outputMode(poptorch.OutputMode.Sum)
    opts.randomSeed(config.random_seed)
    opts.TensorLocations.setOptimizerLocation(
        poptorch.TensorLocationSettings()
        .useOnChipStorage(not config.optimizer_state_offchip)
        .useReplicatedTensorSharding(config.replicated_tensor_sharding))
    opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))
    opts.setAvailableMemoryProportion({f"IPU{i}": p for i, p in enumerate(config.matmul_proportion)})
    opts.openpopBackend(config.backend or backend_from_env(default=DEFAULT_BACKEND))
    if config.executable_cache_dir:
        opts.enableExecutableCaching(config.executable_cache_dir)
    if config.profile_dir:
        opts.enableProfiling(config.profile_dir)
    if config.synthetic_data:
        opts.enableSyntheticData(True)
    if config.compile_only:
        opts.useOfflineIpuTarget()
    if uses_bf16(config):
        opts.Precision.autocast(True, torch.bfloat16)  # openpop's mixed precision (the recipe: float16 model)
    if not config.recomputation:
        opts._Popart.set("autoRecomputation", 0)  # PopART's RecomputationType.NoRecompute
    return opts


def uses_bf16(config: BertRunConfig) -> bool:
    """bf16 autocast for ``precision: bf16``, and for ``auto`` where bf16 matmuls beat fp32 ones here."""
    return config.precision == "bf16" or (config.precision == "auto" and low_precision_is_faster(torch.bfloat16))


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)


def run(config: BertRunConfig, stream=None) -> TrainingResult:
    """Train as configured; raises ``DataError`` / ``CheckpointError`` for unusable input."""
    threads = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        return _run(config, stream)
    finally:
        torch.set_num_threads(threads)


def _run(config: BertRunConfig, stream) -> TrainingResult:
    progress_bar = config.disable_progress_bar is False or (
        config.disable_progress_bar is None and (stream or sys.stderr).isatty())
    instances = Instances.join(config)
    console = _Console(stream, progress_bar, quiet=not instances.logs)
    log = console.log
    result = TrainingResult(config)
    log(f"Using config: {config.config}")
    if config.precision == "auto":
        log(f"Precision: {'bf16 autocast' if uses_bf16(config) else 'fp32'} (auto: bf16 only where it is faster)")
    if instances.note:
        log(instances.note)
    if config.wandb:
        log("[warning] --wandb: Weights & Biases logging needs a network connection; not logging")
    _seed_everything(config.random_seed)

    # Fail on an unusable executable cache or a bad checkpoint before any expensive work.
    opts = get_options(config, instances)
    compile_cache = CompileCache.from_options(opts, "--executable-cache-dir" if config.executable_cache_dir else None)
    checkpoint_file = ckpt.find_checkpoint(config)
    state = ckpt.load_checkpoint(checkpoint_file, config) if checkpoint_file else None
    start_step = 0
    if state is not None and config.resume_training_from_checkpoint:
        start_step = int(state["step"])
        if start_step >= config.training_steps:
            raise ckpt.CheckpointError(
                messages.NOTHING_LEFT_TO_TRAIN.format(
                    checkpoint_file=checkpoint_file, start_step=start_step, training_steps=config.training_steps))
    result.start_step = start_step
    if config.checkpoint_output_dir:
        # The instance that writes checkpoints cleans up after killed writes, and says so.
        removed = instances.on_first(ckpt.remove_stale_checkpoint_files, config.checkpoint_output_dir)
        if removed:
            log(f"Removed {len(removed)} temporary file(s) left in {config.checkpoint_output_dir} by checkpoint "
                "writes that were killed")

    log(HEADERS["data"])
    started = time.perf_counter()
    dataset = get_dataset(config, log, instances.count)
    loader = get_dataloader(config, opts, dataset, start_step, instances.index, instances.count)
    result.data_seconds = time.perf_counter() - started
    log(f"Data loaded in {result.data_seconds} secs")
    log(RULE)

    model = PipelinedBertForPretraining(config).parallelize(log).train()
    if state is not None:
        ckpt.load_weights(model, state, checkpoint_file, config)
        if not config.resume_training_from_checkpoint:
            log(f"Loaded weights from {checkpoint_file}")
    optimizer = get_optimizer(config, model)
    scheduler = get_lr_scheduler(optimizer, config)
    if state is not None and config.resume_training_from_checkpoint:
        ckpt.restore_training_state(state, optimizer, scheduler, checkpoint_file)
        log(f"Resuming training from {checkpoint_file} at step {start_step}")
    poptorch_model = poptorch.trainingModel(model, opts, optimizer=optimizer)
    result.model = model

    log(HEADERS["compile"])
    batches = iter(loader)
    first_batch = next(batches)
    with compile_cache_for(compile_cache), watch_compiles(compile_cache) as outcome:
        poptorch_model.compile(*first_batch)
    result.compile_seconds, result.compile_outcome = outcome.seconds, outcome
    if console.stream is not sys.stderr:
        # The executor prints the bar on stderr; a log written elsewhere gets its line too.
        from tqdm import tqdm
        log(f"Graph compilation: 100%|{'█' * 10}| 100/100 [{tqdm.format_interval(result.compile_seconds)}<00:00]")
    log(f"Compiled/Loaded model in {result.compile_seconds} secs")
    log(f"Compilation: {outcome.describe()}")
    log(f"Backend: {BACKEND_CHOICE[opts.openpop_backend]}")
    log(RULE)
    if config.compile_only:
        return result

    if state is not None and config.resume_training_from_checkpoint:
        torch.set_rng_state(state["rng_state"])
    state = None
    log(HEADERS["training"])
    console.start_steps(config.training_steps, start_step)
    training_started = time.perf_counter()
    batch = first_batch
    try:
        for step in range(start_step, config.training_steps):
            step_started = time.perf_counter()
            if batch is None:
                batch = next(batches)
            outputs = poptorch_model(*batch)
            batch = None
            scheduler.step()
            poptorch_model.setOptimizer(optimizer)
            seconds = time.perf_counter() - step_started
            seconds, *values = instances.average([seconds] + reduce_outputs(outputs, config))
            metrics = StepMetrics(step, scheduler.get_last_lr()[0], *values,
                                  throughput=config.samples_per_step * instances.count / seconds, seconds=seconds)
            result.steps.append(metrics)
            console.step(metrics, config)
            done = step + 1
            if config.checkpoint_output_dir and (
                    (config.checkpoint_steps and done % config.checkpoint_steps == 0)
                    or done == config.training_steps):
                poptorch_model.copyWeightsToHost()
                path = instances.on_first(ckpt.save_checkpoint, config.checkpoint_output_dir, done, config, model,
                                          optimizer, scheduler)
                if path is not None:
                    result.checkpoints.append(path)
    finally:
        console.end_steps()
        if hasattr(loader, "terminate"):
            loader.terminate()
    result.training_seconds = time.perf_counter() - training_started
    for path in result.checkpoints[-1:]:
        log(f"Saved checkpoint {path}")
    log(RULE)
    log(HEADERS["metrics"])
    log(f"global_batch_size: {config.global_batch_size * instances.count}")
    log(f"device_iterations: {config.device_iterations}")
    log(f"training_steps: {config.training_steps}")
    if result.steps:
        final = result.steps[-1]
        log(f"final loss: {final.total_loss:.3f} (mlm_loss {final.mlm_loss:.3f}, nsp_loss {final.nsp_loss:.3f})")
        log(f"final accuracy: mlm_acc {final.mlm_acc:.3f} %, nsp_acc {final.nsp_acc:.3f} %")
    log(f"Training time: {result.training_seconds:.3f} secs")
    log(RULE)
    poptorch_model.destroy()
    return result


def main(argv: Optional[list[str]] = None) -> int:
    """``openpop-bert`` (:mod:`openpop.bert.cli`, which parses the flags without loading torch)."""
    from .cli import main as cli_main
    return cli_main(argv)


def run_command(config: BertRunConfig, prog: str = "openpop-bert") -> int:
    """Run a parsed configuration as the command does: its exit status."""
    try:
        run(config)
    except (DataError, ckpt.CheckpointError, poptorch.Error) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("Interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
