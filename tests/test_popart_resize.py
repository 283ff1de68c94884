"""Resize as PopART computes it (its backend's arithmetic, issue 31): any dimension, output sizes
``floor(size * scale)`` in float32, opset 10's ``pytorch`` nearest rounding, and its error when both
``scales`` and ``sizes`` are given."""
import numpy as np
import pytest
import torch

import popart


def _resize(x, scales=None, sizes=None, opset=11, **attrs):
    b = popart.Builder(opsets={"ai.onnx": opset, "ai.graphcore": 1})
    d = b.addInputTensor(popart.TensorInfo(x))
    if opset == 10:
        o = b.aiOnnx.resize([d, b.aiOnnx.constant(np.array(scales, np.float32))], **attrs)
    else:
        roi = b.aiOnnx.constant(np.array([], np.float32))
        s = b.aiOnnx.constant(np.array(scales or [], np.float32))
        inputs = [d, roi, s] + ([b.aiOnnx.constant(np.array(sizes, np.int64))] if sizes is not None else [])
        o = b.aiOnnx.resize(inputs, **attrs)
    shape = b.getTensorShape(o)
    session = popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {o: popart.AnchorReturnType("All")}),
                                      popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({d: x}, anchors))
    assert list(anchors[o].shape) == shape
    return anchors[o]


def test_every_dimension_resizes():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(_resize(x, [2, 1]), np.repeat(x, 2, axis=0))


def test_output_size_is_float32_floor_and_linear_matches_torch():
    x = np.random.default_rng(0).random([1, 1, 10], dtype=np.float32)
    got = _resize(x, [1, 1, 0.7], mode="linear", coordinate_transformation_mode="pytorch_half_pixel")
    assert got.shape == (1, 1, 7)  # ONNX's double arithmetic would give 6
    want = torch.nn.functional.interpolate(torch.tensor(x), size=7, mode="linear", align_corners=False)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6, atol=1e-6)


def test_opset_10_nearest_is_popart_pytorch_mode():
    x = np.arange(5, dtype=np.float32).reshape(1, 1, 5)
    got = _resize(x, [1, 1, 0.5], opset=10)  # floor(i / scale): indices 0, 2
    np.testing.assert_array_equal(got, [[[0, 2]]])


def test_sizes_and_scales_together_are_refused():
    x = np.zeros([1, 1, 4], np.float32)
    with pytest.raises(popart.popart_exception, match="^Resize op has inputs for `sizes` and `scales`"):
        _resize(x, [1, 1, 2], sizes=[1, 1, 8])
    assert _resize(x, sizes=[1, 1, 8]).shape == (1, 1, 8)
