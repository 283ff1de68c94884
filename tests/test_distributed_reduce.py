"""GlobalReplication's gradient buckets in one process (a world of one gloo process): what the
multi-process tests (test_poprun_training.py) cannot see from outside."""
import pytest
import torch
import torch.distributed as dist

from openpop.runtime.distributed_reduce import GlobalReplication


@pytest.fixture
def world_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_bucket_keeps_its_buffer_from_step_to_step(world_of_one):
    """A fresh flat buffer per step is a fresh mapping of tens of MB, page-faulted every step."""
    replication = GlobalReplication(1, 0, mean=True)
    params = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2)),
              torch.nn.Parameter(torch.zeros(4))]
    buffers = []
    for step in (1.0, 2.0):
        params[0].grad, params[1].grad = torch.full((3,), step), None  # a parameter without gradient
        params[2].grad = torch.arange(4.0) * step
        replication.start_step(params, 1, overlap=False)
        replication.all_reduce(params)
        buffers.append(replication._flats[0].data_ptr())
        assert params[0].grad.tolist() == [step] * 3 and params[1].grad is None
        assert params[2].grad.tolist() == (torch.arange(4.0) * step).tolist()
        assert all(g.grad is None or g.grad.data_ptr() != buffers[-1] for g in params)  # copies, not views
    assert buffers[0] == buffers[1]
