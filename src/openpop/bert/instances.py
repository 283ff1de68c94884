"""The recipe under ``poprun`` (what its ``args.py`` / ``utils.py`` do with popdist).

Each instance trains ``replication_factor`` = its local replicas (poprun's ``--num-replicas``
divided by ``--num-instances`` overrides the config, with the recipe's message), builds its
options with ``popdist.poptorch.Options(ipus_per_replica=...)`` (a mismatch with poprun's
``--ipus-per-replica`` is an error), reads its part of every step of the job's data, and
averages the printed metrics and step time over the instances; instance 0 alone logs and
writes checkpoints (``popdist.execute_on_instances({0}, ...)``). ``global_batch_size`` and the
throughput count every instance. Outside poprun it is one instance and changes nothing.
"""
import torch

import popdist
import popdist.poptorch
import poptorch


class Instances:
    def __init__(self, index: int = 0, count: int = 1, note: str = ""):
        self.index = index
        self.count = count
        self.note = note  # the replication override, logged by instance 0

    @classmethod
    def join(cls, config) -> "Instances":
        """Join poprun's job if this process is one of its instances; sets the local replication factor."""
        if not popdist.isPopdistEnvSet():
            return cls()
        popdist.init()
        note = ""
        if popdist.getNumTotalReplicas() != config.replication_factor:
            note = f"The number of replicas is overridden by PopRun. The new value is {popdist.getNumTotalReplicas()}."
        config.replication_factor = popdist.getNumLocalReplicas()
        return cls(popdist.getInstanceIndex(), popdist.getNumInstances(), note)

    @property
    def distributed(self) -> bool:
        return self.count > 1 or popdist.isPopdistEnvSet()

    @property
    def logs(self) -> bool:
        return self.index == 0

    def new_options(self, config) -> poptorch.Options:
        if not popdist.isPopdistEnvSet():
            return poptorch.Options().replicationFactor(config.replication_factor)
        opts = popdist.poptorch.Options(ipus_per_replica=config.ipus_per_replica)
        # Only the logging instance shows PopTorch's compilation bar, like the rest of the log.
        return opts.showCompilationProgressBar(self.logs)

    def average(self, values):
        """``values`` (floats) averaged over the instances, as the recipe's ``sync_metrics``."""
        if self.count == 1:
            return list(values)
        import torch.distributed as dist
        tensor = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(tensor)
        return (tensor / self.count).tolist()

    def on_first(self, func, *args):
        """``func(*args)`` on instance 0 only (checkpoints); None elsewhere."""
        if not popdist.isPopdistEnvSet():
            return func(*args)
        return popdist.execute_on_instances({0}, func, *args)
