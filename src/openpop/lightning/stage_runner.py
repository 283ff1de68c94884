"""What ``IPUStrategy`` keeps per Lightning stage: the executor, the batch it is compiled for, the
per-step hooks (training) and the ``autoreport`` profile.

``IPUStrategy.setup`` builds them, keyed by ``RunningStage``; validation and the sanity check
share one runner (one executor, one report).
"""
import contextlib
import os
import time
from dataclasses import dataclass
from typing import Any, Optional

from openpop import PoplarExecutor
from openpop.runtime.geometry import BatchGeometry
from openpop.runtime.trace import TraceSession

from ._framework import module
from .optimizer_steps import PerStepHooks
from .report import StageProfile
from .steps import StepModule, batch_signature, leading_size

_states = module("trainer.states")
RunningStage = _states.RunningStage

AUTOREPORT_TRACED_CALLS = 2  # host calls per stage recorded into trace.json / report.html
STAGE_NAMES = {RunningStage.TRAINING: "training", RunningStage.VALIDATING: "validation",
               RunningStage.SANITY_CHECKING: "validation", RunningStage.TESTING: "test",
               RunningStage.PREDICTING: "predict"}


@dataclass(eq=False)  # one object per stage, shared by validation and the sanity check
class StageRunner:
    """One stage's executor and what the strategy learned running it."""

    name: str
    """"training", "validation", "test" or "predict": also the autoreport directory."""
    training: bool
    executor: Optional[PoplarExecutor] = None
    """The stage's ``trainingModel`` / ``inferenceModel``; None when manual optimization trains
    on the host. Replaced by a ``ShardedExecution`` one when the model cannot pipeline."""
    per_step: Optional[PerStepHooks] = None
    """Training with automatic optimization: Lightning's per-optimizer-step hooks."""
    signature: Any = None
    """Structure, shapes and dtypes of the batch the executor is compiled for."""
    micro_size: Optional[int] = None
    """Rows per micro-batch of the compiled batch (the loader's ``batch_size``)."""
    combined_size: Optional[int] = None
    """Rows of the compiled batch: a smaller evaluation batch runs on the host (``run_in_chunks``)."""
    loader_micro_size: Optional[int] = None
    """``batch_size`` of the stage's last converted dataloader, for a batch before any compile."""
    profile: Optional[StageProfile] = None
    trace: Optional[TraceSession] = None
    """``autoreport``: the profile report and the torch.profiler trace of the first host calls."""

    def compile(self, batch, positions) -> None:
        """Compile the executor for ``batch``'s structure and shapes, unless it already is.
        New shapes compile again (PopTorch would refuse)."""
        executor = self.executor
        signature = batch_signature(batch)
        if executor.isCompiled() and self.signature == signature:
            return
        if executor.isCompiled():
            executor.destroy()
        executor.compile(batch, positions)
        self.signature = signature
        size = leading_size(batch)
        if size is not None:
            self.micro_size = size // BatchGeometry.from_options(executor.options).batches_per_call
            self.combined_size = size

    def is_incomplete(self, size: Optional[int], batches_per_call: int) -> bool:
        """An evaluation batch of ``size`` rows the executor cannot run as compiled: the loader's
        last, smaller batch (``run_in_chunks`` runs it on the host instead of recompiling)."""
        if size is None:
            return False
        return size % batches_per_call != 0 or (self.combined_size is not None and size < self.combined_size)

    def host_micro_size(self, size: int, geometry: BatchGeometry) -> int:
        """Rows per host-side chunk of an incomplete batch: the loader's ``batch_size``."""
        return self.micro_size or self.loader_micro_size or max(1, size // geometry.batches_per_call)

    def run(self, batch, positions, step_module: StepModule) -> tuple[Any, float]:
        """One host call on the compiled executor; returns its result and seconds."""
        if self.profile is not None:
            self.profile.hook_blocks(self.executor, step_module)
        started = time.perf_counter()
        step_module.per_step = self.per_step
        try:
            with self.per_step.host_call() if self.per_step is not None else contextlib.nullcontext():
                result = self.executor(batch, positions)
        finally:
            step_module.per_step = None
        return result, time.perf_counter() - started

    def refresh_weights(self) -> None:
        """Weights may have changed outside this executor (manual optimization, a loaded
        checkpoint, user code): the next call starts from the host's values."""
        if self.executor is not None and self.executor.isCompiled():
            self.executor.copyWeightsToDevice()

    # ------------------------------------------------------------------ autoreport
    def start_profile(self, directory: str) -> None:
        """Once per run: later starts of the stage (validation every epoch) add to the report."""
        if self.profile is None:
            self.profile = StageProfile(self.name, directory)
            # the stage's first host calls, next to profile.json
            self.trace = TraceSession(os.path.join(directory, self.name), calls=range(AUTOREPORT_TRACED_CALLS),
                                      accepts=lambda executor: executor is self.executor)

    def record(self, seconds: float, batch) -> None:
        if self.profile is not None:
            self.profile.record_call(self.executor, seconds, leading_size(batch) or 0)

    def write_profile(self, model, optimizer) -> Optional[str]:
        """Close the trace and write the report; the report's path, if one was written."""
        if self.trace is not None:
            self.trace.close()
            self.trace = None
        if self.profile is None:
            return None
        return self.profile.write(self.executor, model, optimizer)

    def close(self) -> None:
        """Teardown: per-step hooks and profiler hooks removed, the executor destroyed."""
        if self.per_step is not None:
            self.per_step.remove()
            self.per_step = None
        if self.profile is not None:
            self.profile.unhook()
        if self.trace is not None:
            self.trace.close()
            self.trace = None
        if self.executor is not None:
            self.executor.destroy()
