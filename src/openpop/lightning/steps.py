"""How a LightningModule step runs inside openpop's executor.

``IPUStrategy`` wraps the LightningModule in ``StepModule`` and gives that to
``poptorch.trainingModel`` / ``inferenceModel``. One Lightning batch is one host call: the
executor splits every tensor of the (combined) batch along dim 0 in PopART's order
``[device_iterations, gradient_accumulation, replicas, micro_batch]`` and calls
``StepModule.forward`` once per micro-batch, which calls the user's ``training_step`` /
``validation_step`` / ``test_step`` / ``predict_step`` with:

* ``batch``: the micro-batch (tensors split; any other value is given unchanged to each one);
* ``batch_idx``: the index this micro-batch has in a plain CPU run of the same data, i.e.
  ``(host_batch_idx * device_iterations + d) * gradient_accumulation + g`` (replicas are DDP
  ranks: they share it);
* every other argument (``dataloader_idx``) unchanged.

The step runs eagerly (nothing is traced into constants), so Python branching on tensor values,
``self.global_step``, ``self.current_epoch`` ... behave as on the CPU. The micro-batch position
reaches ``forward`` as a tensor split like the data (``positions``: ``host batch_idx x
batches_per_call + position``), so it stays right whatever order a schedule runs micro-batches
in. When the executor's compiled backend runs the call, the step is traced into one program
instead: see ``compiled_steps.py``.

The executor's compile pass runs ``forward`` once more on the first micro-batch to record
blocks (model parallelism) and check the model. openpop undoes that pass's effects on weights,
buffers and the RNG; this module also discards its ``self.log`` calls and restores
``torchmetrics`` states. Other Python side effects of a step (appending to a list) happen once
more per compiled model, as with PopTorch's tracing.

Training outputs: the executor back-propagates the loss Lightning would use (the returned
tensor, or ``output["loss"]``; ``None`` skips the micro-batch: it contributes no gradient).
"""
import contextlib
import copy
import functools
from collections.abc import Mapping
from typing import Optional

import torch

from openpop.annotations import openpop_ops
from openpop.enums import OutputMode
from openpop.runtime import context
from openpop.runtime.compiled import Ineligible
from openpop.runtime.geometry import BatchGeometry
from openpop.runtime.losses import identity_loss
from openpop.runtime.outputs import OutputCollector
from openpop.torch_compat import pytree

from . import compiled_steps, messages
from ._framework import module as pl_module

_NO_CONTEXT = contextlib.nullcontext()
TRAINING_OUTPUT = ("In automatic optimization, `training_step` must return a Tensor, a dict with a 'loss' key, "
                   "or None (where the micro-batch is skipped); got {kind}.")


class StepCall:
    """One host call: which step runs, for which Lightning batch, with which batch geometry."""

    def __init__(self, method: str, geometry: BatchGeometry, args: tuple, kwargs: dict, logs, precision,
                 training: bool, pass_batch_idx: bool):
        self.method = method
        self.geometry = geometry
        self.batch_idx = args[1] if pass_batch_idx and len(args) > 1 else 0
        self.rest = args[2:] if pass_batch_idx else args[1:]
        self.kwargs = kwargs
        self.pass_batch_idx = pass_batch_idx
        self.logs = logs
        self.precision = precision
        self.training = training
        self.output_kind = None  # "tensor", "dict" or "none": what the step returned
        self.position_base = 0  # positions() are global: host-side runs give local ones
        # 32-true needs no context around each micro-batch
        self.forward_context = getattr(precision, "precision", "32-true") != "32-true"

    def micro_batch_index(self, position: int) -> int:
        g = self.geometry
        per_iteration = g.gradient_accumulation * g.input_replicas
        d, a = position // per_iteration, (position // g.input_replicas) % g.gradient_accumulation
        return (int(self.batch_idx) * g.device_iterations + d) * g.gradient_accumulation + a

    def positions(self) -> torch.Tensor:
        """The executor's per-micro-batch input: ``host batch_idx x batches_per_call + position``
        (the compiled program computes ``batch_idx`` from it)."""
        count = self.geometry.batches_per_call
        self.position_base = int(self.batch_idx) * count
        return torch.arange(self.position_base, self.position_base + count, dtype=torch.int32)


