"""The environment of one poprun instance, and the launch step that gives it to the program.

torchrun's elastic agent starts every worker with the same environment plus its own ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` ... . poprun's instances need more: the
``POPDIST_*`` variables of Graphcore's poprun (their replica offset depends on the rank), the
``OMPI_COMM_WORLD_*`` variables mpirun set (``poptorch.Options().Distributed`` reads them), the
instance's share of the host's GPUs and CPU threads. So the agent's entrypoint is this file, run
by path (``python instance.py PROGRAM ARGS``: standard library only, no torch import), which
derives that environment from the rank and then *execs* the program: the process the agent
supervises is the program itself.

Variables poprun passes to every instance (``launch_environment``):

* ``POPDIST_NUM_TOTAL_REPLICAS``, ``POPDIST_NUM_IPUS_PER_REPLICA``, ``POPDIST_NUM_LOCAL_REPLICAS``,
  ``POPDIST_UNIFORM_REPLICAS_PER_INSTANCE=1`` (as Graphcore's poprun);
* ``OPENPOP_POPRUN_GPUS``: how many GPUs this host has (0 on a CPU host);
* ``OPENPOP_COLLECTIVE_TIMEOUT``: seconds before a collective that does not complete fails.

Variables this file adds per instance (``instance_environment``):

* ``POPDIST_REPLICA_INDEX_OFFSET = rank * local replicas``, ``POPDIST_LOCAL_INSTANCE_INDEX = local rank``;
* ``OMPI_COMM_WORLD_SIZE/RANK/LOCAL_SIZE/LOCAL_RANK``;
* ``OPENPOP_DEVICE_MAP``: on a GPU host, this instance's GPUs (the host's GPUs split evenly between
  its instances; instances share GPUs round-robin when there are fewer GPUs than instances);
* ``OPENPOP_DIST_BACKEND``: ``cpu:gloo,cuda:nccl`` when every instance has GPUs of its own
  (NCCL cannot put two ranks on one GPU), else ``gloo``;
* ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS``: the host's cores divided between its instances
  (at least 1); a variable the user set is kept, and a user's ``OMP_NUM_THREADS`` also sets
  ``MKL_NUM_THREADS`` (torch reads both);
* ``PYTHONUNBUFFERED=1``: output is tagged line by line as it comes.
"""
import os
import sys

TOTAL_REPLICAS = "POPDIST_NUM_TOTAL_REPLICAS"
IPUS_PER_REPLICA = "POPDIST_NUM_IPUS_PER_REPLICA"
LOCAL_REPLICAS = "POPDIST_NUM_LOCAL_REPLICAS"
UNIFORM_REPLICAS = "POPDIST_UNIFORM_REPLICAS_PER_INSTANCE"
REPLICA_OFFSET = "POPDIST_REPLICA_INDEX_OFFSET"
LOCAL_INSTANCE_INDEX = "POPDIST_LOCAL_INSTANCE_INDEX"

HOST_GPUS = "OPENPOP_POPRUN_GPUS"
COLLECTIVE_TIMEOUT = "OPENPOP_COLLECTIVE_TIMEOUT"
DIST_BACKEND = "OPENPOP_DIST_BACKEND"
DEVICE_MAP = "OPENPOP_DEVICE_MAP"  # read by openpop.runtime.devices
HOROVOD_COMPAT = "OPENPOP_HOROVOD_COMPAT"

DEFAULT_COLLECTIVE_TIMEOUT = 600.0


def launch_environment(total_replicas: int, ipus_per_replica: int, num_instances: int, host_gpus: int,
                       collective_timeout: float) -> dict:
    """What poprun adds to the environment every instance inherits."""
    return {
        TOTAL_REPLICAS: str(total_replicas),
        IPUS_PER_REPLICA: str(ipus_per_replica),
        LOCAL_REPLICAS: str(total_replicas // num_instances),
        UNIFORM_REPLICAS: "1",
        HOST_GPUS: str(host_gpus),
        COLLECTIVE_TIMEOUT: repr(float(collective_timeout)),
    }


def instance_environment(env: dict, cpu_count: int) -> dict:
    """The variables to add for the instance whose agent-given environment is ``env``."""
    rank = int(env["RANK"])
    local_rank = int(env["LOCAL_RANK"])
    world_size = int(env["WORLD_SIZE"])
    local_size = int(env["LOCAL_WORLD_SIZE"])
    local_replicas = int(env[LOCAL_REPLICAS])
    ipus_per_replica = int(env[IPUS_PER_REPLICA])
    added = {
        REPLICA_OFFSET: str(rank * local_replicas),
        LOCAL_INSTANCE_INDEX: str(local_rank),
        "OMPI_COMM_WORLD_SIZE": str(world_size),
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank),
        "PYTHONUNBUFFERED": "1",
    }
    gpus = instance_gpus(int(env.get(HOST_GPUS, "0")), local_size, local_rank)
    if gpus:
        virtual_ipus = local_replicas * ipus_per_replica
        if not env.get(DEVICE_MAP):
            added[DEVICE_MAP] = ",".join(f"cuda:{gpus[i % len(gpus)]}" for i in range(virtual_ipus))
        shared = int(env.get(HOST_GPUS, "0")) < local_size
        added[DIST_BACKEND] = "gloo" if shared else "cpu:gloo,cuda:nccl"
    else:
        added[DIST_BACKEND] = "gloo"
    # torch takes its thread count from either variable: give both the user's OMP_NUM_THREADS,
    # else the instance's share of the cores.
    threads = env.get("OMP_NUM_THREADS") or str(max(1, cpu_count // local_size))
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if not env.get(name):
            added[name] = threads
    return added


def instance_gpus(host_gpus: int, local_instances: int, local_index: int) -> list:
    """The GPU indices of local instance ``local_index`` of ``local_instances``."""
    if host_gpus <= 0:
        return []
    if host_gpus < local_instances:
        return [local_index % host_gpus]
    first = local_index * host_gpus // local_instances
    last = (local_index + 1) * host_gpus // local_instances
    return list(range(first, last))


def _horovod_alias_path(env: dict):
    """The directory that makes ``import horovod.torch`` find openpop's compatibility layer, when
    the real horovod is not installed (``OPENPOP_HOROVOD_COMPAT=0`` turns this off)."""
    import importlib.util
    if env.get(HOROVOD_COMPAT, "1") == "0" or importlib.util.find_spec("horovod") is not None:
        return None
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "horovod_alias")


def expose_horovod_alias() -> None:
    """Let ``import horovod.torch`` find openpop's compatibility layer in this process, after
    everything else on the path (a real horovod wins). Graphcore's applications import horovod at
    the top of modules they also use in one process; there the layer is a job of one process."""
    alias = _horovod_alias_path(os.environ)
    if alias is not None and alias not in sys.path:
        sys.path.append(alias)


def main(argv) -> None:
    if not argv:
        sys.stderr.write("usage: python instance.py PROGRAM [ARGS...]\n")
        raise SystemExit(2)
    env = dict(os.environ)
    env.update(instance_environment(env, os.cpu_count() or 1))
    alias = _horovod_alias_path(env)
    if alias is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), alias) if p)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        sys.stderr.write(f"poprun: cannot run {argv[0]!r}: {exc.strerror}\n")
        raise SystemExit(127) from None


if __name__ == "__main__":
    main(sys.argv[1:])
