"""Schedules: how one step's micro-batches run (the ``[DI, GA, R]`` order of ``geometry.py``).

A host call is ``device_iterations`` steps. For each, the executor calls ``start_step``,
``step`` (every micro-batch of the step) and ``finish_step`` (the gradient reduction; True when
the optimizer should apply the step); ``finish_call`` after the last. ``schedule_for`` chooses
the schedule once, at compile:

* ``Inference``: each replica's forward, one after another;
* ``SerialTraining``: forward and backward of each micro-batch in order, in the calling thread;
* ``ConcurrentStages``: on several devices, up to ``pipeline_stages`` micro-batches per replica
  device set in flight, one thread each (``pipeline.py``); gradients added in micro-batch order.

A model whose forward writes buffers with autograd history or reassigns them
(``Executable.stateful_buffers``) gets a ``buffer_state.BufferState``: each micro-batch ends with
its ``settle()`` (after the backward; inference: the forward), so the next one reads the buffers
as plain values, as on an IPU. Such a model's layout is serial (``DeviceLayout.of``).
"""
import contextlib
from dataclasses import dataclass

from . import context, half_saturation, trace
from .args import BoundInputs
from .buffer_state import BufferState
from .devices import SameDeviceOps, reset_boundary_frames
from .gradients import GradientReduction
from .half_saturation import SaturatingHalf
from .losses import LossTracker
from .outputs import OutputCollector, flatten_output


class MicroBatchInputs:
    """A host call's inputs as per-leaf ``[DI, GA, R_in, micro, ...]`` views (0-d values as
    they are); ``of(step, micro)`` gives one micro-batch's ``(args, kwargs)``."""

    def __init__(self, inputs: BoundInputs, geometry):
        self.inputs = inputs
        self.split = [(pos, inputs.leaves[pos] if inputs.leaves[pos].dim() == 0
                       else geometry.split(inputs.leaves[pos])) for pos in inputs.tensor_positions]
        self._leaves = list(inputs.leaves)

    def of(self, step: int, micro, own_leaves: bool = False):
        """Micro-batch ``micro`` (``geometry.MicroBatch``, its ``step`` ignored) of ``step``.
        ``own_leaves``: for a thread of its own (the serial schedules reuse one list)."""
        leaves = list(self.inputs.leaves) if own_leaves else self._leaves
        for pos, view in self.split:
            leaves[pos] = view if view.dim() == 0 else view[step, micro.accumulation, micro.chunk]
        return self.inputs.rebuild(leaves)


class LossForward:
    """A training micro-batch's forward: ``(output, loss)``."""

    def __init__(self, executable, precision):
        self.loss_index = executable.loss_index
        self.track_losses = executable.track_losses
        self.precision = precision

    def __call__(self, model, args, kwargs):
        if not self.track_losses:
            with self.precision.forward(model):
                output = model(*args, **kwargs)
            return output, flatten_output(output)[0][self.loss_index]
        tracker = LossTracker()
        context.current().loss_tracker = tracker
        with self.precision.forward(model), tracker:
            output = model(*args, **kwargs)
        return output, tracker.final_loss()


@dataclass
class CallState:
    """What one host call's steps work on."""

    inputs: MicroBatchInputs
    collector: OutputCollector
    gradients: GradientReduction  # training only


class SerialTraining:
    """Each micro-batch's forward and backward in turn, in the calling thread."""
    concurrent = False  # (the compiled unit 'regions' needs micro-batches one after another)

    def __init__(self, settings, executable, session, precision):
        self.geometry = settings.geometry
        self.micro_batches = _micro_batches_of_a_step(settings.geometry)
        self.replica_buffers = executable.replica_buffers
        self.replicas = session.replicas
        self.forward = LossForward(executable, precision)
        # The sum across processes may start during the step's last backward.
        self.overlaps_reduction = not self.replicas.own_weights
        self.buffer_state = _buffer_state(executable, session)

    def start_step(self, call: CallState) -> None:
        call.gradients.start_step(self.overlaps_reduction)
        self.replicas.start_step()
        if self.buffer_state is not None:
            self.buffer_state.start_step()

    def step(self, call: CallState, step: int) -> None:
        state = self.buffer_state
        for micro in self.micro_batches:
            self.replica_buffers.switch_to(micro.replica)
            args, kwargs = call.inputs.of(step, micro)
            with trace.span("forward"):
                output, loss = self.forward(self.replicas.model(micro.replica), args, kwargs)
            with trace.span("backward"):
                call.gradients.backward(loss)
            if state is not None:
                state.settle()
            if call.collector.wants(step, micro.accumulation):
                call.collector.add(micro.replica, output)

    def finish_step(self, call: CallState) -> bool:
        with trace.span("gradient_reduction"):
            return call.gradients.finish_step()

    def finish_call(self, call: CallState) -> None:
        call.gradients.finish_call()


