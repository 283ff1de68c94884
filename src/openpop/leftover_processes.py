"""The processes a job leaves behind, found by a mark in their environment, and stopped.

A launcher (``poprun``, ``openpop-k8s run-local``) puts a mark, ``NAME=<random value>``, in the
environment of everything it starts. Programs hand their environment down to their children,
so the processes of a job are those whose environment carries its mark, whatever became of
their parents, process groups and sessions: the data-loader workers of an instance that was
killed (its process group is not signalled once its leader is gone), a daemon a pod started in
a session of its own, the instances of a poprun that was killed.

``stop_marked`` stops them when the job ends: SIGTERM, then SIGKILL to those still running after
a grace period (``grace=0``: SIGKILL at once, as a container's processes end with its main
process). A process is signalled only while its environment still carries the mark, so a
process id reused by an unrelated process is left alone.

Linux only (``/proc/<pid>/environ``; elsewhere nothing is found). Not found: processes of
other users, and processes started with an environment that leaves the mark out.
"""
import os
import secrets
import signal
import time

_PROC = "/proc"


def new_mark() -> str:
    """A value no other job has."""
    return secrets.token_hex(8)


def _environment(pid: int) -> list:
    try:
        with open(os.path.join(_PROC, str(pid), "environ"), "rb") as stream:
            return stream.read().split(b"\0")
    except OSError:  # gone, or another user's
        return []


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended: only its parent's wait is missing)."""
    try:
        with open(os.path.join(_PROC, str(pid), "stat"), "rb") as stream:
            return stream.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _carries(pid: int, entry: bytes) -> bool:
    return entry in _environment(pid) and _running(pid)


def marked_processes(name: str, value: str) -> list:
    """The running processes whose environment has ``name=value`` (this process excepted)."""
    entry = f"{name}={value}".encode()
    try:
        pids = [int(p) for p in os.listdir(_PROC) if p.isdigit()]
    except OSError:
        return []
    return sorted(pid for pid in pids if pid != os.getpid() and _carries(pid, entry))


def command_line(pid: int) -> str:
    try:
        with open(os.path.join(_PROC, str(pid), "cmdline"), "rb") as stream:
            words = stream.read().rstrip(b"\0").split(b"\0")
    except OSError:
        return "?"
    text = " ".join(w.decode(errors="replace") for w in words if w)
    return text if len(text) <= 80 else text[:77] + "..."


def _signal(pids, sig, entry: bytes) -> None:
    for pid in pids:
        if _carries(pid, entry):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def stop_marked(name: str, value: str, grace: float) -> list:
    """Stop every process marked ``name=value``: SIGTERM, SIGKILL after ``grace`` seconds
    (0: SIGKILL at once). Returns ``[(pid, command line)]`` of the processes found."""
    entry = f"{name}={value}".encode()
    found = {}
    for _round in range(5):  # a process may start another while it is being stopped
        pids = [pid for pid in marked_processes(name, value) if pid not in found or _running(pid)]
        if not pids:
            break
        for pid in pids:
            found.setdefault(pid, command_line(pid))
        if grace > 0:
            _signal(pids, signal.SIGTERM, entry)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and any(_running(pid) for pid in pids):
                time.sleep(0.02)
        _signal([pid for pid in pids if _running(pid)], signal.SIGKILL, entry)
        deadline = time.monotonic() + 5.0  # SIGKILL is delivered asynchronously
        while time.monotonic() < deadline and any(_running(pid) for pid in pids):
            time.sleep(0.01)
    return sorted(found.items())
