"""PopART's ReplicatedStreamMode.Broadcast inputs (given once, read by every replica), InputSettings as
PopART's builder records it, and a session's options copied at construction."""
import numpy as np
import onnx
import pytest
import torch

import popart


def _broadcast_model(mode):
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), popart.InputSettings(mode), "x")
    y = builder.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "y")  # replicated, as by default
    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    out = builder.aiOnnx.matmul([builder.aiOnnx.add([x, y]), builder.aiOnnx.constant(w)])
    return builder, x, y, out, w


@pytest.mark.parametrize("replicas,bps", [(2, 3), (4, 1)])
def test_broadcast_input_is_given_once_and_every_replica_reads_it(replicas, bps):
    builder, x, y, out, w = _broadcast_model(popart.ReplicatedStreamMode.Broadcast)
    opts = popart.SessionOptions()
    opts.enableReplicatedGraphs, opts.replicatedGraphCount = True, replicas
    session = popart.InferenceSession(fnModel=builder.getModelProto(),
                                      dataFlow=popart.DataFlow(bps, {out: popart.AnchorReturnType("All")}),
                                      userOptions=opts,
                                      deviceInfo=popart.DeviceManager().createIpuModelDevice({"numIPUs": replicas}))
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    rng = np.random.default_rng(0)
    x_data = rng.standard_normal((bps, 2, 3)).astype(np.float32)  # no replica dimension
    y_data = rng.standard_normal((bps, replicas, 2, 3)).astype(np.float32)
    session.run(popart.PyStepIO({x: x_data, y: y_data}, anchors))
    expected = torch.from_numpy(x_data[:, None] + y_data) @ torch.from_numpy(w)
    np.testing.assert_allclose(anchors[out].reshape(bps, replicas, 2, 4), expected.numpy(), rtol=1e-6)
    with pytest.raises(popart.popart_exception, match=f"Tensor x. Expected {bps * 6}, but received"):
        session.run(popart.PyStepIO({x: y_data, y: y_data}, anchors))  # with a replica dimension: too many


def test_input_settings_as_popart_records_them():
    settings = popart.InputSettings(popart.TileSet.IO, popart.ExchangeStrategy.OverlapLoops)
    assert (settings.tileSet(), settings.exchangeStrategy(), settings.replicatedStreamMode()) == (
        popart.TileSet.IO, popart.ExchangeStrategy.OverlapLoops, popart.ReplicatedStreamMode.Replicate)
    assert popart.InputSettings().tileSet() == popart.TileSet.Compute
    assert popart.InputSettings(popart.ReplicatedStreamMode.Broadcast).replicatedStreamMode() == \
        popart.ReplicatedStreamMode.Broadcast
    builder, *_ = _broadcast_model(popart.ReplicatedStreamMode.Broadcast)
    props = {p.key: p.value for p in onnx.load_from_string(builder.getModelProto()).metadata_props}
    assert props["__replicated_stream_mode/x"] == "0" and props["__replicated_stream_mode/y"] == "1"
    assert props["__tile_set/x"] == "0" and props["__exchange_strategy/x"] == "0"
    reloaded = popart.Builder(builder.getModelProto())
    assert {p.key: p.value for p in onnx.load_from_string(reloaded.getModelProto()).metadata_props} == props


def test_session_options_are_copied_at_construction():
    """Changing the options after a session was built (PopART's tests reuse them for a second session)
    does not change the first session's batch geometry."""
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [2]), "x")
    w = builder.addInitializedInputTensor(np.ones(2, dtype=np.float32), "w")
    loss = builder.aiGraphcore.l1loss([builder.aiOnnx.mul([x, w])], 1.0)
    opts = popart.SessionOptions()
    opts.enableGradientAccumulation, opts.accumulationFactor = True, 3
    session = popart.TrainingSession(fnModel=builder.getModelProto(), loss=loss, optimizer=popart.ConstSGD(0.1),
                                     dataFlow=popart.DataFlow(2, {loss: popart.AnchorReturnType("All")}),
                                     userOptions=opts, deviceInfo=popart.DeviceManager().createCpuDevice())
    opts.enableGradientAccumulation, opts.accumulationFactor = False, 1
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({x: np.ones((2, 3, 2), dtype=np.float32)}, anchors))
    assert anchors[loss].shape == (2, 3)
