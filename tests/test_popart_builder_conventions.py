"""popart.Builder called as PopART's users call it: op attributes positionally in the order of PopART's
generated bindings (per ONNX opset), PopART's argument errors, the typed node-attribute API and the
builder-time checks PopART makes (issue 31 item 1)."""
import numpy as np
import onnx
import pytest

import popart
from openpop.popart import signatures


def _attrs(builder, tensor_id):
    model = onnx.load_from_string(builder.getModelProto())
    node = next(n for n in model.graph.node if tensor_id in n.output)
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def test_attributes_bind_positionally_in_popart_order():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 3]))
    w = b.addInitializedInputTensor(np.ones([4, 2], np.float32))
    c = b.addInitializedInputTensor(np.zeros([2], np.float32))
    g = b.aiOnnx.gemm([x, w, c], 2.0, 0.5, 1, 0)
    t = b.aiOnnx.transpose([g], [1, 0])
    p = b.aiOnnx.pad([t], [0, 1, 0, 2], "constant", 3.0)  # opset 10 (PopART's default): pads are attributes
    s = b.aiOnnx.softmax([p], 0, "probs")
    assert _attrs(b, g) == {"alpha": 2.0, "beta": 0.5, "transA": 1, "transB": 0}
    assert _attrs(b, t) == {"perm": [1, 0]}
    assert _attrs(b, p) == {"pads": [0, 1, 0, 2], "mode": b"constant", "value": 3.0}
    assert s == "probs" and _attrs(b, s) == {"axis": 0}
    assert b.getTensorShape(p) == [2, 6]
    assert b.getTensorDtypeString(s) == "float32"


def test_each_opset_takes_its_own_signature():
    v6 = popart.Builder(opsets={"ai.onnx": 6, "ai.graphcore": 1})
    i = v6.addInitializedInputTensor(np.array([1, 6], np.int64))
    v6.aiOnnx.add([i, i], 1, 0, "add_v6")  # opset 6's add has axis, broadcast
    with pytest.raises(TypeError, match=r"add\(\): incompatible function arguments. The following argument types"):
        v6.aiOnnx.add([i, i], "add_v9")  # a string where opset 6 takes the int axis
    v10 = popart.Builder()
    i = v10.addInitializedInputTensor(np.array([1, 6], np.int64))
    assert v10.aiOnnx.add([i, i], "named") == "named"
    with pytest.raises(TypeError, match=r"add\(\): incompatible function arguments"):
        v10.aiOnnx.add([i, i], 1, 0, "add_v6")
    with pytest.raises(TypeError, match=r"conv\(\): incompatible function arguments"):
        v10.aiOnnx.conv()
    assert str(v10.aiOnnx) == "AiOnnx10" and str(v6.aiOnnx) == "AiOnnx6"


def test_opset_11_takes_pads_as_an_input_and_names_logical_ops():
    b = popart.Builder(opsets={"ai.onnx": 11, "ai.graphcore": 1})
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [3]))
    pads = b.aiOnnx.constant(np.array([1, 1], np.int64))
    p = b.aiOnnx.pad([x, pads], "reflect")
    assert b.getTensorShape(p) == [5] and _attrs(b, p) == {"mode": b"reflect"}
    flag = b.addInputTensor(popart.TensorInfo("BOOL", [3]))
    assert b.getTensorDtypeString(b.aiOnnx.logical_and([flag, flag])) == "bool"
    assert b.getTensorShape(b.aiOnnx.logical_not([flag])) == [3]
    top = b.aiOnnx.topk([x, b.aiOnnx.constant(np.array([2], np.int64))], 0, 1, 1)
    assert isinstance(top, list) and len(top) == 2


def test_signature_table_matches_the_registered_ops():
    """Every ai.graphcore op openpop registers has PopART's binding, and opset 6 lists every method."""
    from openpop.popart.ops import registry
    methods = {e.method for (d, _), e in registry.entries().items() if d == registry.GRAPHCORE_DOMAIN}
    assert methods <= set(signatures.AI_GRAPHCORE) | {"call"}
    assert signatures.AI_ONNX[6]["gemm"] == ("args", "alpha:float beta:float broadcast:int transA:int transB:int "
                                                     "debugContext")
    assert signatures.AI_ONNX[11]["pad"] == ("args", "mode:str debugContext")


