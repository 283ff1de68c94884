"""Tracing host calls: openpop's spans on ``torch.profiler``, one track per virtual IPU.

A ``TraceSession`` (``openpop.runtime.trace.TraceSession(directory, calls=...)``, or
``POPLAR_ENGINE_OPTIONS='{"autoReport.all":"true","autoReport.directory":"DIR"}'`` as on IPUs,
or ``Options.enableProfiling(DIR)``) records a window of host calls with ``torch.profiler`` —
operator-level events included, on every thread — plus openpop's own ``record_function`` spans:

* ``openpop:host_call``, ``openpop:forward``, ``openpop:backward``, ``openpop:gradient_reduction``,
  ``openpop:optimizer_step``, ``openpop:output_collection`` (placed by the executor with
  ``span(name)``), ``openpop:all_reduce`` (poprun, ``spanned``), ``openpop:dataloader_wait``
  (the loader's ``next()`` while the profiler runs, between recorded calls too: ``window_span``);
* per pipeline stage and micro-batch, ``openpop:ipu<I>:stage<S>:<forward|backward>:mb<M>:step<D>``
  (``stage_spans.py``; per thread, so concurrent micro-batches get theirs too).

While a training call is recorded, ``activation_memory.py`` measures the peak activation bytes
per virtual IPU (saved-tensor hooks, entered with the forward and backward spans). Where micro-
batches run one after another, the profiler records the calling thread with the allocator's
memory events (``profile_memory``: the report's memory over time per virtual IPU); where they run
concurrently, every thread, without memory events (torch records none then). The report also
gets the model's options and compile breakdown (``report_inputs.py``) and leaves its warm-up
calls out (``warmup``).

When the window closes the Chrome-trace JSON is rewritten so that stage spans sit on one
track (``tid``) per virtual IPU, named by metadata events, and ``report.json`` / ``report.html``
are written next to it (``openpop.report``).

Tracing off costs one global read per span: no profiler is entered and no hooks are installed.
The window counts host calls of each executor from 0; ``POPLAR_ENGINE_OPTIONS``'s
``autoReport.executionProfileProgramRunCount`` (Poplar's "how many runs to profile", default
2 here) sets how many calls the environment-driven session records, and
``openpop.firstProfiledRun`` (default 0) the first one. Under poprun each instance reports to
``<directory>/instance<i>``.
"""
import atexit
import contextlib
import functools
import json
import os
import sys
import threading
import time
import weakref

import torch

from .. import errors
from ..log import logger
from ..report_writer import REPORT_HTML, TRACE_FILE, write_report
from . import messages, profiler_control, report_inputs
from .activation_memory import ActivationMemory, CudaPeaks
from .engine_options import (  # noqa: F401
    ENGINE_OPTIONS_ENV,
    FIRST_RUN_KEY,
    KNOWN_AUTOREPORT_KEYS,
    WARMUP_KEY,
    count_option,
    directory_option,
    parse_engine_options,
    truthy,
)
from .memory_per_ipu import memory_per_ipu
from .stage_spans import (  # noqa: F401
    SPAN_PREFIX,
    StageSpans,
    parse_stage_span,
    stage_of_block,
    tracks_per_ipu,
)

DEFAULT_ENV_CALLS = 2

_NO_SPAN = contextlib.nullcontext()
_active = []             # TraceSessions activated by the user or a strategy
_recording = None        # the session recording the host call running now, or None
_profiling = None        # the session whose profiler runs now (between its recorded calls too)
_configured = weakref.WeakKeyDictionary()  # executor -> its session from engine options, or None
_by_directory = {}        # directory -> the session engine options chose for it


def span(name: str):
    """A ``record_function`` span ``openpop:<name>`` while a session records, else a no-op."""
    session = _recording
    if session is None:
        return _NO_SPAN
    return session.span(name)


def restart_call() -> None:
    """The recorded host call runs again from its start (``eager._host_call``): its micro-batches
    and steps are numbered from 0 again."""
    session = _recording
    if session is not None and session.stage_spans is not None:
        session.stage_spans.restart()


def window_span(name: str):
    """A span ``openpop:<name>`` while a session's profiler runs, inside or between recorded
    host calls (the data loader's wait), else a no-op."""
    if _profiling is None:
        return _NO_SPAN
    return torch.profiler.record_function(SPAN_PREFIX + name)


