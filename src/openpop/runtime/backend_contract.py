"""The backend contract: what the executor asks of whatever runs its host calls.

A backend gets a ``CallView`` (``call_view.py``: settings, geometry, model, optimizer, precision,
session; read-only), the call's bound inputs and the ``Executable`` built at compile, and either
runs the whole host call, returning its outputs, or declines it (``DECLINED``) having changed
nothing. The eager backend (``eager.py``) is the reference: it runs every call and defines the
results the others must equal. The compiled backend (``compiled/``) runs a call as one compiled
program, or answers ``REGIONS``: the eager backend runs it inside the compiled backend's
``eager_context`` (its compiled regions installed). ``dispatch.py`` is the one place that asks them,
in that order.
"""
import abc
import contextlib

DECLINED = object()  # a backend's answer to a host call another backend must run
RETRACED = object()  # the compiled backend's program was traced again: built again, then the call runs
REGIONS = object()  # ... that the eager backend runs inside the backend's eager_context()


class Backend(abc.ABC):
    """One way to run host calls (see the module docstring).

    Attributes:
        name (str): How logs and ``Dispatch.last`` name it.
        last_run: The perf counters of the last host call it ran (``perf.py``: a dict of
            per-step timestamps or ``UniformCounters``).
        last_run_seconds (float): That call's wall time.
    """

    name = "backend"

    def __init__(self):
        self.last_run = None
        self.last_run_seconds = None

    @abc.abstractmethod
    def run(self, call, inputs, executable):
        """Run one host call.

        Args:
            call (CallView): The executor's state, read-only.
            inputs (BoundInputs): The call's inputs, on their devices.
            executable (Executable): What the compile built (plan, weights, anchors).

        Returns:
            The host call's outputs, ``DECLINED`` or ``REGIONS`` (module docstring).
        """

    def compile_ahead(self, call, inputs, executable) -> None:
        """``executor.compile()``: build what the first call needs, running nothing."""
        return None

    def eager_context(self, call):
        """The context the eager backend runs a call in after this backend answered ``REGIONS``."""
        return contextlib.nullcontext()

    def reset(self) -> None:
        """The executor was destroyed: forget what was built for it."""
        return None