def test_typed_node_attribute_getters_and_their_errors():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [1, 2, 8, 8]))
    w = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 2, 3, 3]))
    o = b.aiOnnx.conv([x, w], dilations=[1, 1], pads=[0, 0, 0, 0], strides=[1, 1])
    b.addNodeAttribute("i", 100, {o})
    b.addNodeAttribute("iv", [1, 2], [o])
    b.addNodeAttribute("f", 0.5, {o})
    b.addNodeAttribute("fv", [0.5, 1.5], {o})
    b.addNodeAttribute("s", "abba", {o})
    b.addNodeAttribute("sv", ["a", "b"], {o})
    assert b.getInt64NodeAttribute("i", {o}) == 100
    assert b.getInt64VectorNodeAttribute("iv", {o}) == [1, 2]
    assert b.getFloatNodeAttribute("f", {o}) == 0.5
    assert b.getFloatVectorNodeAttribute("fv", {o}) == [0.5, 1.5]
    assert b.getStringNodeAttribute("s", {o}) == "abba"
    assert b.getStringVectorNodeAttribute("sv", {o}) == ["a", "b"]
    assert b.getInt64VectorNodeAttribute("strides", {o}) == [1, 1]
    names = b.getAllNodeAttributeNames({o})
    assert {"i", "iv", "f", "fv", "s", "sv", "strides", "__debug_info_id"} <= set(names)
    with pytest.raises(popart.popart_exception, match="^Attribute f is not an integer.$"):
        b.getInt64NodeAttribute("f", {o})
    with pytest.raises(popart.popart_exception, match="^Attribute i is not a string vector.$"):
        b.getStringVectorNodeAttribute("i", {o})
    with pytest.raises(popart.popart_exception, match="^Node does not have an attribute nope.$"):
        b.getFloatNodeAttribute("nope", {o})
    with pytest.raises(popart.popart_exception, match="^Node already has attribute f.$"):
        b.addNodeAttribute("f", 1, {o})
    with pytest.raises(popart.popart_exception, match="^Cannot remove attribute nope as it does not exist.$"):
        b.removeNodeAttribute("nope", {o})
    b.removeNodeAttribute("f", {o})
    assert not b.nodeHasAttribute("f", {o})
    # The debug-info id stays out of the ModelProto (onnx.reference takes every attribute as an argument).
    assert "__debug_info_id" not in _attrs(b, o)


def test_multi_output_nodes_are_named_by_all_their_outputs():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [6]))
    parts = b.aiOnnx.split([x], 2)
    b.virtualGraph(set(parts), 1)
    assert b.getVirtualGraph(parts) == 1 and b.getVirtualGraph(set(parts)) == 1
    with pytest.raises(popart.popart_exception, match="Could not find a node with outputs Split:0. Must specify all"):
        b.getInt64NodeAttribute("__ipu_number", {parts[0]})
    with pytest.raises(popart.popart_exception, match="^Virtual graph not set in current scope.$"):
        b.getVirtualGraph()
    with pytest.raises(popart.popart_exception, match="^Pipeline stage not set in current scope.$"):
        b.getPipelineStage()
    with b.executionPhase(2):
        assert b.hasExecutionPhase() and b.getExecutionPhase() == 2


def test_builder_time_checks():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [1, 64, 56, 56]))
    w1 = b.addInputTensor(popart.TensorInfo("FLOAT", [256, 64, 1, 1]))
    w64 = b.addInputTensor(popart.TensorInfo("FLOAT", [256, 64, 64, 64]))
    with pytest.raises(popart.popart_exception, match=r"^kernel_shape, \[64 64\], does not match inferred shape "
                                                      r"from weight input 'input/1', \[1 1\]$"):
        b.aiOnnx.conv([x, w1], kernel_shape=[64, 64])
    with pytest.raises(popart.popart_exception, match=r"^Window parameter values combine to give invalid spatial "
                                                      r"output shape: \[-7 -7\]$"):
        b.aiOnnx.conv([x, w64], dilations=[1, 1], strides=[1, 1], pads=[0, 0, 0, 0])
    with pytest.raises(popart.popart_exception, match="^Length of strides vector 1 != number of spatial dim"):
        b.aiOnnx.conv([x, w1], strides=[1])
    with pytest.raises(popart.popart_exception, match=r"^Padding vector \(length 4\) doesn't contain 2 entries"):
        b.aiOnnx.pad([w1], [0, 0, 1, 1])
    with pytest.raises(popart.popart_exception, match="RNN has an invalid number of outputs 3. Must be between 0..2"):
        b.aiOnnx.rnn([x, x, x], 3)
    with pytest.raises(popart.popart_exception, match="^Can not add untyped tensors to the top-level graph."):
        b.addUntypedInputTensor()
    assert b.createSubgraphBuilder().addUntypedInputTensor()
    with pytest.raises(popart.popart_exception, match="setPartialsType should only be called on operators: Conv, "
                                                      "MatMul; but was given: Relu"):
        b.setPartialsType(b.aiOnnx.relu([x]), "HALF")


