"""popart.GraphTransformer and initializers saved outside the model, as PopART does them (issue 31):
type conversions (data in PopART's fields), initializers made constants, unused inputs removed; external
data written, loaded by sessions, written back by modelToHost and checked when a model is loaded."""
import os

import numpy as np
import onnx
import pytest

import popart


def _add_model(values):
    b = popart.Builder()
    ids = [b.addInitializedInputTensor(v) for v in values]
    out = b.aiOnnx.add(ids)
    b.addOutputTensor(out)
    return b, ids, out


def test_type_conversions_and_constants():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2]))
    w = b.addInitializedInputTensor(np.array([1.5, 2.5], np.float32))
    shape = b.addInitializedInputTensor(np.array([2, 1], np.int64))
    out = b.aiOnnx.reshape([b.aiOnnx.add([x, w]), shape])
    b.addOutputTensor(out)
    gt = popart.GraphTransformer(b.getModelProto())
    gt.convertFloatsToHalfs()
    gt.convertINT64ToINT32()
    model = onnx.load_from_string(gt.getModelProto())
    inits = {t.name: t for t in model.graph.initializer}
    assert inits[w].data_type == onnx.TensorProto.FLOAT16
    assert inits[shape].data_type == onnx.TensorProto.INT32 and list(inits[shape].int32_data) == [2, 1]
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    gt.convertAllFixedPointInitializersToConstants()
    assert shape not in popart.Builder(gt.getModelProto()).getInputTensorIds()
    with pytest.raises(popart.popart_exception, match="^TensorId unknown not in the model initalizers$"):
        gt.convertInitializersToConstants(["unknown"])
    big = popart.GraphTransformer(_add_model([np.array([2**40], np.int64)] * 2)[0].getModelProto())
    with pytest.raises(popart.popart_exception, match="cannot cast int64 to int32: number is too large"):
        big.convertINT64ToINT32()
    big.convertINT64ToINT32(clip=True)


def test_unused_inputs_are_removed():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2]))
    unused = b.addInitializedInputTensor(np.zeros([3], np.float32))
    b.addOutputTensor(b.aiOnnx.relu([x]))
    gt = popart.GraphTransformer(b.getModelProto())
    gt.removeUnusedInputs()
    assert [i.name for i in onnx.load_from_string(gt.getModelProto()).graph.input] == [x]
    assert unused


def test_external_initializers_run_and_are_written_back(tmp_path):
    d1, d2 = np.array([1, -1, 6], np.float32), np.array([-8, 7, 4], np.float32)
    b, (i1, i2), out = _add_model([d1, d2])
    data = str(tmp_path / "tensors.bin")
    b.saveInitializersExternally([i1, i2], data)
    assert np.array_equal(np.fromfile(data, np.float32), np.concatenate([d1, d2]))
    with pytest.raises(popart.popart_exception, match=f"^Tensor '{i1}' already has an external data_location$"):
        b.saveInitializersExternally([i1], data)
    with pytest.raises(popart.popart_exception, match="but its parent directory does not exist$"):
        b.saveInitializersExternally([i2], str(tmp_path / "missing" / "t.bin"))
    model_file = str(tmp_path / "model.onnx")
    b.saveModelProto(model_file)
    opts = popart.SessionOptions()
    opts.constantWeights = False  # writeWeights below (PopART refuses it on constant weights)
    session = popart.InferenceSession(fnModel=popart.Builder(model_file).getModelProto(),
                                      dataFlow=popart.DataFlow(1, {out: popart.AnchorReturnType("All")}),
                                      deviceInfo=popart.DeviceManager().createCpuDevice(), userOptions=opts)
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({}, anchors))
    np.testing.assert_array_equal(anchors[out], d1 + d2)
    session.writeWeights(popart.PyWeightsIO({i1: np.zeros(3, np.float32)}))
    session.weightsFromHost()
    session.modelToHost(str(tmp_path / "saved.onnx"))
    np.testing.assert_array_equal(np.fromfile(data, np.float32)[:3], np.zeros(3))
    moved = str(tmp_path / "moved.bin")
    session.updateExternallySavedTensorLocations(data, moved)
    assert os.path.exists(moved)
    os.remove(data)
    cwd = os.getcwd()
    os.mkdir(tmp_path / "elsewhere")
    try:
        os.chdir(tmp_path / "elsewhere")
        rel = popart.Builder()
        r = rel.addInitializedInputTensor(d1)
        rel.saveInitializersExternally([r], "t.bin")
        rel.saveModelProto("m.onnx")
        os.mkdir("deeper")
        os.chdir("deeper")
        with pytest.raises(RuntimeError, match="t.bin, but it doesn't exist or is not accessible"):
            popart.Builder("../m.onnx")
    finally:
        os.chdir(cwd)
