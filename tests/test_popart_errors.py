"""Bad input gets PopART's errors, raised before anything changes."""
import re

import numpy as np
import onnx
import pytest

import popart

from helpers.popart_models import build_mlp, mlp_weights


def _training(builder, loss, anchors, *, bps=1, opts=None, ipus=1, optimizer=None):
    return popart.TrainingSession(builder.getModelProto(), popart.DataFlow(bps, anchors), loss,
                                  optimizer or popart.ConstSGD(0.1),
                                  popart.DeviceManager().createIpuModelDevice({"numIPUs": ipus}), userOptions=opts)


def test_input_element_count_error_text_and_no_state_change():
    builder, x, labels, _probs, loss, ids = build_mlp(4, mlp_weights())
    opts = popart.SessionOptions()
    opts.enableGradientAccumulation = True
    opts.accumulationFactor = 2
    session = _training(builder, loss, {loss: popart.AnchorReturnType("All")}, bps=3, opts=opts)
    session.prepareDevice()
    session.weightsFromHost()
    before = {i: np.zeros_like(w) for i, w in zip(ids, [a for wb in mlp_weights() for a in wb])}
    expected = ("Unexpected number of input elements for Tensor x. Expected 192, but received 160.\n"
                "To disable this check at your own risk, use IStepIO::enableRuntimeAsserts.\n"
                "This with, \n   replication  factor = 1\n   accumulation factor = 2\n"
                "   batches per step    = 3\n   Tensor nelms        = 32\n")
    stepio = popart.PyStepIO({x: np.zeros([5, 4, 8], np.float32), labels: np.zeros([3, 2, 4], np.int32)},
                             session.initAnchorArrays())
    with pytest.raises(popart.popart_exception) as info:
        session.run(stepio)
    assert str(info.value) == expected
    session.weightsToHost()
    session.readWeights(popart.PyWeightsIO(before))
    for i, (w, _b) in zip(ids, [(a, None) for wb in mlp_weights() for a in wb]):
        np.testing.assert_array_equal(before[i], w)


def test_anchor_return_type_errors():
    with pytest.raises(popart.popart_exception, match="Must specify return period with option 'EVERYN'"):
        popart.AnchorReturnType("EveryN")
    with pytest.raises(popart.popart_exception, match="Invalid anchor return type ID supplied: Most"):
        popart.AnchorReturnType("Most")
    builder, _x, _labels, _probs, loss, _ids = build_mlp(4, mlp_weights())
    with pytest.raises(popart.popart_exception, match="Batches per step must be a multiple of return period"):
        _training(builder, loss, {loss: popart.AnchorReturnType("EveryN", 2)}, bps=3)
    with pytest.raises(popart.popart_exception, match="Anchor tensor 'nothing' not in Ir Tensors"):
        _training(builder, loss, {"nothing": popart.AnchorReturnType("All")})


def test_pipelining_rules():
    weights = mlp_weights()
    builder, _x, _labels, probs, loss, _ids = build_mlp(4, weights)
    opts = popart.SessionOptions()
    opts.enablePipelining = True
    with pytest.raises(popart.popart_exception, match=re.escape(
            "Pipelining requires the 'virtualGraphMode' session option to not be VirtualGraphMode::Off.")):
        _training(builder, loss, {loss: popart.AnchorReturnType("All")}, opts=opts)
    builder, _x, _labels, probs, loss, _ids = build_mlp(4, weights, vgraphs=True)
    opts.virtualGraphMode = popart.VirtualGraphMode.Manual
    opts.enableGradientAccumulation = True
    opts.accumulationFactor = 2
    with pytest.raises(popart.popart_exception, match=re.escape(
            "For pipelining, depth (gradient accumulation factor) must equal at least the number of pipeline "
            "stages (3)")):
        _training(builder, loss, {loss: popart.AnchorReturnType("All")}, opts=opts, ipus=2)
    builder.pipelineStage(probs, 0)  # softmax on virtual graph 1, stage 0 with the first layer
    opts.accumulationFactor = 4
    with pytest.raises(popart.popart_exception, match="have the same pipeline stage 0, but different virtual graph"):
        _training(builder, loss, {loss: popart.AnchorReturnType("All")}, opts=opts, ipus=2)


def test_unsupported_op_is_named_at_session_construction():
    b = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]))
    y = b.aiOnnx.det([b.aiOnnx.matmul([x, b.aiOnnx.transpose([x])])], "determinant")
    with pytest.raises(popart.popart_exception,
                       match=r"Op 'Det' \(domain ai.onnx, opset 11\) of node 'determinant' .* not supported"):
        popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {y: popart.AnchorReturnType("All")}),
                                popart.DeviceManager().createCpuDevice())


def test_session_api_misuse():
    builder, _x, _labels, probs, loss, _ids = build_mlp(4, mlp_weights())
    session = _training(builder, loss, {loss: popart.AnchorReturnType("All")},
                        optimizer=popart.SGD({"defaultLearningRate": (0.1, False), "defaultMomentum": (0.5, True)}))
    with pytest.raises(popart.popart_exception, match=re.escape("Devicex::prepare() must be called before")):
        session.run(popart.PyStepIO({}, {}))
    session.prepareDevice()
    with pytest.raises(popart.popart_exception, match="'defaultMomentum' is constant"):
        session.updateOptimizerFromHost(popart.SGD({"defaultLearningRate": (0.1, False),
                                                    "defaultMomentum": (0.9, True)}))
    session.updateOptimizerFromHost(popart.SGD({"defaultLearningRate": (0.01, False), "defaultMomentum": (0.5, True)}))
    with pytest.raises(popart.popart_exception, match="accumulationFactor > 1"):
        opts = popart.SessionOptions()
        opts.accumulationFactor = 4
        _training(builder, loss, {loss: popart.AnchorReturnType("All")}, opts=opts)
    with pytest.raises(AttributeError, match="no attribute 'enablePipelinning'"):
        popart.SessionOptions().enablePipelinning = True
    inference = popart.InferenceSession(builder.getModelProto(),
                                        popart.DataFlow(1, {probs: popart.AnchorReturnType("All")}),
                                        popart.DeviceManager().createCpuDevice())
    with pytest.raises(popart.popart_exception, match="constantWeights"):
        inference.resetHostWeights(builder.getModelProto())


