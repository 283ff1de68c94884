"""``poptorch.profiling.Channel``: named timing regions, recorded in memory.

PopTorch wrote these to libpvti for PopVision; openpop keeps the records on the channel
(``channel.records``: ``(name, start, end)`` in seconds) so that reports can read them, and
while a host call is traced (``TraceSession``) a tracepoint is also a ``<channel>:<name>`` span
in the trace.
"""
import contextlib
import functools
import time

from .runtime.trace import TraceSession, user_span  # noqa: F401  (poptorch.profiling.TraceSession)


class Channel:
    def __init__(self, name: str):
        self.name = name
        self.records = []

    @contextlib.contextmanager
    def tracepoint(self, name: str):
        start = time.perf_counter()
        try:
            with user_span(f"{self.name}:{name}"):
                yield
        finally:
            self.records.append((name, start, time.perf_counter()))

    def instrument(self, obj, *methods):
        """Time every call of ``obj.<method>`` for the given method names."""
        for method_name in methods:
            original = getattr(obj, method_name)

            @functools.wraps(original)
            def timed(*args, _original=original, _name=method_name, **kwargs):
                with self.tracepoint(_name):
                    return _original(*args, **kwargs)

            setattr(obj, method_name, timed)
        return obj
