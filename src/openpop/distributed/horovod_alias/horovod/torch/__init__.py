"""``horovod.torch`` as openpop's compatibility layer (``openpop.distributed.horovod_compat``)."""
from openpop.distributed.horovod_compat import *  # noqa: F403
from openpop.distributed.horovod_compat import (
    Average,
    Sum,
    allgather,
    allgather_object,
    allreduce,
    allreduce_,
    broadcast,
    broadcast_,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
    init,
    is_initialized,
    join,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
