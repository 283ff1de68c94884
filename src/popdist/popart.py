"""``popdist.popart``: PopART session options and device for this poprun instance.

``configureSessionOptions(opts)`` sets the local replication (``enableReplicatedGraphs``,
``replicatedGraphCount``) and the global one (``enableDistributedReplicatedGraphs``,
``globalReplicationFactor``, ``globalReplicaOffset``) from poprun's environment; a session built
with them joins the instances' torch.distributed group, and its gradients are reduced over every
replica of the job. ``getDevice(ipus_per_replica)`` acquires the instance's IPUs. Outside poprun
they describe a one-instance, one-replica job.
"""
from typing import Optional

import popdist


def configureSessionOptions(opts) -> None:
    """Set ``opts``' replication fields to this instance's share of the poprun job."""
    local = popdist.getNumLocalReplicas()
    total = popdist.getNumTotalReplicas()
    opts.enableReplicatedGraphs = local > 1
    opts.replicatedGraphCount = local
    opts.enableDistributedReplicatedGraphs = popdist.isPopdistEnvSet() and total > local
    opts.globalReplicationFactor = total
    opts.globalReplicaOffset = popdist.getReplicaIndexOffset()


def getNumIpus(ipus_per_replica: Optional[int] = None) -> int:
    """IPUs of this instance: local replicas x IPUs per replica."""
    per = popdist.getNumIpusPerReplica() if ipus_per_replica is None else int(ipus_per_replica)
    return popdist.getNumLocalReplicas() * per


def getDevice(ipus_per_replica: Optional[int] = None, *args, **kwargs):
    """A ``popart.DeviceInfo`` with this instance's IPUs (local replicas x ``ipus_per_replica``)."""
    import popart
    if ipus_per_replica is not None and not popdist.checkNumIpusPerReplica(ipus_per_replica):
        raise RuntimeError(popdist.ipus_per_replica_mismatch(
            ipus_per_replica, f"popdist.popart.getDevice({ipus_per_replica})"))
    return popart.DeviceManager().acquireAvailableDevice(getNumIpus(ipus_per_replica))


def getDeviceId(ipus_per_replica: Optional[int] = None) -> int:
    return popdist.getDeviceId(ipus_per_replica or 0)
