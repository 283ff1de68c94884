"""popart.Builder: a real ONNX ModelProto with PopART's tensor ids, opsets, shapes and annotations."""
import numpy as np
import onnx
import pytest
import torch

import popart


def test_tensor_ids_follow_popart_scheme():
    b = popart.Builder()
    i0 = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]))
    i1 = b.addInputTensor("FLOAT", [2, 3])
    named = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "data")
    w0 = b.addInitializedInputTensor(np.zeros([3], np.float32))
    w1 = b.addInitializedInputTensor(np.zeros([3], np.float32))
    a0 = b.aiOnnx.add([i0, i1])
    a1 = b.aiOnnx.add([a0, w0])
    s0 = b.aiOnnx.sin([a1], "s0")
    s1 = b.aiOnnx.sin([s0], "s0")
    with b.nameScope("layer"):
        r = b.aiOnnx.relu([s1])
        with b.nameScope("inner"):
            m = b.aiOnnx.mul([r, w1], "m")
    parts = b.aiOnnx.split([m], 3, 1, [1, 1, 1])
    assert (i0, i1, named) == ("input", "input/1", "data")
    assert (w0, w1) == ("init_input", "init_input/1")
    assert (a0, a1, s0, s1) == ("Add:0", "Add:0/1", "s0", "s0/1")
    assert (r, m) == ("layer/Relu:0", "layer/inner/m")
    assert parts == ["Split:0", "Split:1", "Split:2"]
    assert b.getTensorShape(m) == [2, 3] and b.getTensorShape(parts[1]) == [2, 1]
    assert b.getTensorDtypeString(m) == "float32"
    assert b.isInitializer(w0) and not b.isInitializer(i0)
    assert b.getInputTensorIds() == [i0, i1, named, w0, w1]


def test_model_proto_is_valid_onnx_with_opsets_and_types():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 8]))
    w = b.addInitializedInputTensor(np.ones([8, 2], np.float32))
    c = b.addInitializedInputTensor(np.zeros([2], np.float32))
    y = b.aiOnnx.gemm([x, w, c], transB=0)
    b.addOutputTensor(y)
    model = onnx.load_from_string(b.getModelProto())
    onnx.checker.check_model(model)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 10)]
    assert model.graph.output[0].type.tensor_type.shape.dim[1].dim_value == 2
    assert model.graph.initializer[0].name == w


def test_one_opset_per_domain():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2]))
    b.aiOnnxOpset11.relu([x])
    with pytest.raises(popart.popart_exception,
                       match="Invalid opset 'aiOnnxOpset10' selected. Opset for domain ai.onnx already defined as 11"):
        b.aiOnnxOpset10.relu([x])
    assert b.aiOnnx.version == 11
    with pytest.raises(AttributeError, match="no operator 'gelu'"):
        _ = b.aiOnnx.gelu


def test_opset_selected_by_constructor_changes_semantics():
    # Softmax before opset 13 normalises the input flattened at `axis`; from 13 along `axis`.
    data = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    results = {}
    for version in (10, 13):
        b = popart.Builder(opsets={"ai.onnx": version, "ai.graphcore": 1})
        x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3, 4]))
        y = b.aiOnnx.softmax([x], axis=1)
        results[version] = _infer(b, {x: data}, y)
    flat = torch.softmax(torch.from_numpy(data).reshape(2, 12), 1).reshape(2, 3, 4).numpy()
    np.testing.assert_allclose(results[10], flat, rtol=1e-6)
    np.testing.assert_allclose(results[13], torch.softmax(torch.from_numpy(data), 1).numpy(), rtol=1e-6)


def _infer(builder, feeds, out):
    session = popart.InferenceSession(builder.getModelProto(),
                                      popart.DataFlow(1, {out: popart.AnchorReturnType("All")}),
                                      popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO(feeds, anchors))
    return anchors[out]


def test_annotations_as_setters_and_context_managers():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2]))
    with b.virtualGraph(1), b.pipelineStage(2):
        y = b.aiOnnx.relu([x])
        assert b.getVirtualGraph() == 1
    z = b.aiOnnx.exp([y])
    b.virtualGraph(z, 3)
    b.pipelineStage([z], 4)
    b.recomputeOutputInBackwardPass(z)
    assert (b.getVirtualGraph(y), b.getPipelineStage(y)) == (1, 2)
    assert (b.getVirtualGraph(z), b.getPipelineStage(z)) == (3, 4)
    assert b.getRecomputeOutputInBackwardPass(z) and not b.hasVirtualGraph()
    model = onnx.load_from_string(b.getModelProto())
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in model.graph.node[1].attribute}
    assert attrs["__ipu_number"] == 3 and attrs["__pipeline_stage"] == 4
    with pytest.raises(popart.popart_exception, match="Could not find a node that produces tensor 'nope'"):
        b.virtualGraph("nope", 1)


def test_unknown_tensor_and_shape_errors_name_the_node():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]))
    w = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 5]))
    with pytest.raises(popart.popart_exception, match="Tensor 'missing' is not known"):
        b.aiOnnx.add([x, "missing"])
    bad = b.aiOnnx.matmul([x, w], "mm")
    with pytest.raises(popart.popart_exception, match="Shape inference failed for MatMul node 'mm'"):
        b.getTensorShape(bad)


def test_subgraph_call_and_graphcore_ops():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 2]))
    sub = b.createSubgraphBuilder()
    si = sub.addInputTensor(popart.TensorInfo("FLOAT", [2, 2]))
    sub.addOutputTensor(sub.aiOnnx.mul([si, si]))
    (called,) = b.aiGraphcore.call([x], 1, sub)
    y = b.aiGraphcore.scale([called], 3.0)
    data = np.arange(4, dtype=np.float32).reshape(2, 2)
    np.testing.assert_allclose(_infer(b, {x: data}, y), 3 * data * data)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_model_from_torch_onnx_export_runs(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    path = str(tmp_path / "m.onnx")
    x = torch.randn(2, 6)
    try:
        torch.onnx.export(model, (x,), path, input_names=["x"], output_names=["y"], opset_version=11, dynamo=False)
    except Exception as exc:  # the exporter needs extra packages in some torch builds
        pytest.skip(f"torch.onnx.export unavailable here: {exc}")
    session = popart.InferenceSession(path, popart.DataFlow(1, {"y": popart.AnchorReturnType("All")}),
                                      popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({"x": x.numpy()}, anchors))
    np.testing.assert_allclose(anchors["y"], model(x).detach().numpy(), rtol=1e-5, atol=1e-6)
