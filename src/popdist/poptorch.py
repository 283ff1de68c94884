"""``popdist.poptorch.Options``: a ``poptorch.Options`` set up for this poprun instance.

Its replication factor is the instance's local replicas, ``Distributed`` holds the instance index
and count, and the calls that would contradict poprun (``useIpuId``, ``replicationFactor``,
``Distributed.disable``, ``Distributed.setEnvVarNames``, ``Distributed.configureProcessId``) raise
PopTorch's ``RuntimeError``: under poprun the replica count is poprun's ``--num-replicas``, never
the script's. (A plain ``poptorch.Options`` whose replicas do not add up to it is refused when its
model compiles: ``openpop.runtime.distributed_reduce.check_job_replicas``.) Outside poprun it is a
one-instance, one-replica ``Options`` and ``ipus_per_replica`` may be any number.
"""
from typing import Optional

import popdist
from openpop.distributed import messages as distributed_messages
from openpop.options import Options as _Options
from openpop.options import _DistributedOptions


def _forbidden(name: str) -> RuntimeError:
    return RuntimeError(distributed_messages.FORBIDDEN_WITH_POPDIST_OPTIONS.format(name=name))


class _PopdistDistributedOptions(_DistributedOptions):
    def __init__(self, process_id: int, num_processes: int) -> None:
        self._configured = False  # the base constructor calls setEnvVarNames
        super().__init__()
        _DistributedOptions.configureProcessId(self, process_id, num_processes)
        self._configured = True

    def disable(self):
        raise _forbidden("disable")

    def setEnvVarNames(self, var_num_processes, var_process_id):
        if self._configured:
            raise _forbidden("setEnvVarNames")
        return super().setEnvVarNames(var_num_processes, var_process_id)

    def configureProcessId(self, process_id, num_processes):
        if self._configured:
            raise _forbidden("configureProcessId")
        return super().configureProcessId(process_id, num_processes)


class Options(_Options):
    def __init__(self, ipus_per_replica: Optional[int] = None) -> None:
        if ipus_per_replica is not None and not popdist.checkNumIpusPerReplica(ipus_per_replica):
            raise RuntimeError(popdist.ipus_per_replica_mismatch(
                ipus_per_replica, f"popdist.poptorch.Options(ipus_per_replica={ipus_per_replica})"))
        super().__init__()
        self._distributed = _PopdistDistributedOptions(popdist.getInstanceIndex(), popdist.getNumInstances())
        _Options.replicationFactor(self, popdist.getNumLocalReplicas())

    def useIpuId(self, ipu_id):
        raise _forbidden("useIpuId")

    def replicationFactor(self, replication_factor):
        raise _forbidden("replicationFactor")