class StepModule(torch.nn.Module):
    """What the executors run: ``forward`` = one micro-batch of a LightningModule step."""

    def __init__(self, lightning_module):
        super().__init__()
        self.module = lightning_module
        self.call: Optional[StepCall] = None
        self.per_step = None  # the training stage's PerStepHooks during its host calls (stage_runner.py)
        self._takes_batch_idx = {}  # step method name -> whether its signature has batch_idx
        self._log_specs = {}  # step method name -> its self.log calls (compiled backend's probe)
        self._output_kinds = {}  # step method name -> what the training step returns (probe)

    def takes_batch_idx(self, method: str) -> bool:
        if method not in self._takes_batch_idx:
            self._takes_batch_idx[method] = pl_module("utilities.signature_utils").is_param_in_hook_signature(
                getattr(self.module, method), "batch_idx", min_args=2)
        return self._takes_batch_idx[method]

    @contextlib.contextmanager
    def running(self, call: StepCall):
        """``forward`` runs ``call`` (with its ``self.log`` collection installed) in this block."""
        self.call = call
        try:
            with call.logs.installed():
                yield
        finally:
            self.call = None

    def openpop_restart_host_call(self) -> None:
        """The executor runs the host call again from its start (``runtime/eager.py``: float16
        overflow): what its micro-batches logged so far is dropped, not logged twice, and the
        per-step optimizer hooks (LR schedulers, step counters) go back to the call's start."""
        if self.call is not None:
            self.call.logs.discard()
        if self.per_step is not None:
            self.per_step.restart()

    def forward(self, batch, positions):
        call = self.call
        if torch.compiler.is_compiling():
            return self._compiled_forward(call, batch, positions, None)
        ctx = context.current()
        tracing = bool(ctx is not None and ctx.tracing)
        if tracing and ctx.compiled:
            return self._compiled_forward(call, batch, positions, ctx)
        # one element per micro-batch
        position = int(positions) - call.position_base if isinstance(positions, torch.Tensor) else 0
        step = getattr(self.module, call.method)
        args = (batch, call.micro_batch_index(position)) if call.pass_batch_idx else (batch,)
        with contextlib.ExitStack() if tracing or call.forward_context else _NO_CONTEXT as stack:
            if tracing:
                stack.enter_context(_restored_metrics(self.module))
            if call.forward_context:
                stack.enter_context(call.precision.forward_context())
            with call.logs.micro_batch(position, batch, discard=tracing):
                output = step(*args, *call.rest, **call.kwargs)
        if not call.training:
            return output
        return self._training_output(call, output, ctx if tracing else None)[:2]

    # ------------------------------------------------------------------ compiled backend
    def _compiled_forward(self, call: StepCall, batch, positions, probe_ctx):
        """One micro-batch as the compiled program runs it (``compiled_steps.py``); ``probe_ctx``:
        the backend's eager probe, which records the ``self.log`` calls and the output kind."""
        records = []
        view = compiled_steps.LoggingView(self.module, records, probing=probe_ctx is not None)
        if probe_ctx is not None and call.method in vars(self.module):
            raise Ineligible(messages.COMPILED_STEP_REPLACED.format(method=call.method))
        step = functools.partial(getattr(type(self.module), call.method), view)
        args = (batch,)
        if call.pass_batch_idx:
            args += (compiled_steps.micro_batch_index(call.geometry, positions.reshape(()).long()),)
        with contextlib.ExitStack() as stack:
            if probe_ctx is not None:
                stack.enter_context(_restored_metrics(self.module))
            if call.forward_context and (probe_ctx is not None or not self.compiled_forward_contexts()[0]):
                stack.enter_context(call.precision.forward_context())
            if probe_ctx is None:
                output = step(*args, *call.rest, **call.kwargs)
            else:
                try:
                    output = step(*args, *call.rest, **call.kwargs)
                except Ineligible:
                    raise
                except Exception as error:  # e.g. super() or isinstance on self: the eager run decides
                    raise Ineligible(messages.COMPILED_STEP_FAILED.format(
                        method=call.method, error=f"{type(error).__name__}: {error}")) from error
        if probe_ctx is not None:
            self._log_specs[call.method] = compiled_steps.LogSpec(records, batch)
        logs = tuple(value.detach() for _, value, _, _ in records)
        if not call.training:
            return output, logs
        loss, extra, kind = self._training_output(call, output, probe_ctx)
        if probe_ctx is not None:
            self._output_kinds[call.method] = kind
        return loss, {} if extra is None else extra, logs  # the program's outputs are tensors

    def compiled_micro_batch_leaves(self) -> int:
        """The compiled backend returns the last this many output leaves (the logged values)
        for every micro-batch."""
        return len(self._log_specs[self.call.method])

    def compiled_forward_contexts(self):
        """``(factories, stepwise)``: the precision's contexts the compiled program enters around
        each traced micro-batch (``IPUPrecision.traced_forward``), instead of the step."""
        traced = getattr(self.call.precision, "traced_forward", None)
        return traced() if traced is not None else ([], False)

    def compiled_host_call_result(self, result):
        """The compiled program's result as the eager host call's; the logged values go to the
        call's ``StepLogs``."""
        call = self.call
        result, logs = compiled_steps.split_result(result, call.training)
        call.logs.add_micro_batches(self._log_specs[call.method], logs)
        if call.training:
            call.output_kind = self._output_kinds[call.method]
            if call.output_kind != "dict":
                result = (result[0], None)
        return result

    @staticmethod
    def _training_output(call: StepCall, output, tracing_ctx):
        if isinstance(output, Mapping):
            if "loss" not in output:
                raise pl_module("utilities.exceptions").MisconfigurationException(messages.MISSING_LOSS_KEY)
            loss, extra, kind = output["loss"], {k: v for k, v in output.items() if k != "loss"}, "dict"
        elif isinstance(output, torch.Tensor):
            loss, extra, kind = output, None, "tensor"
        elif output is None:
            loss, extra, kind = None, None, "none"
        else:
            raise pl_module("utilities.exceptions").MisconfigurationException(
                TRAINING_OUTPUT.format(kind=type(output).__name__))
        if not torch.compiler.is_compiling():  # the compiled program's call: its probe's kind
            call.output_kind = kind
        if loss is None:
            loss = torch.zeros((), requires_grad=True)  # no gradient from a skipped micro-batch
        if tracing_ctx is not None:
            # The loss is what the step returned: hide the losses computed on the way (metrics,
            # auxiliary terms) from the executor's loss discovery.
            tracker = getattr(tracing_ctx, "loss_tracker", None)
            if tracker is not None:
                tracker.losses.clear()
            with openpop_ops():  # (the executor's loss, not one of the user's ops)
                loss = identity_loss(loss, reduction="none")
        return loss, extra, kind


