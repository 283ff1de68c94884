"""Running poprun's plan on torchrun's elastic agent.

``elastic_launch`` starts this host's instances (``instance.py`` then the program), supervises
them and tears the job down: an instance that fails (exception, signal, ``kill -9``) makes the
agent stop every other instance (SIGTERM, then SIGKILL after ``SHUTDOWN_SECONDS``) and report it;
Ctrl-C (SIGINT) or SIGTERM on poprun does the same. Each instance runs in its own session and
the agent signals its whole process group, so children of the program (data loader workers)
go too.

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

from . import instance as instance_env

SHUTDOWN_SECONDS = 10
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
        try:
            name = signal.Signals(-failure.exitcode).name
        except ValueError:
            name = f"signal {-failure.exitcode}"
        status = f"was killed by {name} (exit status {failure.exitcode})"
    else:
        status = f"exited with status {failure.exitcode}"
    return f"instance {rank} (rank {rank}, pid {failure.pid}) {status}"


def launch(plan, log) -> int:
    """Run this host's instances to the end; poprun's exit status."""
    import torch
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    args = plan.args
    logging.getLogger("torch.distributed.elastic").setLevel(
        logging.INFO if log.verbosity >= 2 else logging.WARNING if log.verbosity else logging.CRITICAL)
    host_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    environment = instance_env.launch_environment(args.num_replicas, args.ipus_per_replica, args.num_instances,
                                                  host_gpus, plan.timeout)
    if args.executable_cache_path:
        environment["POPTORCH_CACHE_DIR"] = args.executable_cache_path
    environment.update(plan.mpi_env)
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
        first_rank, first = failed.get_first_failure()
        log.error(_describe(first_rank, first))
        for rank, failure in sorted(failed.failures.items()):
            if rank != first_rank:
                log.error(_describe(rank, failure))
        log.error(f"the job was stopped: {len(failed.failures)} instance(s) failed")
        return _exit_status(first.exitcode) or 1
    except SignalException as stopped:
        log.error(f"poprun received {signal.Signals(stopped.sigval).name}: every instance was stopped")
        return 128 + int(stopped.sigval)
    except RendezvousError as exc:
        log.error(f"the hosts {','.join(plan.hosts)} did not meet at the rendezvous {plan.endpoint} within "
                  f"{args.rendezvous_timeout:g} s (an unreachable host, or poprun not started on every host): {exc}")
        return 1
    finally:
        logs.stop()
        shutil.rmtree(log_dir, ignore_errors=True)
