"""``poptorch.profiling.Channel``: named timing regions, recorded in memory.

PopTorch wrote these to libpvti for PopVision; openpop keeps the records on the channel
(``channel.records``: ``(name, start, end)`` in seconds) so that reports can read them.
"""
import contextlib
import functools
import time


class Channel:
    def __init__(self, name: str):
        self.name = name
        self.records = []

    @contextlib.contextmanager
    def tracepoint(self, name: str):
        start = time.perf_counter()
        try:
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
