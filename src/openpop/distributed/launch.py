"""Running poprun's plan on torchrun's elastic agent.

``elastic_launch`` starts this host's instances (``instance.py`` then the program), supervises
them and tears the job down: an instance that fails (exception, signal, ``kill -9``) makes the
agent stop every other instance (SIGTERM, then SIGKILL after ``SHUTDOWN_SECONDS``) and report it;
Ctrl-C (SIGINT) or SIGTERM on poprun does the same. Each instance runs in its own session and
the agent signals its whole process group, so children of the program (data loader workers)
go too.

The report names the instance that failed first: an instance killed by a signal (``kill -9``,
the OOM killer, a crash) before one that exited with an error (typically a collective that
lost that instance), and the instances the agent stopped with SIGTERM last, as stopped by
poprun. poprun's exit status is the first instance's (128 + N for a signal N).

No process outlives poprun: every instance's environment carries ``OPENPOP_POPRUN_JOB=<random>``
and, once the agent is done, whatever still runs with it (the children of an instance that was
killed: the agent signals the groups of running instances only; daemons) gets SIGTERM, then
SIGKILL after ``SHUTDOWN_SECONDS`` (:mod:`openpop.leftover_processes`), with a warning naming them.

Output: the agent redirects each instance's stdout/stderr to files; ``TaggedLogs`` tails them
with torch's ``TailLog`` onto poprun's stdout/stderr, every line tagged ``[1,<instance>]<stdout>:``
or ``[1,<instance>]<stderr>:`` (mpirun's ``--tag-output``), only instance N's with
``--only-output-from-instance N``.
"""
import logging
import os
import shutil
import signal
import sys
import tempfile

from .. import leftover_processes
from . import instance as instance_env
from . import messages

SHUTDOWN_SECONDS = 10
JOB_MARK = "OPENPOP_POPRUN_JOB"
INSTANCE_SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "instance.py")


def tag(instance: int, stream: str) -> str:
    return f"[1,{instance}]<{stream}>:"


def _tagged_logs_class():
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.tail_log import TailLog

    class TaggedLogs(DefaultLogsSpecs):
        """Instances' output to files (torch's layout), tailed with a tag per line and stream."""

        def __init__(self, log_dir: str, only_instance=None):
            super().__init__(log_dir=log_dir, redirects=Std.ALL, tee=Std.NONE)
            self.only_instance = only_instance
            self.tails = []

        def reify(self, envs):
            destinations = super().reify(envs)
            shown = {local: int(env["RANK"]) for local, env in envs.items()
                     if self.only_instance is None or int(env["RANK"]) == self.only_instance}
            for stream, files, target in (("stdout", destinations.stdouts, sys.stdout),
                                          ("stderr", destinations.stderrs, sys.stderr)):
                chosen = {local: files[local] for local in shown}
                if chosen:
                    prefixes = {local: tag(rank, stream) for local, rank in shown.items()}
                    self.tails.append(TailLog(stream, chosen, target, prefixes).start())
            return destinations

        def stop(self):
            for tail in self.tails:
                tail.stop()
            self.tails = []

    return TaggedLogs


def _exit_status(exitcode: int) -> int:
    return 128 - exitcode if exitcode < 0 else exitcode


def _describe(rank: int, failure) -> str:
    if failure.exitcode < 0:
        status = f"was killed by {_signal_name(-failure.exitcode)} (exit status {failure.exitcode})"
    else:
        status = f"exited with status {failure.exitcode}"
    return f"instance {rank} (rank {rank}, pid {failure.pid}) {status}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def failure_report(failures: dict, first_rank: int) -> tuple:
    """``(lines, exit status)`` for the agent's failures (``{rank: ProcessFailure}``, in the order
    it saw them; ``first_rank``: its first failure).

    The agent sees the instances that ended by themselves, then stops the others with SIGTERM
    and adds them; instances that ended in the same poll come in rank order and its timestamps
    are whole seconds. So the cause is chosen by how the instances ended: killed by a signal
    other than SIGTERM (it came from outside: ``kill -9``, the OOM killer, a crash) before an
    exit status (an error, often a collective that lost the killed instance), SIGTERM last (the
    agent's; when every instance got one it came from outside, and the agent's first counts).
    """
    def kind(rank):
        code = failures[rank].exitcode
        return 2 if code == -signal.SIGTERM else 0 if code < 0 else 1

    order = list(failures)
    if first_rank in order:  # the agent's first, then its order
        order.remove(first_rank)
        order.insert(0, first_rank)
    ranked = sorted(order, key=kind)
    cause = ranked[0]
    lines = [_describe(cause, failures[cause])]
    stopped = []
    for rank in ranked[1:]:
        if kind(rank) == 2 and kind(cause) != 2:
            stopped.append(rank)
            lines.append(f"instance {rank} (rank {rank}, pid {failures[rank].pid}) was stopped by poprun (SIGTERM) "
                         f"after instance {cause} failed")
        else:
            lines.append(_describe(rank, failures[rank]))
    summary = f"the job was stopped: instance {cause} failed first"
    if stopped:
        summary += f"; poprun stopped instance{'s' if len(stopped) > 1 else ''} {', '.join(map(str, stopped))}"
    lines.append(summary)
    return lines, _exit_status(failures[cause].exitcode) or 1


