"""Processes and ports for the tests that start other processes."""
import socket
import time


def alive(pid: int) -> bool:
    """Whether process ``pid`` is running (a zombie is gone for our purposes)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pids, seconds: float) -> list:
    """Wait up to ``seconds`` for ``pids`` to end; the ones still alive."""
    pids = list(pids)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.02)
    return [p for p in pids if alive(p)]


def free_port() -> int:
    """A TCP port on the loopback interface nobody listens on (now)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
