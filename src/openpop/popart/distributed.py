"""``enableDistributedReplicatedGraphs``: this process's replicas among the job's.

A session with ``globalReplicationFactor`` G, ``replicatedGraphCount`` L and
``globalReplicaOffset`` O is instance ``O / L`` of ``G / L`` processes that each run L replicas.
It joins the torch.distributed group poprun set up (as PopART calls ``popdist.init()`` for such
sessions) and runs as PopTorch's ``Options.Distributed`` does: gradients reduced over every
replica of the job once per step (``runtime/distributed_reduce.py``), instance 0's weights taken
on the first run. Host buffers hold only the local replicas' data, as on PopART.
"""
import logging
from typing import Optional

from . import messages
from .errors import popart_exception


def instances(options) -> Optional[tuple[int, int]]:
    """``(instance index, instance count)``, or None when the session is not distributed."""
    if not options.enableDistributedReplicatedGraphs:
        return None
    local = options.local_replicas()
    total = int(options.globalReplicationFactor)
    offset = int(options.globalReplicaOffset)
    if total < local or total % local:
        raise popart_exception(messages.GLOBAL_REPLICATION_NOT_A_MULTIPLE.format(total=total, local=local))
    if offset < 0 or offset % local or offset >= total:
        raise popart_exception(messages.GLOBAL_REPLICA_OFFSET_NOT_A_MULTIPLE.format(
            offset=offset, local=local, total=total))
    if total == local:
        return None
    import popdist

    from ..distributed import process_group
    if not process_group.is_initialized():
        logging.getLogger("popart").warning(
            messages.DISTRIBUTED_INITIALISES_POPDIST)
        popdist.init()
    if not process_group.is_initialized():
        raise popart_exception(messages.DISTRIBUTED_NEEDS_POPRUN.format(
            total=total, local=total // local))
    return offset // local, total // local