def lightning_training_output(call: StepCall, result):
    """The executor's ``(loss, extra)`` as Lightning expects a training step's output.

    The loss rows the output mode returned (default ``Final``: the last step, one row per
    replica) become their mean, a scalar, because Lightning treats the loss as one number; the
    other entries keep PopTorch's row layout."""
    if result is None:
        return None
    loss, extra = result
    if call.output_kind == "none":
        return None
    loss = loss.float().mean() if loss.dim() > 0 else loss
    if call.output_kind == "dict":
        return {"loss": loss, **(extra or {})}
    return loss


def split_on_host(batch, geometry: BatchGeometry):
    """``[(position, micro_batch)]`` in PopART order for a host-side run of ``batch``."""
    leaves, spec = pytree.tree_flatten(batch)
    views = [geometry.split(t) if isinstance(t, torch.Tensor) and t.dim() > 0 else None for t in leaves]
    result = []
    for micro in geometry.micro_batches(replicas=geometry.input_replicas):
        rows = [v[micro.step, micro.accumulation, micro.chunk] if v is not None else leaf
                for v, leaf in zip(views, leaves)]
        result.append((geometry.input_position(micro), pytree.tree_unflatten(rows, spec)))
    return result


def run_on_host(step_module: StepModule, call: StepCall, batch, geometry: BatchGeometry, mode: OutputMode,
                period: int = 1):
    """Run ``call`` on ``batch`` split by ``geometry``, eagerly on the host (no executor), inside
    ``step_module.running(call)``.

    Used for manual optimization without replicas. Outputs are assembled by ``mode`` exactly as
    the executor would."""
    collector = OutputCollector(mode, period, geometry)
    for position, micro in split_on_host(batch, geometry):
        output = step_module(micro, torch.tensor([position], dtype=torch.int32))
        d = position // (geometry.gradient_accumulation * geometry.input_replicas)
        g = (position // geometry.input_replicas) % geometry.gradient_accumulation
        if collector.wants(d, g):
            collector.add(position % geometry.input_replicas, output)
    return collector.result()


def run_in_chunks(step_module: StepModule, batch, size: int, micro: int):
    """Run an evaluation batch of ``size`` rows on the host in chunks of ``micro`` rows, inside
    ``step_module.running(call)``: the loader's incomplete last batch, which the executor would
    have to recompile for. Outputs are concatenated as ``OutputMode.All`` does."""
    chunks = [_rows(batch, start, min(start + micro, size)) for start in range(0, size, micro)]
    collector = OutputCollector(OutputMode.All, 1, BatchGeometry(device_iterations=len(chunks)))
    for position, chunk in enumerate(chunks):
        collector.add(0, step_module(chunk, torch.tensor([position], dtype=torch.int32)))
    return collector.result()


def _rows(batch, start: int, stop: int):
    leaves, spec = pytree.tree_flatten(batch)
    return pytree.tree_unflatten([leaf[start:stop] if isinstance(leaf, torch.Tensor) and leaf.dim() > 0 else leaf
                                  for leaf in leaves], spec)


def leading_size(batch) -> Optional[int]:
    for leaf in pytree.tree_leaves(batch):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return leaf.shape[0]
    return None


def batch_signature(batch):
    """Structure, shapes and dtypes of ``batch``: a new one means the executor must recompile."""
    leaves, spec = pytree.tree_flatten(batch)
    return (spec, tuple((t.shape, t.dtype) if isinstance(t, torch.Tensor) else (type(t).__name__,) for t in leaves))


@contextlib.contextmanager
def _restored_metrics(lightning_module):
    """Undo what the compile pass's step does to ``torchmetrics.Metric`` states."""
    try:
        from torchmetrics import Metric
    except ImportError:  # pragma: no cover
        yield
        return
    saved = []
    for metric in lightning_module.modules():
        if isinstance(metric, Metric):
            names = list(getattr(metric, "_defaults", {})) + ["_update_count", "_computed", "_forward_cache"]
            saved.append((metric, {n: copy.deepcopy(metric.__dict__[n]) for n in names if n in metric.__dict__}))
    try:
        yield
    finally:
        for metric, values in saved:
            for name, value in values.items():
                setattr(metric, name, value)
