"""The eager backend: the reference every other backend must equal.

One host call runs ``device_iterations`` steps; per step the schedule (``schedules.py``) runs its
micro-batches, the ``GradientReduction`` (``gradients.py``) turns their gradients into the step's
and says whether the optimizer applies it; anchors and outputs are collected as the output mode
asks.
"""
import contextlib
import time

import torch

from ..torch_compat import pytree
from . import context, trace
from .backend_contract import Backend
from .compiled.generator_states import RngState
from .gradients import GradientReduction, MeanPolicy, ReplicaSum
from .half_saturation import HalfOverflow
from .outputs import OutputCollector
from .perf import PerfRecorder
from .schedules import CallState, MicroBatchInputs
from .weights import BufferSnapshot


class EagerBackend(Backend):
    """Runs host calls with PyTorch's eager ops, one micro-batch after another."""

    name = "eager"

    def run(self, call, inputs, executable, around=None):
        """The host call (``Backend.run``); ``around``: a context it runs in (compiled regions)."""
        return _host_call(call.identity, inputs, executable, call, self, around)

    def run_once(self, call, inputs, executable, around, watching):
        """The host call run once (``watching``: for a float16 overflow, see ``_host_call``)."""
        session, training, precision = call.session, call.training, call.precision
        host_call = session.host_call(call.optimizer, precision) if training else contextlib.nullcontext()
        started = time.perf_counter()
        with session.running(training, precision, host_call), \
                contextlib.nullcontext() if training else torch.no_grad(), \
                around if around is not None else contextlib.nullcontext(), \
                precision.saturating(call.model, watching):
            result = _steps(inputs, executable, call, self, host_call, watching)
        self.last_run_seconds = time.perf_counter() - started
        return result


def _all_finite(tensors) -> bool:
    return not tensors or bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all())


def _half_tensors(result):
    return [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor) and t.dtype == torch.float16]


@trace.host_call
def _host_call(executor, inputs, executable, call, backend, around):
    """One host call (``executor``: the key a trace session knows the calls by): a float16 call
    that overflows runs again saturating, within the same traced call."""
    precision, model = call.precision, call.model
    # Training: the host-call transaction puts everything back. Inference: this puts back the
    # model's buffers and torch's generators; replicas' own buffers or weights it does not.
    rerun_possible = call.settings.rollback_failed_calls if call.training else \
        not (executable.replica_buffers.per_replica or call.session.replicas.own_weights)
    if not precision.watches_half_overflow(model, rerun_possible):
        return backend.run_once(call, inputs, executable, around, watching=False)
    # A float16 model runs without saturation until a call overflows (half_saturation.py)
    generators = None if call.training else RngState()
    buffers = None if call.training else BufferSnapshot(list(model.buffers()), model)
    try:
        result = backend.run_once(call, inputs, executable, around, watching=True)
        if call.training or _all_finite(_half_tensors(result)):
            return result
    except HalfOverflow:  # (a training call: rolled back before its update)
        pass
    if buffers is not None:
        generators.restore()
        buffers.restore()
    restart = getattr(model, "openpop_restart_host_call", None)  # a front-end's per-call records (Lightning's logs)
    if restart is not None:
        restart()
    precision.start_saturating()
    trace.restart_call()
    return backend.run_once(call, inputs, executable, around, watching=False)


def _steps(inputs, executable, call, backend, host_call, watching):
    """The host call's steps (``watching``: for float16 overflow, ``half_saturation.py``)."""
    geometry, schedule = call.geometry, call.schedule
    gradients = _gradients(call, executable, watching) if call.training else None
    state = CallState(MicroBatchInputs(inputs, geometry), OutputCollector(
        call.settings.output_mode, call.settings.output_return_period, geometry), gradients)
    perf = PerfRecorder()
    executable.anchors.start_call()
    for step in range(geometry.device_iterations):
        perf.start()
        context.begin_step()
        schedule.start_step(state)
        schedule.step(state, step)
        if schedule.finish_step(state):
            with trace.span("optimizer_step"):
                host_call.update(step, call.precision.optimizer_step, call.optimizer)
        if executable.anchors:
            executable.replica_buffers.switch_to(0)  # anchored buffers are replica 0's, as the host's
            executable.anchors.record(step, geometry.device_iterations)
        perf.computed()
    schedule.finish_call(state)
    executable.replica_buffers.switch_to(0)
    executable.anchors.finish_call()
    with trace.span("output_collection"):
        result = state.collector.result()
    backend.last_run = perf.finish()
    return result


def _gradients(call, executable, watch_overflow):
    """The call's gradient reduction (training)."""
    optimizer, geometry = call.optimizer, call.geometry
    params = [p for group in optimizer.param_groups for p in group["params"]]
    scaler = call.precision.loss_scaler(optimizer)
    replicas = call.session.replicas
    policy = MeanPolicy.choose(call.settings, params, scaler.automatic, replicas.own_weights)
    trainable = executable.trainable
    return GradientReduction(
        policy, geometry.micro_batches_per_step, params, scaler, trainable=trainable,
        replica_sum=ReplicaSum(replicas, call.processes, trainable, geometry.micro_batches_per_step),
        watch_overflow=watch_overflow)