def test_weights_io_model_to_host_and_reset(tmp_path):
    weights = mlp_weights()
    builder, x, labels, _probs, loss, _ids = build_mlp(4, weights)
    session = _training(builder, loss, {loss: popart.AnchorReturnType("All")})
    session.prepareDevice()
    session.weightsFromHost()
    rng = np.random.default_rng(0)
    session.run(popart.PyStepIO({x: rng.standard_normal((4, 8)).astype(np.float32),
                                 labels: np.array([0, 1, 2, 3], np.int32)}, session.initAnchorArrays()))
    path = str(tmp_path / "trained.onnx")
    session.modelToHost(path)
    trained = {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer}
    assert not np.allclose(trained["w0"], weights[0][0])
    # Write the original weights back, check they reach the device.
    session.writeWeights(popart.PyWeightsIO({"w0": weights[0][0]}))
    session.weightsFromHost()
    session.weightsToHost()
    out = {"w0": np.zeros_like(weights[0][0]), "b0": np.zeros_like(weights[0][1])}
    session.readWeights(popart.PyWeightsIO(out))
    np.testing.assert_array_equal(out["w0"], weights[0][0])
    np.testing.assert_array_equal(out["b0"], trained["b0"])
    session.resetHostWeights(path)
    session.weightsFromHost()
    session.readWeights(popart.PyWeightsIO(out))
    np.testing.assert_array_equal(out["w0"], trained["w0"])
    with pytest.raises(popart.popart_exception, match="writeWeights: 'w0' has 128 elements, got 3"):
        session.writeWeights(popart.PyWeightsIO({"w0": np.zeros(3, np.float32)}))


@pytest.mark.parametrize("factor", [1, 4])
def test_gradient_accumulation_in_an_inference_session(factor):
    """PopART refuses enableGradientAccumulation in an inference session, whatever the factor."""
    builder, _x, _labels, probs, _loss, _ids = build_mlp(4, mlp_weights())
    opts = popart.SessionOptions()
    opts.enableGradientAccumulation, opts.accumulationFactor = True, factor
    with pytest.raises(popart.popart_exception, match=r"^Gradient Accumulation only available when training\.$"):
        popart.InferenceSession(builder.getModelProto(), popart.DataFlow(1, {probs: popart.AnchorReturnType("All")}),
                                popart.DeviceManager().createCpuDevice(), userOptions=opts)


def test_graph_checks_at_session_construction():
    """Nothing left to compute once what no anchor needs is pruned; manual recomputation annotations
    with automatic recomputation."""
    builder = popart.Builder()
    x = builder.addInputTensor("FLOAT", [2])
    builder.aiOnnx.sqrt([x])
    with pytest.raises(popart.popart_exception,
                       match="^All operations in the main graph were pruned, nothing to compute$"):
        popart.InferenceSession(builder.getModelProto(), popart.DataFlow(1, [x]),
                                popart.DeviceManager().createCpuDevice())
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [1]))
    w = builder.addInitializedInputTensor(np.ones(1, np.float32))
    hidden = builder.aiOnnx.relu([builder.aiOnnx.mul([x, w])])
    builder.recomputeOutputInBackwardPass(hidden)
    loss = builder.aiGraphcore.l1loss([hidden], 1.0)
    opts = popart.SessionOptions()
    opts.autoRecomputation = popart.RecomputationType.Standard
    with pytest.raises(popart.popart_exception, match="^A mixture of auto and manual recomputation is not supported$"):
        _training(builder, loss, [loss], opts=opts)
    opts.autoRecomputation = popart.RecomputationType.NoRecompute
    _training(builder, loss, [loss], opts=opts)  # manual annotations alone


def test_constant_weights_and_non_contiguous_arrays():
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]))
    w = builder.addInitializedInputTensor(np.ones((2, 3), np.float32), "w")
    out = builder.aiOnnx.add([x, w])
    session = popart.InferenceSession(builder.getModelProto(), popart.DataFlow(1, [out]),
                                      popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    with pytest.raises(popart.popart_exception, match="^Cannot call writeWeights when constantWeights is set"):
        session.writeWeights(popart.PyWeightsIO({w: np.zeros((2, 3), np.float32)}))
    transposed = np.zeros((3, 2), np.float32).T
    with pytest.raises(popart.popart_exception, match="tensor 'w' as it is not c-contiguous"):
        popart.PyWeightsIO({w: transposed})
    with pytest.raises(popart.popart_exception, match="numpy input array for tensor .* as it is not c-contiguous"):
        popart.PyStepIO({x: transposed}, session.initAnchorArrays())
    callback_io = popart.PyStepIOCallback(lambda tensor_id, prefetch: transposed, lambda tensor_id: None,
                                          lambda tensor_id: np.zeros((2, 3), np.float32), lambda tensor_id: None)
    with pytest.raises(popart.popart_exception, match="not c-contiguous"):
        session.run(callback_io)
    session.run(popart.PyStepIO({x: np.ascontiguousarray(transposed)}, session.initAnchorArrays()))
