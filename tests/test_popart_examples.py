"""The reference's minimal PopART programs (§A.6) and the examples in examples/popart run unchanged."""
import importlib.util
import os

import numpy as np
import onnx
import pytest
import torch

import popart

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples", "popart")


def _example(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_simple_addition_prints_the_sum(capsys):
    a, b, result = _example("simple_addition").main()
    np.testing.assert_allclose(result, a + b)
    assert capsys.readouterr().out == f"Result is {result}\n"


def test_train_then_save_conv_model(tmp_path):
    """§A.6(b): conv + relu + l1loss, gradients of the input and weights anchored, 4 runs, modelToHost."""
    builder = popart.Builder()
    inp = builder.addInputTensor(popart.TensorInfo("FLOAT", [1, 2, 4, 4]))
    weights = builder.addInitializedInputTensor(np.ones([3, 2, 3, 3], np.float32))
    act = builder.aiOnnx.conv([inp, weights], dilations=[1, 1], pads=[1, 1, 1, 1], strides=[1, 1])
    out = builder.aiOnnx.relu([act])
    l1 = builder.aiGraphcore.l1loss([out], 0.1)
    g = popart.reservedGradientPrefix()
    flow = popart.DataFlow(1, {out: popart.AnchorReturnType("All"), g + inp: popart.AnchorReturnType("All"),
                               g + weights: popart.AnchorReturnType("All")})
    opts = popart.SessionOptions()
    opts.constantWeights = False
    session = popart.TrainingSession(fnModel=builder.getModelProto(), dataFlow=flow, loss=l1,
                                     optimizer=popart.ConstSGD(0.01), userOptions=opts,
                                     deviceInfo=popart.DeviceManager().createIpuModelDevice({"numIPUs": 1}))
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    x = torch.ones(1, 2, 4, 4, requires_grad=True)
    w = torch.ones(3, 2, 3, 3, requires_grad=True)
    for _ in range(4):
        session.run(popart.PyStepIO({inp: np.ones([1, 2, 4, 4], np.float32)}, anchors))
        x.grad = w.grad = None
        y = torch.relu(torch.nn.functional.conv2d(x, w, padding=1))
        (0.1 * y.abs()).mean().backward()
        np.testing.assert_allclose(anchors[out], y.detach().numpy(), rtol=1e-6)
        np.testing.assert_allclose(anchors[g + weights], w.grad.numpy(), rtol=1e-5)
        np.testing.assert_allclose(anchors[g + inp], x.grad.numpy(), rtol=1e-5)
        with torch.no_grad():
            w -= 0.01 * w.grad
    path = str(tmp_path / "test.onnx")
    session.modelToHost(path)
    saved = onnx.numpy_helper.to_array(onnx.load(path).graph.initializer[0])
    np.testing.assert_allclose(saved, w.detach().numpy(), rtol=1e-6)


def _replicated_pipeline_anchors(accl, bps, repl, pipelining):
    """§A.6(c): sin/exp/conv on IPU 0, reshape/softmax/nll on IPU 1."""
    rng = np.random.default_rng(0)
    builder = popart.Builder()
    micro = 16 // accl
    shape_d0 = [micro, 2, 4, 4]
    d0 = builder.addInputTensor(popart.TensorInfo("FLOAT", shape_d0))
    w0 = builder.addInitializedInputTensor(np.ones([2, 2, 3, 3], np.float32))
    l0 = builder.addInputTensor(popart.TensorInfo("INT32", [micro]))
    s0 = builder.aiOnnx.sin([d0], "s0")
    e0 = builder.aiOnnx.exp([s0], "e0")
    c0 = builder.aiOnnx.conv([e0, w0], dilations=[1, 1], pads=[1, 1, 1, 1], strides=[1, 1], debugContext="c0")
    r0 = builder.reshape_const(builder.aiOnnx, [c0], [micro, 32])
    out = builder.aiOnnx.softmax([r0], axis=1, debugContext="sfm")
    nll = builder.aiGraphcore.nllloss([out, l0], reduction=popart.ReductionType.Sum)
    art = popart.AnchorReturnType("All")
    anchor_map = {nll: art, w0: art, e0: art, popart.reservedGradientPrefix() + d0: art}
    opts = popart.SessionOptions()
    opts.enablePipelining = pipelining
    opts.enableGradientAccumulation = True
    opts.accumulationFactor = accl
    opts.virtualGraphMode = popart.VirtualGraphMode.Manual
    for t in (s0, e0, c0):
        builder.virtualGraph(t, 0)
    for t in (r0, out, nll):
        builder.virtualGraph(t, 1)
    opts.replicatedGraphCount = repl
    opts.enableReplicatedGraphs = True
    device = popart.DeviceManager().acquireAvailableDevice(2 * repl)
    session = popart.TrainingSession(fnModel=builder.getModelProto(), dataFlow=popart.DataFlow(bps, anchor_map),
                                     loss=nll, optimizer=popart.ConstSGD(0.01), userOptions=opts, deviceInfo=device)
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.setRandomSeed(0)
    label = rng.integers(0, 20, 16).astype(np.int32).reshape(accl, -1)
    label = np.repeat(label[np.newaxis], bps, 0)
    data = rng.random([bps, accl] + shape_d0).astype(np.float32)
    data = np.repeat(data[np.newaxis], repl, 2)
    label = np.repeat(label[np.newaxis], repl, 2)
    stepio = popart.PyStepIO({d0: data, l0: label}, anchors)
    stepio.enableRuntimeAsserts(False)
    session.weightsFromHost()
    session.run(stepio)
    device.detach()
    return anchors, {"nll": nll, "w0": w0, "e0": e0, "grad": popart.reservedGradientPrefix() + d0}


def test_replicated_pipeline_anchors_have_the_documented_shapes_and_match_sharded():
    accl, bps, repl = 4, 4, 2
    piped, ids = _replicated_pipeline_anchors(accl, bps, repl, True)
    sharded, _ = _replicated_pipeline_anchors(accl, bps, repl, False)
    assert piped[ids["nll"]].shape == (bps, accl, repl)
    assert piped[ids["w0"]].shape == (bps, accl, repl, 2, 2, 3, 3)
    assert piped[ids["e0"]].shape == (bps, accl, repl, 4, 2, 4, 4)
    assert piped[ids["grad"]].shape == (bps, accl, repl, 4, 2, 4, 4)
    for key in piped:
        np.testing.assert_array_equal(piped[key], sharded[key])
    # Replicas got the same data: same losses; weights change between steps, not within one.
    np.testing.assert_array_equal(piped[ids["nll"]][:, :, 0], piped[ids["nll"]][:, :, 1])
    np.testing.assert_array_equal(piped[ids["w0"]][1, 0], piped[ids["w0"]][1, 3])
    assert not np.array_equal(piped[ids["w0"]][0, 0], piped[ids["w0"]][1, 0])


def test_mlp_pipelining_example_variants_agree(capsys):
    example = _example("mlp_pipelining")
    small = ["--steps", "2", "--batches-per-step", "2", "--gradient-accumulation", "3", "--micro-batch-size", "4"]
    base = example.main(small)
    assert base[1] < base[0]
    for flags in (["--no-pipelining", "--recompute", "ON"], ["--recompute", "OFF"]):
        np.testing.assert_allclose(example.main(small + flags), base, rtol=1e-5)
    replicated = example.main(small + ["--replication-factor", "2"])
    np.testing.assert_allclose(example.main(small + ["--replication-factor", "2", "--no-pipelining"]),
                               replicated, rtol=1e-5)
    assert "step 1: mean loss" in capsys.readouterr().out


def test_stepio_callbacks_example():
    batches, results = _example("stepio_callbacks").main()
    w = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert len(results) == len(batches)
    for x, y in zip(batches, results):
        np.testing.assert_allclose(y, np.maximum(x @ w, 0))


@pytest.mark.parametrize("kind", ["cpu", "ipumodel", "acquired"])
def test_device_manager_presents_virtual_ipus(kind):
    manager = popart.DeviceManager()
    assert manager is popart.DeviceManager()
    if kind == "cpu":
        device = manager.createCpuDevice()
    elif kind == "ipumodel":
        device = manager.createIpuModelDevice({"numIPUs": 4, "tilesPerIPU": 4})
    else:
        assert len(manager.enumerateDevices(numIpus=4)) >= 1
        device = manager.acquireAvailableDevice(4, pattern=popart.SyncPattern.ReplicaAndLadder)
        assert manager.tryAcquireDeviceById(device.id) is None
    with device:
        assert device.numIpus == (1 if kind == "cpu" else 4)
    if kind == "acquired":
        again = manager.acquireDeviceById(device.id)
        again.detach()
    with pytest.raises(popart.popart_exception, match="Failed to acquire device with 3 IPUs"):
        manager.acquireAvailableDevice(3)