def spanned(name: str):
    """Decorates a function called inside host calls: a span ``openpop:<name>`` around it."""
    def decorate(function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            if _recording is None:
                return function(*args, **kwargs)
            with span(name):
                return function(*args, **kwargs)
        return wrapper
    return decorate


class WaitSpans:
    """A data loader's iterator whose every ``next()`` is an ``openpop:dataloader_wait`` span
    while a session's profiler runs (``window_span``)."""

    def __init__(self, iterator):
        self._iterator = iterator

    def __iter__(self):
        return self

    def __next__(self):
        with window_span("dataloader_wait"):
            return next(self._iterator)

    def __len__(self):
        return len(self._iterator)

    def __getattr__(self, name):
        return getattr(self._iterator, name)


def user_span(name: str):
    """A ``record_function`` span named ``name`` (no prefix) while a session records a host
    call, else a no-op: ``poptorch.profiling.Channel.tracepoint`` uses it."""
    if _recording is None:
        return _NO_SPAN
    return torch.profiler.record_function(name)


def _session_for(executor):
    """The session that records ``executor``'s host calls (the latest accepting one), or None."""
    for candidate in _active:
        if candidate.accepts(executor):
            return candidate
    return _session_from_engine_options(executor)


def records_next_call(executor) -> bool:
    """Whether ``executor``'s next host call falls in a trace session's window."""
    session = _session_for(executor)
    return session is not None and session.wants_next_call(executor)


def watches(executor) -> bool:
    """Whether a trace session records or counts ``executor``'s host calls."""
    return _session_for(executor) is not None


def count_untraced_call(executor) -> None:
    """A host call ran outside ``host_call`` (the compiled backend): it still counts towards
    the window's call indices."""
    session = _session_for(executor)
    if session is not None:
        session.call_counts[executor] = session.call_counts.get(executor, 0) + 1


def host_call(run):
    """Decorates the executor's ``_run``: one host call."""
    @functools.wraps(run)
    def traced(executor, inputs, compiled, *rest):
        session = _session_for(executor)
        if session is None:
            return run(executor, inputs, compiled, *rest)
        return session.run_call(run, executor, inputs, compiled, *rest)
    return traced


# ---------------------------------------------------------------------- configuration
def session_from_engine_options(options: dict, instance=None, model=None):
    """A TraceSession if ``autoReport.all`` (or ``outputExecutionProfile``) is on, else None.
    A model reports to ``<autoReport.directory>/<model>`` (``Options.modelName``, default
    "training" or "inference", as PopTorch names them); under poprun (``instance``: this
    process's index) each instance to ``.../instance<i>`` below that."""
    if not (truthy(options.get("autoReport.all", False))
            or truthy(options.get("autoReport.outputExecutionProfile", False))):
        return None
    directory = directory_option(options, "autoReport.directory")
    if model is not None:
        directory = os.path.join(directory, model)
    if instance is not None:
        directory = os.path.join(directory, f"instance{instance}")
    count = count_option(options, "autoReport.executionProfileProgramRunCount", DEFAULT_ENV_CALLS)
    first = count_option(options, FIRST_RUN_KEY, 0)
    warmup = count_option(options, WARMUP_KEY, 0) if WARMUP_KEY in options else None
    session = TraceSession(directory, calls=range(first, first + count), activate=False, warmup=warmup)
    session.announce = True
    return session


def _session_from_engine_options(executor):
    """The session ``POPLAR_ENGINE_OPTIONS`` (which wins, as on IPUs) or the executor's
    ``Options.enableProfiling`` asks for; decided on the executor's first host call. Executors
    reporting to one directory share one session (one trace)."""
    try:
        return _configured[executor]
    except KeyError:
        pass
    options = parse_engine_options(os.environ.get(ENGINE_OPTIONS_ENV, ""))
    if not options:
        options = dict(executor._settings.engine_options)
    distributed = executor.options.Distributed
    named = executor.options.exists("model_name") and executor.options.model_name
    model = named or ("training" if executor.training else "inference")
    wanted = session_from_engine_options(
        options, instance=distributed.processId if distributed.numProcesses > 1 else None, model=model)
    session = None
    if wanted is not None:
        session = _by_directory.get(wanted.directory)
        if session is None or session.written:
            session = _by_directory[wanted.directory] = wanted
            atexit.register(session.close)  # a run shorter than the window still gets its report
    _configured[executor] = session
    return session


def reset_environment_session() -> None:
    """Close and forget the sessions engine options started (tests, or after changing
    ``POPLAR_ENGINE_OPTIONS``)."""
    for session in list(_by_directory.values()):
        session.close()
    _by_directory.clear()
    _configured.clear()


# ---------------------------------------------------------------------- the session
class TraceSession:
    """Records host calls ``calls`` (indices per executor, from 0) into ``directory``.

    Use as a context manager, or call ``close()``: the trace and report are written when the
    last call of the window has run, or at ``close()``. ``accepts(executor)`` limits it to some
    executors; several sessions may be active (the latest accepting one records a call).
    ``warmup``: the report leaves each model's first ``warmup`` host calls out of its timeline
    and statistics (None: ``report.DEFAULT_WARMUP``, 1); ``openpop-report --warmup N`` changes it."""

    def __init__(self, directory, calls=range(1), activate=True, accepts=None, warmup=None):
        self.directory = os.fspath(directory)
        self._accepts = accepts  # executor -> bool: which executors this session records
        _check_writable(self.directory)
        self.calls = calls
        self.profiler = None
        self.stage_spans = None
        self.call_counts = weakref.WeakKeyDictionary()
        self.host_calls = []      # one summary per recorded host call
        self.plan = None
        self.options = {}
        self.memory = []
        self.activations = None   # ActivationMemory of the host call recorded now
        self.activation_peaks = {}  # virtual IPU -> peak activation bytes over the recorded calls
        self.device_peaks = {}      # virtual IPU -> its CUDA device's peak allocated bytes
        self.written = False
        self.untraced = None      # why the trace has no operator events, if it has none
        self.notes = []           # what the report's reader should know (trace.json's "openpop")
        self.announce = False     # print where the report is (sessions engine options asked for)
        self.warmup = warmup      # host calls the report leaves out (None: its default)
        self.compile = {}         # the compile breakdown (report_inputs.compile_breakdown)
        self._last_call = max(calls) if len(calls) else -1
        if activate:
            self.activate()

    def activate(self):
        if self not in _active:
            _active.insert(0, self)
        return self

    def accepts(self, executor) -> bool:
        return self._accepts is None or bool(self._accepts(executor))

    def __enter__(self):
        return self.activate()

    def __exit__(self, *exc):
        self.close()

    def span(self, name):
        if name == "backward" and self.stage_spans is not None:
            function = self.stage_spans.backward_span()
        else:
            function = torch.profiler.record_function(SPAN_PREFIX + name)
        if name in ("forward", "backward") and self.activations is not None:
            return _with_saved_tensor_hooks(function, self.activations)
        return function

    def wants_next_call(self, executor) -> bool:
        return self.call_counts.get(executor, 0) in self.calls and not self.written

    def run_call(self, run, executor, inputs, compiled, *rest):
        index = self.call_counts.get(executor, 0)
        self.call_counts[executor] = index + 1
        if index not in self.calls or self.written:
            return run(executor, inputs, compiled, *rest)
        global _recording
        if self.profiler is None and not self.untraced:
            # Concurrent micro-batches run on worker threads: every thread is recorded then. So is
            # a call made on a thread other than the main one (Lightning's replicas in manual
            # optimization): torch's per-thread profiler must be stopped on the thread that started
            # it, and the session may close on another (its events are lost, and torch warns
            # "Requested callback is not found" / "Leaked callback handle").
            concurrent = getattr(getattr(compiled, "layout", None), "concurrent", True)
            self._start_profiler(all_threads=concurrent or threading.current_thread() is not threading.main_thread())
        self.plan = compiled.plan
        self.options = report_inputs.options_of(executor.options)
        self.compile = report_inputs.compile_breakdown(executor)
        geometry = executor._geometry
        self.stage_spans = StageSpans(executor._model, compiled.plan, geometry.micro_batches_per_step)
        if executor.training:
            ipus = compiled.plan.ipus_per_replica if compiled.plan is not None else 1
            self.activations = ActivationMemory(executor._model, ipus, self.stage_spans.current_ipu)
        _recording = self
        device_peaks = CudaPeaks(compiled.plan)
        started = time.perf_counter()
        try:
            with torch.profiler.record_function(f"{SPAN_PREFIX}host_call:{index}"), \
                    self.stage_spans, device_peaks:
                result = run(executor, inputs, compiled, *rest)
        finally:
            seconds = time.perf_counter() - started
            _recording = None
            self.stage_spans = None
            if self.activations is not None and self.activations.measured:
                for ipu, peak in enumerate(self.activations.peak):
                    self.activation_peaks[ipu] = max(self.activation_peaks.get(ipu, 0), peak)
            self.activations = None
            for ipu, peak in device_peaks.per_ipu().items():
                self.device_peaks[ipu] = max(self.device_peaks.get(ipu, 0), peak)
        self.memory = memory_per_ipu(executor._model, compiled.plan, getattr(executor, "_optimizer", None),
                                     self.activation_peaks, self.device_peaks)
        self.host_calls.append(report_inputs.host_call_summary(index, seconds, executor.getPerfCounters(),
                                                               report_inputs.samples_of(inputs), executor.training))
        if index >= self._last_call:
            self.close()
        return result

    def _start_profiler(self, all_threads=True):
        """Start this session's ``torch.profiler``. torch runs one profiler per process: a
        second one started while another runs takes its events, and exporting the first then
        crashes the process. So a session of openpop's that is still open hands over (its window
        ends early and it writes what it recorded), and where a profiler openpop did not start
        runs (the user's own), this session records host calls without operator events."""
        global _profiling
        if _profiling is not None and _profiling is not self:
            logger.info(messages.TRACE_WINDOW_HANDED_OVER, _profiling.directory, self.directory)
            _profiling.notes.append(messages.TRACE_WINDOW_HANDED_OVER % (_profiling.directory, self.directory))
            _profiling.close()
        if profiler_control.profiler_running():
            self.untraced = messages.TRACE_FOREIGN_PROFILER
            logger.warning(messages.TRACE_WITHOUT_OPERATORS, self.directory, self.untraced)
            return
        self.profiler = profiler_control.start_profiler(all_threads)
        if all_threads:
            self.notes.append(messages.TRACE_NO_MEMORY_EVENTS)
        _profiling = self

    def close(self):
        if self in _active:
            _active.remove(self)
        if self.written or (self.profiler is None and not self.host_calls):
            return
        global _profiling
        if _profiling is self:
            _profiling = None
        self.written = True
        try:
            if self.profiler is not None and profiler_control.profiler_running():
                with profiler_control.native_stderr_quiet():
                    self.profiler.stop()
            elif self.profiler is not None:  # another profiler ran and stopped: ours is gone
                self.untraced = messages.TRACE_TAKEN_OVER
            self._write()
        except Exception as exc:  # a failed report never fails training
            logger.warning(messages.REPORT_WRITE_FAILED, self.directory, exc)

    def _operator_trace(self) -> dict:
        """The profiler's Chrome trace, or an empty one where it has no events to give."""
        if self.profiler is not None and not self.untraced and not profiler_control.has_results(self.profiler):
            self.untraced = messages.TRACE_TAKEN_OVER
        if self.untraced:
            if self.profiler is not None:  # the foreign profiler was warned about when met
                logger.warning(messages.TRACE_WITHOUT_OPERATORS, self.directory, self.untraced)
            self.notes.append(messages.TRACE_WITHOUT_OPERATORS % (self.directory, self.untraced))
            return {"traceEvents": []}
        raw = os.path.join(self.directory, "trace.raw.json")
        self.profiler.export_chrome_trace(raw)
        with open(raw) as stream:
            trace = json.load(stream)
        os.remove(raw)
        return trace

    def _write(self):
        os.makedirs(self.directory, exist_ok=True)
        trace = tracks_per_ipu(self._operator_trace(), self.plan)
        if self.notes:
            trace["openpop"] = {"notes": self.notes}
        path = os.path.join(self.directory, TRACE_FILE)
        with open(path, "w") as stream:
            json.dump(trace, stream)
        write_report(self.directory, trace, self.plan, self.host_calls, self.options, self.memory,
                     compile=self.compile, warmup=self.warmup)
        logger.info("openpop profile: %s", path)
        if self.announce:  # the user asked for it with engine options: say where it is
            print(messages.REPORT_WRITTEN.format(path=os.path.join(self.directory, REPORT_HTML)),
                  file=sys.stderr, flush=True)


@contextlib.contextmanager
def _with_saved_tensor_hooks(function, activations):
    """``function`` (a span) with ``activations``' hooks; where saved-tensor hooks are disabled
    (``torch.autograd.graph.disable_saved_tensors_hooks``) the span alone, peaks unmeasured."""
    with function:
        hooks = activations.hooks()
        try:
            hooks.__enter__()
        except RuntimeError:
            activations.measured = False
            yield
            return
        try:
            yield
        finally:
            hooks.__exit__(None, None, None)


def _check_writable(directory: str) -> None:
    try:
        os.makedirs(directory, exist_ok=True)
        probe = os.path.join(directory, ".openpop-write-test")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as exc:
        raise errors.createPoptorchError(
            messages.REPORT_NOT_WRITABLE.format(directory=directory, reason=exc.strerror)) from None
