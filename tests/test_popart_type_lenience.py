"""Models PopART accepts where ONNX's own checks are stricter: an int32 Max/Min at opset 10 (ONNX's Max-8
takes float types only), and a uint8 model at opset 9 (converted with ONNX's version converter)
that GraphTransformer retypes to int32 and a session runs."""
import numpy as np
import onnx
from onnx import helper, version_converter

import popart


def _run(proto, anchor, inputs):
    session = popart.InferenceSession(proto, popart.DataFlow(1, {anchor: popart.AnchorReturnType("All")}),
                                      popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO(inputs, anchors))
    return anchors[anchor]


def test_int32_max_and_min_with_constants():
    builder = popart.Builder()  # ai.onnx opset 10
    x = builder.addInputTensor(popart.TensorInfo("INT32", [2, 4]))
    high = builder.aiOnnx.max([x, builder.aiOnnx.constant(np.array([0], dtype=np.int32))])
    clipped = builder.aiOnnx.min([high, builder.aiOnnx.constant(np.array([19], dtype=np.int32))])
    out = builder.aiOnnx.gather([clipped, builder.aiOnnx.constant(np.array([1], dtype=np.int32))])
    assert builder.getTensorShape(out) == [1, 4] and builder.getTensorDtypeString(out) == "int32"
    data = np.array([[-5, 3, 25, 19], [40, -1, 7, 0]], dtype=np.int32)
    got = _run(builder.getModelProto(), out, {x: data})
    np.testing.assert_array_equal(got, np.clip(data, 0, 19)[[1]])
    assert got.dtype == np.int32


def test_uint8_model_below_opset_10_retyped_to_int32(tmp_path):
    values = np.arange(6, dtype=np.uint8).reshape(3, 2)
    node = helper.make_node("ConstantOfShape", ["X"], ["Y"], value=helper.make_tensor(
        "v", onnx.TensorProto.UINT8, [1], values.flatten()[:1].tobytes(), raw=True))
    add = helper.make_node("Add", ["Y", "Z"], ["W"])
    graph = helper.make_graph([node, add], "g", [helper.make_tensor_value_info("Z", onnx.TensorProto.UINT8, [3, 2])],
                              [helper.make_tensor_value_info("W", onnx.TensorProto.UINT8, [3, 2])],
                              initializer=[helper.make_tensor("X", onnx.TensorProto.INT64, [2], [3, 2])])
    model = version_converter.convert_version(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)]),
                                              9)
    path = str(tmp_path / "uint8.onnx")
    onnx.save_model(model, path)
    transformer = popart.GraphTransformer(path)
    transformer.convertUINT8ToINT32()
    proto = transformer.getModelProto()
    retyped = onnx.load_from_string(proto)
    assert retyped.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.INT32
    got = _run(proto, "W", {"Z": values.astype(np.int32)})
    np.testing.assert_array_equal(got, values.astype(np.int32))  # 0 (the constant) + Z
    assert got.dtype == np.int32
