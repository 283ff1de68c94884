"""A successful job ends cleanly (issue 33): the noise torch's elastic agent makes at the exit barrier
of a multi-host (multi-pod) poprun job is one line at ``-vv``; real errors still show."""
import logging
import subprocess
import sys

import pytest

from openpop.distributed import launch


class _Log:
    def __init__(self, verbosity=0):
        self.verbosity = verbosity
        self.lines = []

    def debug(self, message):
        self.lines.append(message)


def _exit_barrier_record(error):
    logger = logging.getLogger("torch.distributed.elastic.agent.server.api")
    try:
        raise error
    except Exception:
        return logger.makeRecord(logger.name, logging.ERROR, __file__, 1,
                                 "Error waiting on exit barrier. Elapsed: %s seconds", (0.01,), sys.exc_info())


def test_a_closed_store_at_the_exit_barrier_is_one_debug_line():
    from torch.distributed import DistNetworkError
    log = _Log(verbosity=2)
    noise = launch._ExitBarrierNoise(log)
    record = _exit_barrier_record(DistNetworkError("Failed to recv, got 0 bytes. Connection was likely closed."))
    assert noise.filter(record) is False
    assert log.lines == ["exit barrier: another host's agent ended first and closed the rendezvous store "
                         "(Failed to recv, got 0 bytes. Connection was likely closed.); this host's instances "
                         "had finished"]


def test_other_exit_barrier_errors_and_other_records_still_show():
    from torch.distributed import DistStoreError
    noise = launch._ExitBarrierNoise(_Log())
    assert noise.filter(_exit_barrier_record(DistStoreError("Socket Timeout"))) is True  # an agent never came
    other = logging.LogRecord("torch.distributed.elastic.agent.server.api", logging.ERROR, __file__, 1,
                              "Local worker group failed", (), None)
    assert noise.filter(other) is True


CLOSED_STORE = """
import datetime, socket, subprocess, sys
from openpop.distributed import launch
class Log:
    verbosity = {verbosity}
launch._import_torch_quietly(Log())
import os; assert "TORCH_CPP_LOG_LEVEL" not in os.environ
from torch.distributed import DistNetworkError, TCPStore
listening = socket.socket(); listening.bind(("127.0.0.1", 0)); port = listening.getsockname()[1]; listening.close()
server = subprocess.Popen([sys.executable, "-c", "import sys, time; from torch.distributed import TCPStore; "
                           f"store = TCPStore('127.0.0.1', {{port}}, 2, True); sys.stdin.read()"],
                          stdin=subprocess.PIPE)
client = TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=60))
client.add("members", 1)
server.stdin.close(); server.wait()
try:
    client.wait(["last"])
except DistNetworkError:
    print("closed")
"""


@pytest.mark.slow
@pytest.mark.parametrize("verbosity", [0, 2])
def test_the_agents_store_client_prints_no_cpp_frames_unless_asked(verbosity):
    """The C++ warning (with ~20 lines of C++ frames) of a store whose host has gone is not printed by
    poprun's agent; with -vv it is, and the instances' environment is never changed."""
    done = subprocess.run([sys.executable, "-c", CLOSED_STORE.format(verbosity=verbosity)], capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.strip() == "closed", done.stderr
    assert ("frame #" in done.stderr) == (verbosity >= 2), done.stderr


# --------------------------------------------------------------------------- a compile mid-run
def test_the_auto_switch_is_announced_once_before_its_bar():
    import io

    from openpop.runtime.compiled.selection import Selection
    from openpop.runtime.progress import CompilationProgress
    selection = Selection("auto", compile_after=2.0)
    selection.eager_seconds = 1.0
    assert not selection.wants_compiled() and selection.take_announcement() is None
    selection.eager_seconds = 2.5
    assert selection.wants_compiled()
    announcement = selection.take_announcement()
    assert announcement == ("the auto backend compiles this model now: its eager host calls took 2.5 s, as long as "
                            "compiling is estimated to take (2.0 s, compile_after); Options.openpopBackend('eager') "
                            "or OPENPOP_BACKEND=eager keeps it eager")
    assert selection.wants_compiled() and selection.take_announcement() is None  # once
    stream = io.StringIO()
    CompilationProgress(stream, reason=announcement).finish()
    first, bar = stream.getvalue().splitlines()
    assert first == "Graph compilation: " + announcement and bar.startswith("Graph compilation: 100%|")
    stream = io.StringIO()
    CompilationProgress(stream).finish()  # a first compile: the bar only
    assert len(stream.getvalue().splitlines()) == 1


@pytest.mark.slow
def test_a_real_mid_run_compile_says_why(capsys, monkeypatch, tmp_path):
    import torch

    import poptorch

    from helpers.models import Regressor
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    model = Regressor()
    opts = poptorch.Options().deviceIterations(2).openpopBackend("auto", compile_after=1e-9)
    pop = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.01))
    x, y = torch.randn(6, 6), torch.randn(6, 2)
    pop(x, y)  # eager: the first bar, no reason
    first = capsys.readouterr().err
    assert pop._dispatch.compiled.last == "eager"
    assert next(line for line in first.splitlines() if line.startswith("Graph compilation")).startswith(
        "Graph compilation: 100%|")
    pop(x, y)  # the rental is paid: compiles now
    second = [line for line in capsys.readouterr().err.splitlines() if line.startswith("Graph compilation")]
    assert pop._dispatch.compiled.last == "compiled"
    assert second[0].startswith("Graph compilation: the auto backend compiles this model now: its eager host calls "
                                "took ") and second[1].startswith("Graph compilation: 100%|"), second


# --------------------------------------------------------------------------- the profiler across threads
TRACED_ON_A_THREAD = """
import json, threading, torch, poptorch
from openpop.runtime.trace import TraceSession
model = poptorch.inferenceModel(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), poptorch.Options())
x = torch.randn(2, 4)
model(x)
with TraceSession("report", calls=range(3)):
    worker = threading.Thread(target=model, args=(x,))
    worker.start()
    worker.join()
    model(x)
names = {event.get("name", "") for event in json.load(open("report/trace.json"))["traceEvents"]}
print("aten" if any(name.startswith("aten::") for name in names) else "no operator events")
"""


@pytest.mark.slow
def test_a_window_that_starts_on_another_thread_keeps_its_events_and_says_nothing(tmp_path):
    """A traced call made on a thread other than the main one (Lightning's replica threads) while the
    window closes on the main thread: torch's per-thread profiler would lose its events there and
    print 'Requested callback is not found' and 'Leaked callback handle'; openpop records every
    thread for such a window."""
    done = subprocess.run([sys.executable, "-c", TRACED_ON_A_THREAD], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "aten", done.stderr
    assert "callback" not in done.stderr and "no operator events" not in done.stderr, done.stderr
