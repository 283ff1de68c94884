"""``Executable``: what compiling a model for its first inputs learnt, fixed until ``destroy()``.

``trace_model`` runs one micro-batch to find the loss among the outputs, record the blocks
(the plan), check the model (parameters and buffers not replaced, buffers replicas must keep
apart) and lay the plan out on devices, leaving no trace: weights, buffers, the RNG and the
caller's tensors are as before.
"""
from dataclasses import dataclass
from typing import Optional

import torch

from .. import errors
from ..log import logger
from . import assigned_slots, compile_phases, context, messages
from .anchors import AnchoredTensors
from .args import BoundInputs, InputSignature
from .buffer_state import has_history
from .losses import LossTracker
from .outputs import flatten_output
from .plan import BlockRecorder, ExecutionPlan, build_plan
from .session import DeviceLayout
from .shapes_only import ShapesOnly, recorded
from .weights import BufferSnapshot, NormStatistics, ReplicaBuffers, SharedBuffers, registered_tensors


@dataclass(frozen=True)
class Executable:
    signature: InputSignature
    #: Blocks -> stages -> IPUs -> devices (``plan.py``).
    plan: ExecutionPlan
    layout: DeviceLayout
    #: ``SharedWeights`` (training: the host's tensors) or ``CopiedWeights`` (inference).
    weights: object
    #: Per-replica values of buffers a forward mutates (``weights.ReplicaBuffers``), or ``SharedBuffers``.
    replica_buffers: object
    anchors: AnchoredTensors
    #: Position of the loss among the flattened outputs (training), None when not returned as-is.
    loss_index: Optional[int]
    #: The loss is found on every call by a ``LossTracker`` (training, not returned as-is).
    track_losses: bool
    #: ``(module, training)`` as they were when compiled: calls run in these modes.
    training_flags: tuple
    #: The model's parameters (``trainable``: those that receive gradients now).
    parameters: tuple
    #: The forward writes buffers with autograd history or reassigns them: each micro-batch ends
    #: with ``buffer_state.BufferState.settle`` (values kept, history dropped).
    stateful_buffers: bool = False

    @property
    def concurrent(self) -> bool:
        return self.layout.concurrent

    @property
    def trainable(self) -> tuple:
        """The parameters that receive gradients: those with ``requires_grad`` at this call (a
        parameter frozen or unfrozen between calls is honoured from the next call on)."""
        return tuple(p for p in self.parameters if p.requires_grad)


@dataclass(frozen=True)
class Traced:
    """What the compile trace found (see ``trace_model``)."""

    plan: ExecutionPlan
    layout: DeviceLayout
    replica_buffers: object
    loss_index: Optional[int]
    track_losses: bool
    stateful_buffers: bool = False


def trace_model(model, inputs: BoundInputs, settings, precision, weights, shapes_only=False) -> Traced:
    """Run one micro-batch of ``inputs`` through ``model`` with its ``weights`` active.
    ``shapes_only``: on fake tensors (``shapes_only.py``: nothing here needs values), for real
    when the model cannot run on them or has inference-tensor buffers (their changes are found
    by value). Timed as the compile's graph capture (``compile_phases.py``)."""
    with compile_phases.phase(model, compile_phases.GRAPH_CAPTURE):
        return _trace_model(model, inputs, settings, precision, weights, shapes_only)


def _trace_model(model, inputs, settings, precision, weights, shapes_only) -> Traced:
    if shapes_only and not any(b.is_inference() for b in weights.buffers()):
        try:
            return _trace(model, inputs, settings, precision, weights, ShapesOnly())
        except Exception as exc:  # a value read, an op without a meta kernel: its errors show for real
            logger.debug(messages.SHAPES_ONLY_FAILED, type(exc).__name__)
    return _trace(model, inputs, settings, precision, weights, None)


