"""``popdist``: what a program started by ``poprun`` asks about its place in the job.

Graphcore's PopDist API on openpop. The getters read the ``POPDIST_*`` variables ``poprun`` sets
for every instance and return PopDist's documented defaults outside poprun (one instance, one
replica, one IPU per replica, offsets 0); there ``checkNumIpusPerReplica`` accepts any number.
``init()`` joins the instances' torch.distributed process group (gloo on CPUs, NCCL for GPUs);
outside poprun it does nothing.
"""
import os

from openpop.distributed import instance as _env
from openpop.distributed import messages as distributed_messages
from openpop.distributed import process_group as _group


def _int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


def isPopdistEnvSet() -> bool:
    """True if this process was started by poprun."""
    return _env.TOTAL_REPLICAS in os.environ and _env.LOCAL_REPLICAS in os.environ


def getNumTotalReplicas() -> int:
    """Replicas in the whole job (1 outside poprun)."""
    return _int(_env.TOTAL_REPLICAS, 1)


def getNumLocalReplicas() -> int:
    """Replicas of this instance (1 outside poprun)."""
    return _int(_env.LOCAL_REPLICAS, 1)


def getNumIpusPerReplica() -> int:
    """IPUs per replica (1 when poprun did not say)."""
    return _int(_env.IPUS_PER_REPLICA, 1)


def getReplicaIndexOffset() -> int:
    """Global index of this instance's first replica (0 outside poprun)."""
    return _int(_env.REPLICA_OFFSET, 0)


def getLocalInstanceIndex() -> int:
    """Index of this instance among the instances of its host (0 outside poprun)."""
    return _int(_env.LOCAL_INSTANCE_INDEX, 0)


def _require_uniform(function: str) -> None:
    if os.environ.get(_env.UNIFORM_REPLICAS, "1") != "1":
        raise RuntimeError(distributed_messages.NON_UNIFORM_REPLICAS.format(function=function))


def getNumInstances() -> int:
    """Instances in the job (1 outside poprun)."""
    _require_uniform("getNumInstances")
    return getNumTotalReplicas() // getNumLocalReplicas()


def getInstanceIndex() -> int:
    """Index of this instance in ``[0, getNumInstances())`` (0 outside poprun)."""
    _require_uniform("getInstanceIndex")
    return getReplicaIndexOffset() // getNumLocalReplicas()


def checkNumIpusPerReplica(ipus_per_replica: int) -> bool:
    """Whether ``ipus_per_replica`` is what poprun was given (``--ipus-per-replica``). Only a
    process poprun launched is held to it: alone, a process has whatever IPUs it asks for (so
    ``popdist.poptorch.Options(ipus_per_replica=2)`` works in a plain ``python`` run, as in
    PopTorch's own tests), while ``getNumIpusPerReplica()`` keeps its documented default, 1."""
    if not isPopdistEnvSet():
        return True
    return int(ipus_per_replica) == getNumIpusPerReplica()


def ipus_per_replica_mismatch(ipus_per_replica: int, where: str) -> str:
    """The error text for a script whose IPUs per replica differ from poprun's."""
    return distributed_messages.IPUS_PER_REPLICA_MISMATCH.format(
        where=where, asked=f"{ipus_per_replica} IPU" + ("" if int(ipus_per_replica) == 1 else "s"),
        started=getNumIpusPerReplica())


def getDeviceId(ipusPerReplica: int = 0) -> int:
    """The device of this instance. Every instance sees its own devices (its share of the host's
    GPUs, or the CPU) numbered from 0, as an IPU partition of its own: always 0."""
    if ipusPerReplica and not checkNumIpusPerReplica(ipusPerReplica):
        raise RuntimeError(ipus_per_replica_mismatch(ipusPerReplica, f"popdist.getDeviceId({ipusPerReplica})"))
    return 0


def init() -> None:
    """Join the job's torch.distributed process group (no-op outside poprun or if joined)."""
    _group.initialize()  # also destroys the group at exit


def initializeBackend() -> None:
    init()


def isBackendInitialized() -> bool:
    return _group.is_initialized()


def finalizeBackend() -> None:
    _group.finalize()


def execute_on_instances(instances, func, *args, **kwargs):
    """Run ``func(*args, **kwargs)`` on the instances in ``instances`` only; openpop's collectives
    inside it (and ``openpop.distributed.process_group.current_group()``) span those instances.
    Every instance must call it. Returns ``func``'s result there, None elsewhere."""
    wanted = {int(i) for i in instances}
    if not _group.is_initialized():
        return func(*args, **kwargs) if getInstanceIndex() in wanted else None
    with _group.subgroup(wanted) as member:
        return func(*args, **kwargs) if member else None