def test_constructor_opset_is_fixed():
    b = popart.Builder(opsets={"ai.onnx": 9, "ai.graphcore": 1})
    a = b.addInputTensor(popart.TensorInfo("FLOAT", [1]), "a")
    with pytest.raises(RuntimeError, match="^Invalid opset 'aiOnnxOpset8' selected. Opset for domain ai.onnx "
                                           "already defined as 9"):
        b.aiOnnxOpset8.add([a, a])
    assert b.aiOnnxOpset9.add([a, a])


def test_arguments_are_converted_as_pybind_converts_them():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]))
    w = b.addInitializedInputTensor(np.ones([3, 4], np.float32))
    c = b.addInitializedInputTensor(np.zeros([4], np.float32))
    g = b.aiOnnx.gemm([x, w, c], 1, 1, False, False)  # ints for the float alpha/beta, bools for the ints
    assert _attrs(b, g) == {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0}
    assert b.getTensorShape(g) == [2, 4]


def test_call_takes_parent_tensors_added_as_inputs_and_checks_counts():
    b = popart.Builder()
    i0, i1, i2 = (b.addInputTensor(popart.TensorInfo("INT32", [2])) for _ in range(3))
    sub = b.createSubgraphBuilder()
    sub.addInputTensorFromParentGraph(i0)
    sub.addInputTensorFromParentGraph(i1)
    sub.addOutputTensor(sub.aiOnnx.add([i0, i1]))
    act = b.aiGraphcore.call([i0, i1], 1, sub)[0]
    out = b.aiGraphcore.call([act, i2], 1, sub)[0]  # the callee's inputs bind by position
    b.addOutputTensor(out)
    session = popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, {out: popart.AnchorReturnType("All")}),
                                      popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({i0: np.array([2, -1], np.int32), i1: np.array([-4, 3], np.int32),
                                 i2: np.array([1, 2], np.int32)}, anchors))
    np.testing.assert_array_equal(anchors[out], [-1, 4])
    with pytest.raises(popart.popart_exception, match="^For CallOp 'debug', number of outputs \\(2\\) does not "
                                                      "match that of the callee subgraph \\(1\\)$"):
        b.aiGraphcore.call([i0, i1], 2, sub, "debug")
    with pytest.raises(popart.popart_exception, match="^For CallOp '', number of inputs \\(3\\) does not match"):
        b.aiGraphcore.call([i0, i1, i2], 1, sub)


def test_data_type_enum_and_ops_without_inputs():
    """popart.DataType as PopART's enum (TensorInfo and builder methods take it; the model stores ONNX's
    numbers), and ops whose first parameter is an attribute, not the inputs: aiGraphcore.init(shape,
    data_type, init_type[, batch_axis], debugContext), aiOnnx.randomnormal(shape, ...)."""
    assert int(popart.DataType.FLOAT) == 11 and popart.DataType.FLOAT16.name == "FLOAT16"
    assert popart.TensorInfo(popart.DataType.INT32, [3]).data_type() == "INT32"
    b = popart.Builder()
    zeros = b.aiGraphcore.init([2, 3], popart.DataType.FLOAT, popart.InitType.Zero, "zeros")
    counts = b.aiGraphcore.init([4], popart.DataType.INT32, popart.InitType.Zero, 0, "counts")
    assert (b.getTensorShape(zeros), b.getTensorDtypeString(zeros)) == ([2, 3], "float32")
    assert (b.getTensorShape(counts), b.getTensorDtypeString(counts)) == ([4], "int32")
    other = popart.Builder()  # (a model with RandomNormal builds; openpop does not run that op)
    assert other.getTensorShape(other.aiOnnx.randomnormal([2, 5])) == [2, 5]
    out = b.aiOnnx.add([zeros, b.aiOnnx.constant(np.ones((2, 3), np.float32))])
    session = popart.InferenceSession(b.getModelProto(), popart.DataFlow(1, [out]),
                                      popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({}, anchors))
    np.testing.assert_array_equal(anchors[out], np.ones((2, 3), np.float32))