def _trace(model, inputs, settings, precision, weights, shapes) -> Traced:
    training = settings.training
    geometry = settings.geometry
    leaves = list(inputs.leaves)
    for pos in inputs.tensor_positions:
        tensor = leaves[pos]
        micro = tensor if tensor.dim() == 0 else geometry.split(tensor)[0, 0, 0]
        leaves[pos] = micro.clone() if shapes is None else shapes.fake(micro)
    args, kwargs = inputs.rebuild(leaves)
    rng = torch.random.get_rng_state()
    with weights.active():
        snapshot = BufferSnapshot(weights.buffers(), model)
        params_before, buffers_before = registered_tensors(model)
        tracker = LossTracker()
        recorder = BlockRecorder(model)
        statistics = NormStatistics()
        assignments = assigned_slots.Recorded(model)
        try:
            with context.running(training, tracing=True) as ctx, torch.set_grad_enabled(training), statistics, \
                    recorded((), shapes), assigned_slots.recording(assignments):
                ctx.block_recorder = recorder
                ctx.checkpoints = recorder.checkpoints
                with precision.forward(model, tracing=True):
                    if training:
                        ctx.loss_tracker = tracker
                        with tracker, recorder.checking_ops():
                            output = model(*args, **kwargs)
                    else:
                        with recorder.checking_ops():
                            output = model(*args, **kwargs)
            params_after, buffers_after = registered_tensors(model)
            # Normalisation kernels do not bump their statistics' versions: the record tells.
            norm_statistics = {id(b) for b in statistics.of(model)}
            reassigned = snapshot.reassigned()
            other_buffers_mutated = bool(reassigned) or any(id(b) not in norm_statistics for b in snapshot.mutated())
            # Buffers as device state between micro-batches (buffer_state.py): written with
            # autograd history, or reassigned.
            stateful_buffers = bool(reassigned) or any(has_history(b) for b in buffers_after.values())
        finally:
            recorder.close()
            snapshot.restore()
            assignments.restore()
            torch.random.set_rng_state(rng)
    plan = build_plan(recorder, settings)
    _check_parameters_unchanged(params_before, params_after)
    _check_buffers_kept(buffers_before, buffers_after)
    layout = DeviceLayout.of(plan, settings, serial=stateful_buffers)
    replica_buffers = SharedBuffers()
    if (norm_statistics or other_buffers_mutated) and geometry.replication_factor > 1:
        # Normalisation statistics may always differ between replicas, as on PopTorch.
        if settings.broadcast_buffers and other_buffers_mutated:
            raise errors.createPoptorchError(errors.BROADCAST_BUFFERS)
        if not layout.replicas_apart:  # replicas apart keep their own buffers
            replica_buffers = ReplicaBuffers(weights.buffers(), geometry.replication_factor)
    loss_index = None
    if training:
        loss = tracker.final_loss()
        flat, _ = flatten_output(output)
        loss_index = next((i for i, leaf in enumerate(flat) if leaf is loss), None)
    return Traced(plan, layout, replica_buffers, loss_index, training and loss_index is None, stateful_buffers)


def _check_buffers_kept(before, after):
    """A forward may write its buffers and reassign them (``self.buf = new``: its value is the
    buffer's from then on, ``buffer_state.py``), keeping their shape and dtype; not remove them."""
    for name, tensor in before.items():
        if name not in after:
            raise errors.createPoptorchError(errors.BUFFER_REMOVED.format(name=name))
        new = after[name]
        if new is not tensor and (new.shape != tensor.shape or new.dtype != tensor.dtype):
            raise errors.createPoptorchError(messages.BUFFER_RESHAPED.format(
                name=name, shape=list(new.shape), dtype=new.dtype, old_shape=list(tensor.shape),
                old_dtype=tensor.dtype))


def _check_parameters_unchanged(before, after):
    """Parameters are neither removed nor replaced by the forward."""
    for name, tensor in before.items():
        if name not in after:
            raise errors.createPoptorchError(errors.PARAMETER_REMOVED.format(name=name))
        if after[name] is not tensor:
            raise errors.createPoptorchError(errors.PARAMETER_REASSIGNED.format(name=name))
