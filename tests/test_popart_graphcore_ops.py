"""PopART's ai.graphcore ops added for its own operator tests (issue 31): each against numpy/torch, built
with PopART's argument names, and PopART's reduce semantics for an empty ``axes`` (nothing reduced)."""
import numpy as np
import pytest
import torch

import popart


def _run(build, feeds):
    b = popart.Builder()
    ids = {name: b.addInputTensor(popart.TensorInfo(value)) for name, value in feeds.items()}
    outs = build(b, ids)
    outs = outs if isinstance(outs, list) else [outs]
    for o in outs:
        b.addOutputTensor(o)
    session = popart.InferenceSession(fnModel=b.getModelProto(),
                                      dataFlow=popart.DataFlow(1, {o: popart.AnchorReturnType("All") for o in outs}),
                                      deviceInfo=popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({ids[k]: v for k, v in feeds.items()}, anchors))
    return [anchors[o] for o in outs], b, outs


def test_bucketize_sort_and_median():
    x = np.array([[3.0, -1.0, 7.5, 2.0, 0.5], [9.0, 4.0, -3.0, 1.0, 6.0]], np.float32)
    bounds = np.array([0.0, 2.0, 5.0], np.float32)
    (got,), b, outs = _run(lambda b, i: b.aiGraphcore.bucketize([i["x"], i["b"]], right=1), {"x": x, "b": bounds})
    np.testing.assert_array_equal(got, torch.bucketize(torch.tensor(x), torch.tensor(bounds), right=True).numpy())
    assert b.getTensorDtypeString(outs[0]) == "int32"
    (values, indices), _, _ = _run(lambda b, i: b.aiGraphcore.sort([i["x"]], axis=1, descending=1), {"x": x})
    want = torch.sort(torch.tensor(x), dim=1, descending=True)
    np.testing.assert_array_equal(values, want.values.numpy())
    np.testing.assert_array_equal(indices, want.indices.numpy())
    (median, where), _, _ = _run(lambda b, i: b.aiGraphcore.reducemedian([i["x"]], axes=[1], keepdims=0), {"x": x})
    np.testing.assert_array_equal(median, np.median(x, axis=1))
    assert where.dtype == np.int32 and np.all(x[np.arange(2), where] == median)


@pytest.mark.parametrize("op", ["reducesum", "reducemax", "reducel2"])
def test_empty_axes_reduce_nothing_as_in_popart(op):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (same,), b, outs = _run(lambda b, i: getattr(b.aiOnnx, op)([i["x"]], axes=[], keepdims=0), {"x": x})
    assert b.getTensorShape(outs[0]) == [2, 3]
    expected = np.abs(x) if op == "reducel2" else x
    np.testing.assert_allclose(same, expected)
    (everything,), _, _ = _run(lambda b, i: getattr(b.aiOnnx, op)([i["x"]], keepdims=0), {"x": x})
    assert everything.shape == ()


def test_elementwise_graphcore_ops():
    x = np.array([-2.5, -0.5, 0.5, 1.5, 2.5], np.float32)
    y = np.array([1.0, 2.0, 3.0, 4.0, 5.0], np.float32)
    (rint, rnd, gelu, scaled, inc), _, _ = _run(lambda b, i: [
        b.aiGraphcore.nearbyint([i["x"]]), b.aiGraphcore.round([i["x"]]), b.aiGraphcore.geluerf([i["x"]]),
        b.aiGraphcore.scaledadd([i["x"], i["y"]], scale0=2.0, scale1=0.5),
        b.aiGraphcore.incrementmod([i["y"]], 2.0, 3.0)], {"x": x, "y": y})
    np.testing.assert_array_equal(rint, np.rint(x))
    np.testing.assert_array_equal(rnd, np.sign(x) * np.floor(np.abs(x) + 0.5))
    np.testing.assert_allclose(gelu, torch.nn.functional.gelu(torch.tensor(x)).numpy(), rtol=1e-6)
    np.testing.assert_allclose(scaled, 2 * x + 0.5 * y)
    np.testing.assert_allclose(inc, np.fmod(y + 2, 3))
    a = np.array([12, 10, 7], np.int32)
    c = np.array([10, 6, 1], np.int32)
    (band, bxnor), _, _ = _run(lambda b, i: [b.aiGraphcore.bitwiseand([i["a"], i["c"]]),
                                            b.aiGraphcore.bitwisexnor([i["a"], i["c"]])], {"a": a, "c": c})
    np.testing.assert_array_equal(band, a & c)
    np.testing.assert_array_equal(bxnor, ~(a ^ c))


