"""The output collector, directly: which micro-batches' outputs a host call returns for each
output mode, in what order and shape, and what it does to the returned tensors.

Micro-batch (step d, accumulation g, replica r) returns rows valued ``v = 100*d + 10*g + r``, so
each expected result below is written out from the mode's rule."""
import pytest
import torch

import poptorch
from openpop.runtime.geometry import BatchGeometry
from openpop.runtime.outputs import OutputCollector

All, EveryN, Final, Sum = (poptorch.OutputMode.All, poptorch.OutputMode.EveryN, poptorch.OutputMode.Final,
                           poptorch.OutputMode.Sum)
MICRO = 2  # rows per micro-batch


def value(d, g, r):
    return 100 * d + 10 * g + r


def collect(mode, geometry, output_of, period=1):
    """Run a host call's micro-batches in ``[DI, GA, R]`` order through a collector."""
    collector = OutputCollector(mode, period, geometry)
    for micro in geometry.micro_batches():
        if collector.wants(micro.step, micro.accumulation):
            collector.add(micro.replica, output_of(micro.step, micro.accumulation, micro.replica))
    return collector.result()


def rows(d, g, r):
    return torch.full((MICRO, 3), float(value(d, g, r)))


def expected_rows(values):
    return torch.cat([torch.full((MICRO, 3), float(v)) for v in values])


DI, GA, R = 4, 3, 2
GEOMETRY = BatchGeometry(device_iterations=DI, gradient_accumulation=GA, replication_factor=R)
EVERY = [(d, g, r) for d in range(DI) for g in range(GA) for r in range(R)]

# id: (mode, period, values of the returned rows in order)
MODES = {
    "all": (All, 1, [value(*m) for m in EVERY]),
    "every_2nd_iteration": (EveryN, 2, [value(d, g, r) for d, g, r in EVERY if d in (1, 3)]),
    "every_4th_iteration": (EveryN, 4, [value(3, g, r) for g in range(GA) for r in range(R)]),
    "final": (Final, 1, [value(DI - 1, GA - 1, r) for r in range(R)]),
    "sum_per_replica": (Sum, 1, [sum(value(d, g, r) for d in range(DI) for g in range(GA)) for r in range(R)]),
}


@pytest.mark.parametrize("name", MODES)
def test_rows_returned_per_mode(name):
    mode, period, values = MODES[name]
    out = collect(mode, GEOMETRY, rows, period)
    torch.testing.assert_close(out, expected_rows(values), atol=0, rtol=0)


@pytest.mark.parametrize("name", MODES)
def test_a_scalar_per_micro_batch_becomes_one_row_each(name):
    mode, period, values = MODES[name]
    out = collect(mode, GEOMETRY, lambda d, g, r: torch.tensor(float(value(d, g, r))), period)
    torch.testing.assert_close(out, torch.tensor(values, dtype=torch.float32), atol=0, rtol=0)


@pytest.mark.parametrize("mode", [Final, Sum])
def test_a_single_row_keeps_its_shape(mode):
    geometry = BatchGeometry(device_iterations=2, gradient_accumulation=2)
    loss = collect(mode, geometry, lambda d, g, r: torch.tensor(float(value(d, g, r))))
    assert loss.shape == ()
    assert loss.item() == (110.0 if mode == Final else 0 + 10 + 100 + 110)
    out = collect(mode, geometry, rows)
    assert out.shape == (MICRO, 3)


def test_structures_are_assembled_per_leaf():
    geometry = BatchGeometry(device_iterations=2, replication_factor=2)
    order = [(d, 0, r) for d in range(2) for r in range(2)]

    def output_of(d, g, r):
        return {"logits": rows(d, g, r), "pair": (torch.tensor(float(r)), [torch.tensor([d])]),
                "ids": [f"{d}{r}a", f"{d}{r}b"], "step": d}

    out = collect(All, geometry, output_of)
    assert set(out) == {"logits", "pair", "ids", "step"}
    torch.testing.assert_close(out["logits"], expected_rows([value(*m) for m in order]))
    torch.testing.assert_close(out["pair"][0], torch.tensor([0.0, 1.0, 0.0, 1.0]))
    torch.testing.assert_close(out["pair"][1][0], torch.tensor([0, 0, 1, 1], dtype=torch.int32))
    assert out["ids"] == ["00a", "00b", "01a", "01b", "10a", "10b", "11a", "11b"]  # row order
    assert out["step"] == 1  # a non-tensor leaf: the last micro-batch's


def test_tuple_of_tensors_stays_a_tuple():
    out = collect(All, BatchGeometry(gradient_accumulation=2), lambda d, g, r: (rows(d, g, r), torch.tensor(g)))
    assert type(out) is tuple and len(out) == 2
    torch.testing.assert_close(out[0], expected_rows([0, 10]))
    assert out[1].tolist() == [0, 1]


@pytest.mark.parametrize("dtype, returned", [(torch.int64, torch.int32), (torch.float64, torch.float32),
                                             (torch.float16, torch.float16), (torch.int32, torch.int32),
                                             (torch.bool, torch.bool)])
def test_returned_dtypes(dtype, returned):
    for geometry in (BatchGeometry(), BatchGeometry(device_iterations=2)):
        out = collect(All, geometry, lambda d, g, r: torch.ones(MICRO, dtype=dtype))
        assert out.dtype == returned


def test_returned_tensors_are_copies_that_refuse_backward():
    weight = torch.ones(MICRO, requires_grad=True)
    out = collect(All, BatchGeometry(), lambda d, g, r: weight * 1)
    assert not out.requires_grad
    kept = torch.zeros(3)
    same = collect(All, BatchGeometry(), lambda d, g, r: kept)
    kept.add_(1)
    assert same.tolist() == [0.0, 0.0, 0.0]  # never aliases a live tensor
    with pytest.raises(poptorch.Error, match=r"backward\(\) cannot be called explicitly on outputs of a PopTorch"):
        out.backward()


def test_nothing_collected_is_none():
    collector = OutputCollector(All, 1, BatchGeometry())
    assert collector.result() is None
