"""BatchGeometry: the micro-batch order of a host call and where each reads its input rows."""
import pytest
import torch

import poptorch
from openpop.enums import CommGroupType
from openpop.runtime.geometry import BatchGeometry, combined_batch_factor


def test_micro_batches_follow_popart_order():
    geometry = BatchGeometry(device_iterations=2, gradient_accumulation=3, replication_factor=2)
    order = [(m.step, m.accumulation, m.replica) for m in geometry.micro_batches()]
    assert order == [(d, g, r) for d in range(2) for g in range(3) for r in range(2)]
    assert [m.index for m in geometry.micro_batches(steps=1)] == list(range(6))


def test_input_positions_index_the_split_view():
    geometry = BatchGeometry(device_iterations=2, gradient_accumulation=2, replication_factor=2)
    batch = torch.arange(geometry.batches_per_call * 3)
    view = geometry.split(batch)
    for micro in geometry.micro_batches():
        start = geometry.input_position(micro) * 3
        assert torch.equal(view[micro.step, micro.accumulation, micro.chunk], batch[start:start + 3])


@pytest.mark.parametrize("kind, chunks", [(CommGroupType.Consecutive, [0, 0, 1, 1]),
                                          (CommGroupType.Orthogonal, [0, 1, 0, 1])])
def test_replicas_of_an_input_group_share_a_chunk(kind, chunks):
    geometry = BatchGeometry(replication_factor=4, input_group_size=2, input_group_type=kind)
    assert geometry.input_replicas == 2 and geometry.batches_per_call == 2
    assert [m.chunk for m in geometry.micro_batches()] == chunks


def test_counts():
    geometry = BatchGeometry(device_iterations=4, gradient_accumulation=3, replication_factor=2)
    assert geometry.batches_per_call == 24
    assert geometry.micro_batches_per_step == 6
    assert geometry.output_rows_per_call == 24
    assert len(list(geometry.micro_batches(steps=[0, 2], replicas=1))) == 6


def test_batch_not_divisible_names_the_input_and_the_product():
    geometry = BatchGeometry(device_iterations=4, gradient_accumulation=2)
    with pytest.raises(AssertionError, match=r"In the input x, the batch dimension \(12\) must be a multiple"):
        geometry.check_divisible("x", torch.zeros(12, 2))
    geometry.check_divisible("x", torch.zeros(16, 2))
    geometry.check_divisible("s", torch.tensor(1.0))


def test_from_options_reads_every_factor():
    options = poptorch.Options().deviceIterations(3).replicationFactor(4)
    options.Training.gradientAccumulation(2)
    options.inputReplicaGrouping(2, poptorch.CommGroupType.Orthogonal)
    geometry = BatchGeometry.from_options(options)
    assert geometry == BatchGeometry(device_iterations=3, gradient_accumulation=2, replication_factor=4,
                                     input_group_size=2, input_group_type=CommGroupType.Orthogonal)
    assert combined_batch_factor(options) == 3 * 2 * 2 == geometry.batches_per_call
    assert geometry.micro_batches_per_step == 8 and geometry.output_rows_per_call == 24


def test_split_is_a_view_of_a_contiguous_batch():
    geometry = BatchGeometry(device_iterations=2, gradient_accumulation=3, replication_factor=2)
    batch = torch.arange(geometry.batches_per_call * 5 * 2).reshape(-1, 2)
    view = geometry.split(batch)
    assert view.shape == (2, 3, 2, 5, 2)
    assert view.data_ptr() == batch.data_ptr()
    assert torch.equal(view[1, 2, 0], batch[(1 * 3 + 2) * 2 * 5:][:5])


@pytest.mark.parametrize("kind", [CommGroupType.Consecutive, CommGroupType.Orthogonal])
def test_grouped_replicas_read_the_same_rows(kind):
    geometry = BatchGeometry(device_iterations=2, gradient_accumulation=2, replication_factor=4,
                             input_group_size=2, input_group_type=kind)
    positions = {}
    for micro in geometry.micro_batches():
        positions.setdefault((micro.step, micro.accumulation, micro.chunk), set()).add(geometry.input_position(micro))
    assert all(len(p) == 1 for p in positions.values())  # one position per chunk
    assert sorted(p for ps in positions.values() for p in ps) == list(range(geometry.batches_per_call))


def test_fewer_replicas_run_index_within_their_own_count():
    geometry = BatchGeometry(gradient_accumulation=2, replication_factor=4)
    assert [(m.accumulation, m.replica, m.index) for m in geometry.micro_batches(replicas=2)] == [
        (0, 0, 0), (0, 1, 1), (1, 0, 2), (1, 1, 3)]


def test_batch_not_divisible_message_names_every_factor():
    geometry = BatchGeometry(device_iterations=2, gradient_accumulation=3, replication_factor=4, input_group_size=2)
    with pytest.raises(AssertionError) as info:
        geometry.check_divisible("labels", torch.zeros(10))
    assert ("In the input labels, the batch dimension (10) must be a multiple of Options.deviceIterations(2) * "
            "(Options.replicationFactor(4) / Options.inputReplicaGrouping.input_group_size(2)) * "
            "Options.Training.gradientAccumulation(3) = 12 because") in str(info.value)
