"""The process's one ``torch.profiler`` as openpop's trace sessions use it: whether one runs, whether a
stopped one kept its events, starting one (all threads, or the calling thread with memory events), and
keeping Kineto's native start/stop lines out of the user's output."""
import contextlib
import os
import sys

import torch

from .. import torch_compat


def profiler_running() -> bool:
    """Whether a ``torch.profiler`` (or ``torch.autograd.profiler``) session runs in this
    process. (Where a user's profiler starts inside openpop's window and still runs when the
    window closes, closing stops the user's session: torch does not say whose session runs.)
    torch's Python flag covers every profiler started from Python; the C++ one misses sessions
    that record all threads, which openpop's do."""
    return torch_compat.profiler_enabled()


def has_results(profiler) -> bool:
    """Whether a stopped profiler kept its events: one whose session another profiler took
    over has an empty result whose export crashes the process (torch 2.x)."""
    results = getattr(profiler.profiler, "kineto_results", None)
    if results is None:
        return True  # not kineto: torch exports the function events itself
    try:
        return results.trace_start_ns() != 0
    except (AttributeError, RuntimeError):
        return True


def start_profiler(all_threads=True):
    """``torch.profiler`` on the CPU (and CUDA). ``all_threads``: recording every thread
    (concurrent micro-batches run on worker threads), which in torch records no memory events;
    else the calling thread (and autograd's, which inherit it) with the allocator's memory
    events (``profile_memory``: the report's memory over time per virtual IPU)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    config = None
    if all_threads:
        try:
            config = torch_compat.ExperimentalProfilerConfig(profile_all_threads=True)
        except (AttributeError, TypeError):  # older torch: the calling thread only
            config = None
    profiler = torch.profiler.profile(activities=activities, experimental_config=config,
                                      profile_memory=not all_threads)
    with native_stderr_quiet():
        primer = torch.empty(16)  # (allocated before the profiler starts)
        profiler.start()
        # torch warns once per process on stderr when a block allocated before a memory
        # profile is freed: spent here, while the warning goes nowhere, not in the user's output
        del primer
    return profiler


@contextlib.contextmanager
def native_stderr_quiet():
    """Kineto writes a ``USDT: ... profiler_start`` / ``profiler_stop`` line to the process's
    stderr at each start and stop, whatever its log level: not the user's output. While openpop
    starts or stops its profiler (those two calls only), file descriptor 2 points at /dev/null;
    an exception they raise still reaches the caller."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, AttributeError, ValueError):  # no file descriptor 2 (embedded interpreters)
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
