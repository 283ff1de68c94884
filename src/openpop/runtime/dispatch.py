"""Which backend runs a host call: the one place that decides.

In order: the compiled backend's fast path for a call like its last one (``compiled/repeat_call.py``);
the compiled backend, unless the call falls in a trace window (a compiled program has no stages
to trace: traced calls run eagerly, with the same results); else the eager backend, the reference
(``eager.py``), on its own or with the compiled regions installed. Whenever the backend that runs
the calls changes, one log line says which and why. A host call that may have run compiled code
leaves no empty functorch state on its thread (``compiled/functorch_state.py``): eager backwards
after it keep their speed.
"""
from ..log import logger
from . import messages, trace
from .backend_contract import DECLINED, REGIONS
from .compiled import CompiledBackend, functorch_state
from .eager import EagerBackend


class Dispatch:
    """One executor's backends and the choice between them (see the module docstring).

    Attributes:
        compiled (CompiledBackend): Runs calls as compiled programs or regions.
        eager (EagerBackend): Runs every call the compiled backend declines.
        ran: The backend that ran the last host call (None before one).
    """

    def __init__(self, options):
        self.compiled = CompiledBackend(options)
        self.eager = EagerBackend()
        self.ran = None
        self._told = None  # what the last log line said runs the calls

    @property
    def last_run(self):
        """The perf counters of the last host call (``perf.py``), or None before one."""
        return None if self.ran is None else self.ran.last_run

    @property
    def last_run_seconds(self):
        """The wall time of the last host call, or None before one."""
        return None if self.ran is None else self.ran.last_run_seconds

    def repeat(self, call, args):
        """The compiled backend's fast path: the call's outputs, or ``DECLINED`` (nothing changed)."""
        repeat = self.compiled.repeat
        if repeat is None:
            return DECLINED
        absent = functorch_state.present() is False
        try:
            result = repeat.run(call, args)
        finally:
            functorch_state.drop_if_empty(absent)
        if result is not DECLINED:
            self.ran = self.compiled
        return result

    def run(self, call, inputs, executable):
        """One host call on the backend that can run it (module docstring)."""
        if self.compiled.selection.backend == "eager":
            return self._run(call, inputs, executable)
        try:
            return self._run(call, inputs, executable)
        finally:
            functorch_state.drop_if_empty()

    def _run(self, call, inputs, executable):
        traced = trace.records_next_call(call.identity)
        result = DECLINED if traced else self.compiled.run(call, inputs, executable)
        self.compiled.finish_progress()  # (a call that did not compile: the executor's compile is over)
        if result is not DECLINED and result is not REGIONS:
            self._ran(self.compiled, "a compiled program")
            trace.count_untraced_call(call.identity)
            return result
        regions = result is REGIONS
        self._ran(self.eager, "with compiled regions" if regions else self._eager_reason(traced))
        around = self.compiled.eager_context(call) if regions else None
        result = self.eager.run(call, inputs, executable, around)
        self.compiled.record_eager(regions)
        return result

    def compile_ahead(self, call, inputs, executable) -> None:
        """``executor.compile()``: the compiled backend builds its program now when it will run it."""
        try:
            self.compiled.compile_ahead(call, inputs, executable)
        finally:
            functorch_state.drop_if_empty()

    def reset(self) -> None:
        """The executor was destroyed."""
        self.compiled.reset()
        self.eager.reset()

    def _eager_reason(self, traced: bool) -> str:
        selection = self.compiled.selection
        if traced:
            return "a traced call"
        if selection.backend == "eager":
            return "openpopBackend('eager')"
        if selection.not_paying is not None:
            return "auto: compiling would not pay"
        if selection.declined is not None:
            return "the compiled backend declined the model"
        return "auto: until compiling pays"

    def _ran(self, backend, why: str) -> None:
        self.ran = backend
        told = (backend.name, why)
        if told != self._told:
            self._told = told
            logger.info(messages.HOST_CALLS_RUN_ON, backend.name, why)
