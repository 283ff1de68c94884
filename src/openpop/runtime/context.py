"""Which executor, if any, is running the model on this thread right now.

Ops such as ``for_loop`` and ``isRunningOnIpu()`` ask this module; the executor
enters ``running(...)`` around every trace and every host call.
"""
import threading

_local = threading.local()
_steps = 0  # steps begun by executors in this process (begin_step)


class RunContext:
    """What an op may need to know about the run it is part of."""

    def __init__(self, training: bool, tracing: bool = False):
        self.training = training
        self.tracing = tracing  # True during the compile pass, False while executing
        self.compiled = False  # the compiled backend's probe: the model runs as its program will


def current():
    """The innermost active ``RunContext``, or None outside an executor."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


def is_running() -> bool:
    return current() is not None


def is_training() -> bool:
    ctx = current()
    return ctx is not None and ctx.training


def running(training: bool, tracing: bool = False) -> "_Entered":
    """Context manager: a new ``RunContext`` is current inside (and returned by ``with``)."""
    return _Entered(RunContext(training, tracing))


class _Entered:
    """Makes a ``RunContext`` current while entered (a class, not a generator: entered on every
    compiled host call, where a generator's cost shows)."""
    __slots__ = ("_ctx",)

    def __init__(self, ctx):
        self._ctx = ctx

    def __enter__(self):
        stack = getattr(_local, "stack", None)
        if stack is None:
            stack = _local.stack = []
        stack.append(self._ctx)
        return self._ctx

    def __exit__(self, *exc_info):
        _local.stack.pop()


def resumed(ctx) -> "_Entered":
    """Make ``ctx`` current on this thread too (autograd's threads recomputing a forward)."""
    return _Entered(ctx)


def begin_step() -> None:
    """An executor starts a step (an optimizer step, or an inference step): ops whose effect is
    once per step (``custom_ops``' ExpMovAvg) apply it once per value of ``step_number()``."""
    global _steps
    _steps += 1


def step_number() -> int:
    """How many steps executors of this process have begun (0 before the first)."""
    return _steps