class ConcurrentStages(SerialTraining):
    """One step's micro-batches with up to ``pipeline_stages`` per replica device set in flight
    (several devices); each micro-batch's gradients join the step's in micro-batch order."""
    concurrent = True  # (the compiled unit 'regions' needs micro-batches one after another)

    def __init__(self, settings, executable, session, precision):
        super().__init__(settings, executable, session, precision)
        self.session = session
        self.multi_device = executable.layout.multi_device
        replicas = self.geometry.replication_factor
        self.visits = [executable.plan.device_visits(r) for r in range(replicas)]
        self.overlaps_reduction = False

    def step(self, call: CallState, step: int) -> None:
        order = self.micro_batches
        locks = self.session.locks
        locks.start_step([self.visits[micro.replica] for micro in order])
        own_weights = self.replicas.own_weights
        gradients = call.gradients
        trained = gradients.leaves_of(self.replicas.models)
        saturating = half_saturation.active()  # (the caller's dispatch mode does not reach the pool's threads)

        def task(index):
            micro = order[index]
            try:
                locks.begin_micro_batch(index)
                args, kwargs = call.inputs.of(step, micro, own_leaves=True)
                # Torch function modes are per thread: enter SameDeviceOps here, not only in the caller.
                with context.running(True), SameDeviceOps() if self.multi_device else contextlib.nullcontext(), \
                        SaturatingHalf() if saturating else contextlib.nullcontext():
                    with trace.span("forward"):
                        output, loss = self.forward(self.replicas.model(micro.replica), args, kwargs)
                    locks.end_micro_batch()  # the forward is done: later micro-batches may pass
                    with trace.span("backward"):
                        gradients.backward_in_order(loss, index, trained[micro.replica if own_weights else 0])
            finally:
                # A forward abandoned part-way (its hooks removed under it) must not keep a lock.
                locks.release_all()
                reset_boundary_frames()
                gradients.release_turn(index)
            return output

        outputs = self.session.micro_batch_pool().run(len(order), task)
        for micro, output in zip(order, outputs):
            if call.collector.wants(step, micro.accumulation):
                call.collector.add(micro.replica, output)


class Inference:
    """Each replica's forward in turn; no gradients."""
    concurrent = False  # (the compiled unit 'regions' needs micro-batches one after another)

    def __init__(self, settings, executable, session, precision):
        self.micro_batches = _micro_batches_of_a_step(settings.geometry)
        self.replica_buffers = executable.replica_buffers
        self.replicas = session.replicas
        self.precision = precision
        self.buffer_state = _buffer_state(executable, session)

    def start_step(self, call: CallState) -> None:
        if self.buffer_state is not None:
            self.buffer_state.start_step()

    def step(self, call: CallState, step: int) -> None:
        keep = call.collector.wants(step, 0)
        state = self.buffer_state
        for micro in self.micro_batches:
            self.replica_buffers.switch_to(micro.replica)
            args, kwargs = call.inputs.of(step, micro)
            model = self.replicas.model(micro.replica)
            with self.precision.forward(model), trace.span("forward"):
                output = model(*args, **kwargs)
            if state is not None:
                state.settle()
            if keep:
                call.collector.add(micro.replica, output)

    def finish_step(self, call: CallState) -> bool:
        return False

    def finish_call(self, call: CallState) -> None:
        pass


def _buffer_state(executable, session):
    """The ``BufferState`` of a model whose buffers carry state between micro-batches, else None."""
    return BufferState(session.replicas.models) if executable.stateful_buffers else None


def _micro_batches_of_a_step(geometry):
    """A step's micro-batches in order (every step has the same: computed once)."""
    return list(geometry.micro_batches(0))


def schedule_for(settings, executable, session, precision):
    if not settings.training:
        return Inference(settings, executable, session, precision)
    # Per-replica buffers swap in and out of the live ones: their micro-batches cannot overlap.
    if executable.layout.concurrent and not executable.replica_buffers.per_replica:
        return ConcurrentStages(settings, executable, session, precision)
    return SerialTraining(settings, executable, session, precision)
