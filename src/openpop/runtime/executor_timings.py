"""``ExecutorTimings``: PopTorch's timing API of an executor - how long its compile and its last
host call took (``compilationTime``, ``cycleCount``, ``getPerfCounters``, the latencies).

The executor keeps the compile's seconds; the backend that ran the last host call keeps that
call's counters (``dispatch.py``: ``Dispatch.last_run``).
"""
import copy
import datetime

from .. import errors
from .perf import as_counters, empty_counters, latency


class ExecutorTimings:
    """Mixed into ``PoplarExecutor`` (reads its ``_executable``, ``_settings``, ``_dispatch`` and
    ``_compile_seconds``)."""

    def compilationTime(self) -> datetime.timedelta:
        """How long the compile took.

        Returns:
            datetime.timedelta: The compile's duration.

        Raises:
            poptorch.Error: Not compiled, or compiled with the progress bar turned off
                (``compileSeconds()`` works either way).
        """
        if self._executable is None:
            raise errors.createPoptorchError(errors.COMPILE_TIME_NOT_COMPILED)
        if not self._settings.show_compilation_progress_bar:
            raise errors.createPoptorchError(errors.COMPILE_TIME_NO_BAR)
        return datetime.timedelta(seconds=self.compileSeconds())

    def compileSeconds(self):
        """openpop extension: seconds the compile pass took (None before compile); unlike
        ``compilationTime()`` it does not need the progress bar option."""
        return None if self._executable is None else self._compile_seconds + self._dispatch.compiled.compile_seconds

    def cycleCount(self) -> int:
        """Wall time of the last host call in cycles of a 1.85 GHz IPU clock (there is no IPU)."""
        if not self._settings.cycle_counter:
            raise errors.createPoptorchError(errors.CYCLE_COUNT_DISABLED)
        seconds = self._dispatch.last_run_seconds
        if seconds is None:
            raise errors.createPoptorchError(errors.CYCLE_COUNT_NOT_RUN)
        return int(seconds * 1.85e9)

    def _perf_counters(self) -> dict:
        perf = self._dispatch.last_run
        return empty_counters() if perf is None else as_counters(perf)

    def getPerfCounters(self):
        """Per-step timestamps (seconds since the epoch) of the last host call, by input tensor."""
        return copy.deepcopy(self._perf_counters())

    def getHostIpuLatency(self):
        """Latency of the last call's steps, from the inputs' arrival to their transfer's end (host to device).

        Returns:
            tuple: ``(minimum, maximum, mean)`` seconds over the steps; zeros before a call.
        """
        return latency(self._perf_counters(), "input", "input_complete")

    def getComputeLatency(self):
        """Latency of the last call's steps, from the inputs' transfer's end to the outputs (compute).

        Returns:
            tuple: ``(minimum, maximum, mean)`` seconds over the steps; zeros before a call.
        """
        return latency(self._perf_counters(), "input_complete", "output")

    def getIpuHostLatency(self):
        """Latency of the last call's steps, from the outputs to their transfer's end (device to host).

        Returns:
            tuple: ``(minimum, maximum, mean)`` seconds over the steps; zeros before a call.
        """
        return latency(self._perf_counters(), "output", "output_complete")

    def getLatency(self):
        """Latency of the last call's steps, from the inputs' arrival to the outputs' transfer's end.

        Returns:
            tuple: ``(minimum, maximum, mean)`` seconds over the steps; zeros before a call.
        """
        return latency(self._perf_counters(), "input", "output_complete")