def test_sequenceslice_groupedgather_normalize_image():
    source = np.arange(12, dtype=np.float32).reshape(6, 2) + 10
    dest = np.full([5, 2], -1, np.float32)
    n, src, dst = (np.array(v, np.uint32) for v in ([2, 1], [0, 4], [1, 4]))
    (got,), _, _ = _run(lambda b, i: b.aiGraphcore.sequenceslice([i["s"], i["d"], i["n"], i["so"], i["do"]], True),
                        {"s": source, "d": dest, "n": n, "so": src, "do": dst})
    want = np.zeros_like(dest)
    want[1:3], want[4:5] = source[0:2], source[4:5]
    np.testing.assert_array_equal(got, want)
    data = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    idx = np.array([[2, 0], [1, 1]], np.int32)
    (gathered,), _, _ = _run(lambda b, i: b.aiGraphcore.groupedgather([i["d"], i["i"]], axis=1, group_size=2),
                             {"d": data, "i": idx})
    np.testing.assert_array_equal(gathered, np.stack([data[0][idx[0]], data[1][idx[1]]]))
    img = np.random.default_rng(0).integers(0, 255, [2, 2, 3]).astype(np.uint8)
    offsets, scales = np.array([1, 2, 3], np.float16), np.array([4, 5, 6], np.float16)
    (norm,), _, _ = _run(lambda b, i: b.aiGraphcore.normalize_image([i["i"], i["o"], i["s"]], scale=1 / 255),
                         {"i": img, "o": offsets, "s": scales})
    want = ((img.astype(np.float16) * np.float16(1 / 255)) - offsets) * scales
    assert norm.dtype == np.float16 and norm.shape == (2, 2, 4)
    np.testing.assert_allclose(norm[..., :3], want, rtol=1e-2)
    assert not norm[..., 3].any()


def test_ctcloss_matches_torch_and_multiconv_runs_each_convolution():
    rng = np.random.default_rng(0)
    log_probs = torch.log_softmax(torch.tensor(rng.random([6, 2, 3], dtype=np.float32)), 2).numpy()
    targets = np.array([[1, 2], [2, 2]], np.uint32)
    lengths, target_lengths = np.full([2], 6, np.uint32), np.array([2, 1], np.uint32)
    (loss,), b, outs = _run(lambda b, i: b.aiGraphcore.ctcloss([i["lp"], i["t"], i["l"], i["tl"]],
                                                               popart.ReductionType.Sum, 0),
                            {"lp": log_probs, "t": targets, "l": lengths, "tl": target_lengths})
    want = torch.nn.functional.ctc_loss(torch.tensor(log_probs), torch.tensor(targets.astype(np.int64)),
                                        torch.tensor(lengths.astype(np.int64)),
                                        torch.tensor(target_lengths.astype(np.int64)), reduction="sum")
    assert b.getTensorShape(outs[0]) == []
    np.testing.assert_allclose(loss, want.numpy(), rtol=1e-5)
    x1, w1 = rng.random([1, 2, 5, 5], dtype=np.float32), rng.random([3, 2, 3, 3], dtype=np.float32)
    x2, w2 = rng.random([1, 1, 8], dtype=np.float32), rng.random([2, 1, 2], dtype=np.float32)
    (c1, c2), _, _ = _run(lambda b, i: b.aiGraphcore.multiconv([[i["x1"], i["w1"]], [i["x2"], i["w2"]]],
                                                               pads=[[1, 1, 1, 1], [0, 0]], strides=[[1, 1], [2]]),
                          {"x1": x1, "w1": w1, "x2": x2, "w2": w2})
    np.testing.assert_allclose(c1, torch.nn.functional.conv2d(torch.tensor(x1), torch.tensor(w1), padding=1).numpy(),
                               rtol=1e-5)
    np.testing.assert_allclose(c2, torch.nn.functional.conv1d(torch.tensor(x2), torch.tensor(w2), stride=2).numpy(),
                               rtol=1e-5)


def test_dynamic_ops_with_an_offset_given_at_run_time():
    """dynamicslice/dynamicupdate/dynamicadd/dynamiczero with the offset a stream input (data, not a
    constant), clamped into range as PopART clamps it."""
    data = np.arange(5 * 4, dtype=np.float32).reshape(5, 4)
    update = -np.ones((2, 4), np.float32)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo(data))
    offset = b.addInputTensor(popart.TensorInfo("UINT32", [1]))
    u = b.addInputTensor(popart.TensorInfo(update))
    outs = [b.aiGraphcore.dynamicslice([x, offset], axes=[0], sizes=[2]),
            b.aiGraphcore.dynamicupdate([x, offset, u], axes=[0], sizes=[2]),
            b.aiGraphcore.dynamicadd([x, offset, u], axes=[0], sizes=[2]),
            b.aiGraphcore.dynamiczero([x, offset], axes=[0], sizes=[2])]
    session = popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, outs),
                                      popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    for start, clamped in [(1, 1), (4, 3)]:
        anchors = session.initAnchorArrays()
        session.run(popart.PyStepIO({x: data, offset: np.array([start], np.uint32), u: update}, anchors))
        rows = slice(clamped, clamped + 2)
        np.testing.assert_array_equal(anchors[outs[0]], data[rows])
        for out, block in zip(outs[1:], (update, data[rows] + update, np.zeros_like(update))):
            expected = data.copy()
            expected[rows] = block
            np.testing.assert_array_equal(anchors[out], expected)
