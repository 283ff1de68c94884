"""Faults under poprun: an instance killed or raising ends the job with a line naming it, Ctrl-C
stops everything, a collective one instance never joins times out, a host that does not answer
fails the launch early; no process is left behind."""
import os
import re
import signal
import socket
import subprocess
import time

import pytest

from openpop.distributed import reachability

from helpers.poprun_runner import PROGRAMS, environment, poprun_command, run_poprun
from helpers.processes import free_port, wait_gone


class Job:
    """poprun running ``poprun_programs.py ARGS`` with two instances; knows their pids."""

    def __init__(self, *program_args, **env):
        self.process = subprocess.Popen(
            poprun_command("--num-instances", "2", "--num-replicas", "2", "python", PROGRAMS, *program_args),
            env=environment(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.pids = {}
        while len(self.pids) < 2:
            line = self.process.stdout.readline()
            assert line, "poprun ended before its instances started: " + self.process.stderr.read()
            match = re.match(r"\[1,(\d)\]<stdout>:pid (\d+)", line)
            if match:
                self.pids[int(match.group(1))] = int(match.group(2))

    def finish(self, seconds=60):
        started = time.monotonic()
        _out, err = self.process.communicate(timeout=seconds)
        return self.process.returncode, err, time.monotonic() - started

    def wait_for(self, *paths, seconds=180):
        """Until every file of ``paths`` exists (the program's own signal; the limit only stops a hang)."""
        deadline = time.monotonic() + seconds
        while not all(os.path.exists(p) for p in paths):
            assert self.process.poll() is None, "poprun ended early: " + self.process.communicate()[1]
            assert time.monotonic() < deadline, f"not all of {paths} after {seconds} s"
            time.sleep(0.05)


def poprun_errors(stderr):
    """poprun's own error lines, without their time and pid."""
    return [line.split(" POPRUN [E] ", 1)[1] for line in stderr.splitlines() if " POPRUN [E] " in line]


@pytest.mark.slow
def test_kill_9_of_one_instance_ends_the_job():
    job = Job("sleep", "300")
    os.kill(job.pids[1], signal.SIGKILL)
    code, err, _ = job.finish()
    assert code == 128 + 9
    assert f"instance 1 (rank 1, pid {job.pids[1]}) was killed by SIGKILL (exit status -9)" in err
    assert wait_gone(job.pids.values(), 15.0) == []


@pytest.mark.slow
def test_an_exception_in_one_instance_ends_the_job():
    job = Job("fail-after", "0.5", "1")
    code, err, _seconds = job.finish()
    assert code == 1
    assert f"instance 1 (rank 1, pid {job.pids[1]}) exited with status 1" in err
    assert "[1,1]<stderr>:ValueError: instance 1 gives up" in err.splitlines()
    assert wait_gone(job.pids.values(), 15.0) == []


@pytest.mark.slow
def test_ctrl_c_stops_every_instance():
    job = Job("sleep", "300")
    job.process.send_signal(signal.SIGINT)
    code, err, _ = job.finish()
    assert code == 128 + signal.SIGINT
    assert "poprun received SIGINT: every instance was stopped" in err
    assert wait_gone(job.pids.values(), 15.0) == []


@pytest.mark.slow
def test_a_collective_that_never_completes_times_out_with_its_name():
    result = run_poprun("--num-instances", "2", "--num-replicas", "2", "--collective-timeout", "3",
                        "python", PROGRAMS, "stuck-collective")
    assert result.returncode == 1
    assert ("the all-reduce of step 1's gradients across the 2 poprun instances failed on instance 0 "
            "(timeout 3 s): another instance is stuck or has stopped") in result.stderr
    assert "instance 0 (rank 0, pid" in result.stderr and "exited with status 1" in result.stderr


@pytest.mark.slow
def test_instances_whose_models_differ_fail_before_training():
    result = run_poprun("--num-instances", "2", "--num-replicas", "2", "python", PROGRAMS, "mismatch")
    assert result.returncode == 1
    assert ("Instance 1's model differs from instance 0's: parameter 0.weight is [4, 4] torch.float32 instead "
            "of [3, 4] torch.float32. Every instance must build the same model") in result.stderr
    lines = result.stdout.splitlines()
    assert ("[1,0]<stdout>:instance 0: weights unchanged" in lines
            or "[1,1]<stdout>:instance 1: weights unchanged" in lines)


@pytest.mark.slow
def test_kill_9_inside_the_all_reduce_names_the_instance_and_leaves_nothing(tmp_path):
    job = Job("killed-in-allreduce", str(tmp_path), OMP_NUM_THREADS="1")
    try:
        job.wait_for(tmp_path / "in-all-reduce-0", tmp_path / "in-all-reduce-1")
        children = [int((tmp_path / f"child-{rank}").read_text()) for rank in (0, 1)]
        os.kill(job.pids[1], signal.SIGKILL)  # instance 1 is inside the all-reduce instance 0 waits in
        code, err, seconds = job.finish()
    finally:
        if job.process.poll() is None:
            job.process.kill()
    assert seconds < 60 and code == 128 + 9, err
    errors = poprun_errors(err)
    assert errors[0] == f"instance 1 (rank 1, pid {job.pids[1]}) was killed by SIGKILL (exit status -9)", err
    # Instance 0 either failed in the all-reduce first or was stopped by poprun: never "killed by SIGTERM".
    assert errors[1] in (f"instance 0 (rank 0, pid {job.pids[0]}) exited with status 1",
                         f"instance 0 (rank 0, pid {job.pids[0]}) was stopped by poprun (SIGTERM) after "
                         "instance 1 failed"), err
    assert errors[2].startswith("the job was stopped: instance 1 failed first"), err
    if "exited with status 1" in errors[1]:
        assert ("the all-reduce of step 2's gradients across the 2 poprun instances failed on instance 0: another "
                "instance stopped during it") in err
    # The child of the killed instance is in no running instance's process group: poprun stops it.
    assert wait_gone(list(job.pids.values()) + children, 5.0) == []
    assert f"the instances left running: pid {children[1]} (" in err


def _silent_host(address):
    """A listening socket on ``address`` whose accept queue is full: the kernel drops every further
    SYN, as for a host that is down or behind a firewall that drops packets. Returns (sockets, port)."""
    listener = socket.socket()
    listener.bind((address, 0))
    listener.listen(0)
    filler = socket.create_connection(listener.getsockname(), timeout=5)
    return (listener, filler), listener.getsockname()[1]


@pytest.mark.slow
def test_a_host_that_does_not_answer_fails_the_launch_within_30_seconds():
    sockets, port = _silent_host("127.0.0.3")
    started = time.monotonic()
    process = subprocess.Popen(
        poprun_command("--host", "127.0.0.1,127.0.0.3", "--rendezvous-port", str(port), "--num-instances", "2",
                       "--num-replicas", "2", "python", "-c", "print('started')"),
        env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=40)
    finally:
        if process.poll() is None:
            process.kill()
        for sock in sockets:
            sock.close()
    assert time.monotonic() - started < 30
    assert process.returncode == 1 and "started" not in out
    assert poprun_errors(err) == [
        f"host 127.0.0.3 does not answer: no reply from 127.0.0.3:{port} (the rendezvous port) within 15 s "
        "(timed out). Check that 127.0.0.3 is up and reachable from this host (ping, ssh), that no firewall drops "
        f"TCP port {port} between the hosts (--rendezvous-port), and that --host names the right machine; "
        "--host-answer-timeout 0 skips this check"], err


def test_a_refusal_is_an_answer_and_silence_is_not():
    # Nothing listens on the port: the host refuses at once, it is up (its poprun may start later).
    started = time.monotonic()
    assert reachability.silent_hosts(["127.0.0.1", "localhost"], free_port(), 10.0) == []
    assert time.monotonic() - started < 10.0
    sockets, port = _silent_host("127.0.0.3")
    try:
        assert reachability.silent_hosts(["127.0.0.1", "127.0.0.3"], port, 1.0) == [
            ("127.0.0.3", "127.0.0.3", "timed out")]
    finally:
        for sock in sockets:
            sock.close()


def test_ctrl_c_while_a_host_does_not_answer_starts_nothing():
    sockets, port = _silent_host("127.0.0.3")
    process = subprocess.Popen(
        poprun_command("--vv", "--host", "127.0.0.1,127.0.0.3", "--rendezvous-port", str(port), "--num-instances",
                       "2", "--num-replicas", "2", "python", "-c", "print('started')"),
        env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in process.stderr:  # poprun says when it starts waiting for the hosts
            if "POPRUN [D] checking that the other hosts answer" in line:
                break
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
        for sock in sockets:
            sock.close()
    assert process.returncode == 130 and "started" not in out
    assert poprun_errors(err) == ["interrupted while checking that the hosts answer: nothing was started"], err
