"""Options and datasets shared by the data-loading tests."""
import torch
from torch.utils.data import TensorDataset

from openpop.enums import CommGroupType
from openpop.options import Options


def make_options(di=1, r=1, ga=1, group=1, process=None, seed=None):
    opts = Options()
    opts.deviceIterations(di)
    opts.replicationFactor(r)
    opts.Training.gradientAccumulation(ga)
    if group > 1:
        opts.inputReplicaGrouping(group, CommGroupType.Consecutive)
    if process is not None:
        opts.Distributed.configureProcessId(*process)
    if seed is not None:
        opts.randomSeed(seed)
    return opts


def indexed_dataset(n, features=3):
    """Element i is (a row of i's, i)."""
    index = torch.arange(n)
    return TensorDataset(index.float().unsqueeze(1).repeat(1, features), index)
