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