class _ExitBarrierNoise(logging.Filter):
    """Torch's agent logs ``Error waiting on exit barrier`` with the traceback of a
    ``DistNetworkError`` when the agent hosting the rendezvous store ends first: after the last
    agent of a multi-host (or multi-pod) job checks in, the others may exit before it waits, and
    its wait finds the store closed ("Broken pipe", "Connection was likely closed"). This host's
    instances have finished by then, and their outcome is already known, so the record becomes
    one line at ``-vv``. Any other exit-barrier error (a timeout: an agent that never arrived)
    is logged as torch logs it."""

    def __init__(self, log):
        super().__init__()
        self.log = log

    def filter(self, record):
        if not str(record.msg).startswith("Error waiting on exit barrier"):
            return True
        from torch.distributed import DistNetworkError
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, DistNetworkError):
            return True
        self.log.debug(f"exit barrier: another host's agent ended first and closed the rendezvous store "
                       f"({str(error).splitlines()[0] if str(error) else type(error).__name__}); "
                       f"this host's instances had finished")
        return False


def _import_torch_quietly(log):
    """Import torch with its C++ log level at ERROR in this process (the agent) unless the user set
    ``TORCH_CPP_LOG_LEVEL`` or asked for ``-vv``: the store client's C++ warnings (a closed socket
    at the exit barrier, with ~20 lines of C++ frames) would otherwise follow a successful job.
    c10 reads the variable once, at import; the instances get the user's environment unchanged."""
    if "torch" in sys.modules or "TORCH_CPP_LOG_LEVEL" in os.environ or log.verbosity >= 2:
        import torch
        return torch
    os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    try:
        import torch
    finally:
        del os.environ["TORCH_CPP_LOG_LEVEL"]
    return torch


def launch(plan, log) -> int:
    """Run this host's instances to the end; poprun's exit status."""
    torch = _import_torch_quietly(log)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    args = plan.args
    logging.getLogger("torch.distributed.elastic").setLevel(
        logging.INFO if log.verbosity >= 2 else logging.WARNING if log.verbosity else logging.CRITICAL)
    exit_barrier_filter = _ExitBarrierNoise(log)
    agent_logger = logging.getLogger("torch.distributed.elastic.agent.server.api")
    agent_logger.addFilter(exit_barrier_filter)
    host_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    environment = instance_env.launch_environment(args.num_replicas, args.ipus_per_replica, args.num_instances,
                                                  host_gpus, plan.timeout)
    if args.executable_cache_path:
        environment["POPTORCH_CACHE_DIR"] = args.executable_cache_path
    environment.update(plan.mpi_env)
    environment[JOB_MARK] = leftover_processes.new_mark()
    for name, value in sorted(environment.items()):
        log.debug(f"instance environment: {name}={value}")
    os.environ.update(environment)  # the agent gives its workers a copy of this process's environment

    log_dir = tempfile.mkdtemp(prefix="poprun-")
    logs = _tagged_logs_class()(log_dir, args.only_output_from_instance)
    nodes = len(plan.hosts)
    config = LaunchConfig(
        min_nodes=nodes, max_nodes=nodes, nproc_per_node=plan.instances_per_host,
        run_id=plan.run_id, role="instance",
        rdzv_backend="c10d", rdzv_endpoint=plan.endpoint,
        rdzv_configs={"join_timeout": int(args.rendezvous_timeout), "timeout": int(args.rendezvous_timeout),
                      "read_timeout": int(args.rendezvous_timeout)},
        max_restarts=0, monitor_interval=0.1, logs_specs=logs, local_addr=plan.local_addr,
        shutdown_timeout=SHUTDOWN_SECONDS)
    command = [args.program] + list(args.program_args)
    log.info(f"launching {plan.instances_per_host} instance(s) of {' '.join(command)} on this host "
             f"({nodes} host(s), rendezvous {plan.endpoint}) with torchrun's elastic agent")
    try:
        elastic_launch(config, sys.executable)(INSTANCE_SHIM, *command)
        return 0
    except ChildFailedError as failed:
        lines, status = failure_report(failed.failures, failed.get_first_failure()[0])
        for line in lines:
            log.error(line)
        return status
    except SignalException as stopped:
        log.error(f"poprun received {signal.Signals(stopped.sigval).name}: every instance was stopped")
        return 128 + int(stopped.sigval)
    except RendezvousError as exc:
        log.error(f"the hosts {','.join(plan.hosts)} did not meet at the rendezvous {plan.endpoint} within "
                  f"{args.rendezvous_timeout:g} s (an unreachable host, or poprun not started on every host): {exc}")
        return 1
    finally:
        agent_logger.removeFilter(exit_barrier_filter)
        left = leftover_processes.stop_marked(JOB_MARK, environment[JOB_MARK], SHUTDOWN_SECONDS)
        if left:
            log.warning(messages.LEFTOVER_PROCESSES_STOPPED.format(
                count=len(left), processes=", ".join(f"pid {pid} ({command})" for pid, command in left)))
        logs.stop()
        shutil.rmtree(log_dir, ignore_errors=True)
