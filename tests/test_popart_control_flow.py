"""ONNX control flow built with subgraph builders (``logical_if``, ``loop``, ``scan``): forward
against ONNX's reference evaluator, gradients through the bodies against torch autograd."""
import numpy as np
import onnx
import pytest
import torch
from onnx.reference import ReferenceEvaluator

import popart

pytestmark = pytest.mark.usefixtures("one_thread")

OPSETS = {"ai.onnx": 11, "ai.graphcore": 1}


def _infer(builder, feeds, outputs):
    flow = popart.DataFlow(1, {o: popart.AnchorReturnType("All") for o in outputs})
    session = popart.InferenceSession(builder.getModelProto(), flow, popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO(feeds, anchors))
    return [anchors[o] for o in outputs]


def _strip_annotations(graph):
    """PopART's ``__`` node attributes (``__debug_info_id``...) left out: onnx.reference's If and Loop pass
    every attribute on to their implementation."""
    for node in graph.node:
        kept = [a for a in node.attribute if not a.name.startswith("__")]
        del node.attribute[:]
        node.attribute.extend(kept)
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                _strip_annotations(a.g)


def _reference(builder, feeds, outputs):
    model = onnx.load_from_string(builder.getModelProto())
    _strip_annotations(model.graph)
    for node in model.graph.node:
        if node.op_type == "Loop" and node.input[1] == "":
            # onnx.reference runs no iteration without a condition (the spec: M iterations): give it one.
            model.graph.node.insert(0, onnx.helper.make_node("Constant", [], ["always"], value=onnx.helper.make_tensor(
                "always", onnx.TensorProto.BOOL, [], [True])))
            node.input[1] = "always"
    for o in outputs:
        model.graph.output.append(onnx.ValueInfoProto(name=o))
    return ReferenceEvaluator(model).run(outputs, feeds)


def _if_model():
    b = popart.Builder(opsets=OPSETS)
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]), "x")
    c = b.addInputTensor(popart.TensorInfo("BOOL", []), "c")
    w = b.addInitializedInputTensor(np.full([2, 3], 1.5, np.float32), "w")
    then_branch = b.createSubgraphBuilder()
    then_branch.addInputTensorFromParentGraph(x)
    then_branch.addInputTensorFromParentGraph(w)
    then_branch.addOutputTensor(then_branch.aiOnnx.mul([x, w]))
    then_branch.addOutputTensor(then_branch.aiOnnx.reducesum([x], keepdims=0))
    else_branch = b.createSubgraphBuilder()
    else_branch.addOutputTensor(else_branch.aiOnnx.sub([x, w]))  # outer tensors read implicitly, as ONNX allows
    else_branch.addOutputTensor(else_branch.aiOnnx.reducemax([w], keepdims=0))
    outs = b.aiOnnx.logical_if([c], 2, else_branch, then_branch)
    return b, x, c, w, outs


@pytest.mark.parametrize("condition", [True, False])
def test_if_runs_the_chosen_branch(condition):
    b, x, c, _w, outs = _if_model()
    assert [b.getTensorShape(o) for o in outs] == [[2, 3], []]
    feeds = {x: np.arange(6, dtype=np.float32).reshape(2, 3), c: np.array(condition)}
    for got, want in zip(_infer(b, feeds, outs), _reference(b, feeds, outs)):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def _loop_model(with_condition):
    b = popart.Builder(opsets=OPSETS)
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [3]), "x")
    w = b.addInitializedInputTensor(np.array([0.5, -1.0, 2.0], np.float32), "w")
    body = b.createSubgraphBuilder()
    i = body.addInputTensor(popart.TensorInfo("INT64", []), "i")
    cond = body.addInputTensor(popart.TensorInfo("BOOL", []), "cond")
    v = body.addInputTensor(popart.TensorInfo("FLOAT", [3]), "v")
    step = body.aiOnnx.cast([i], "FLOAT")
    nxt = body.aiOnnx.add([body.aiOnnx.mul([v, w]), body.aiOnnx.mul([x, step])])
    limit = body.aiOnnx.constant(np.array(2, np.int64))
    body.addOutputTensor(body.aiOnnx.less([i, limit]) if with_condition else body.aiOnnx.identity([cond]))
    body.addOutputTensor(nxt)
    body.addOutputTensor(body.aiOnnx.tanh([nxt]))
    trip = b.aiOnnx.constant(np.array(5, np.int64))
    start = b.aiOnnx.constant(np.array(True))
    final, scanned = b.aiOnnx.loop([trip, start if with_condition else "", x], 2, body)
    return b, x, w, final, scanned


@pytest.mark.parametrize("with_condition", [False, True])
def test_loop_carries_values_and_stacks_scan_outputs(with_condition):
    b, x, _w, final, scanned = _loop_model(with_condition)
    feeds = {x: np.array([1.0, 2.0, -3.0], np.float32)}
    got = _infer(b, feeds, [final, scanned])
    want = _reference(b, feeds, [final, scanned])
    assert got[1].shape == ((3 if with_condition else 5), 3)  # stops once i < 2 is false
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-5)


def _scan_model():
    b = popart.Builder(opsets=OPSETS)
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [3, 4]), "x")   # scanned along axis 1
    y = b.addInputTensor(popart.TensorInfo("FLOAT", [4, 3]), "y")   # scanned along axis 0, reversed
    w = b.addInitializedInputTensor(np.array([1.0, 0.5, -2.0], np.float32), "w")
    body = b.createSubgraphBuilder()
    state = body.addInputTensor(popart.TensorInfo("FLOAT", [3]), "state")
    xt = body.addInputTensor(popart.TensorInfo("FLOAT", [3]), "xt")
    yt = body.addInputTensor(popart.TensorInfo("FLOAT", [3]), "yt")
    new = body.aiOnnx.add([body.aiOnnx.mul([state, w]), body.aiOnnx.mul([xt, yt])])
    body.addOutputTensor(new)
    body.addOutputTensor(body.aiOnnx.sigmoid([new]))
    init = b.aiOnnx.constant(np.zeros(3, np.float32))
    final, ys = b.aiOnnx.scan([init, x, y], 2, body, 2, scan_input_axes=[1, 0], scan_input_directions=[0, 1],
                              scan_output_axes=[1], scan_output_directions=[1])
    return b, x, y, w, final, ys


def test_scan_with_axes_and_directions():
    b, x, y, _w, final, ys = _scan_model()
    assert b.getTensorShape(ys) == [3, 4]
    rng = np.random.default_rng(0)
    xv, yv = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    # ONNX's reference evaluator has no reversed scan directions: the loop by hand.
    wv, state, outs = np.array([1.0, 0.5, -2.0], np.float32), np.zeros(3, np.float32), []
    for t in range(4):
        state = state * wv + xv[:, t] * yv[3 - t]
        outs.append(1 / (1 + np.exp(-state)))
    got_final, got_ys = _infer(b, {x: xv, y: yv}, [final, ys])
    np.testing.assert_allclose(got_final, state, rtol=1e-5)
    np.testing.assert_allclose(got_ys, np.stack(outs[::-1], axis=1), rtol=1e-5)


def test_gradients_flow_through_if_loop_and_scan_bodies():
    b, x, w, _final, scanned = _loop_model(True)
    loss = b.aiGraphcore.identityloss([b.aiOnnx.reducesum([scanned], keepdims=0)])
    g = popart.reservedGradientPrefix() + w
    flow = popart.DataFlow(1, {loss: popart.AnchorReturnType("All"), g: popart.AnchorReturnType("All")})
    session = popart.TrainingSession(b.getModelProto(), flow, loss, popart.SGD({"defaultLearningRate": (0.1, False)}),
                                     popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    xv = np.array([1.0, 2.0, -3.0], np.float32)
    session.run(popart.PyStepIO({x: xv}, anchors))
    wt = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
    v, outs = torch.from_numpy(xv), []
    for i in range(3):
        v = v * wt + torch.from_numpy(xv) * i
        outs.append(torch.tanh(v))
    expected = torch.stack(outs).sum()
    expected.backward()
    np.testing.assert_allclose(anchors[loss], expected.item(), rtol=1e-6)
    np.testing.assert_allclose(anchors[g], wt.grad.numpy(), rtol=1e-5)
    session.weightsToHost()
    trained = {w: np.zeros(3, np.float32)}
    session.readWeights(popart.PyWeightsIO(trained))
    np.testing.assert_allclose(trained[w], (wt - 0.1 * wt.grad).detach().numpy(), rtol=1e-6)


def test_if_and_scan_weights_train():
    b, x, c, w, outs = _if_model()
    loss = b.aiGraphcore.identityloss([b.aiOnnx.reducesum([outs[0]], keepdims=0)])
    g = popart.reservedGradientPrefix() + w
    flow = popart.DataFlow(2, {g: popart.AnchorReturnType("All")})
    session = popart.TrainingSession(b.getModelProto(), flow, loss, popart.ConstSGD(0.0),
                                     popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    xv = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    session.run(popart.PyStepIO({x: xv, c: np.array([True, False])}, anchors))
    np.testing.assert_allclose(anchors[g][0], xv[0])          # d(sum(x*w))/dw
    np.testing.assert_allclose(anchors[g][1], -np.ones((2, 3)))  # d(sum(x-w))/dw
    b, x, y, w, _final, ys = _scan_model()
    loss = b.aiGraphcore.identityloss([b.aiOnnx.reducesum([ys], keepdims=0)])
    grad = popart.reservedGradientPrefix() + w
    session = popart.TrainingSession(b.getModelProto(), popart.DataFlow(1, {grad: popart.AnchorReturnType("All")}),
                                     loss, popart.ConstSGD(0.0), popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    rng = np.random.default_rng(1)
    xv, yv = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    session.run(popart.PyStepIO({x: xv, y: yv}, anchors))
    wt = torch.tensor([1.0, 0.5, -2.0], requires_grad=True)
    state, total = torch.zeros(3), 0
    for t in range(4):
        state = state * wt + torch.from_numpy(xv[:, t]) * torch.from_numpy(yv[3 - t])
        total = total + torch.sigmoid(state).sum()
    total.backward()
    np.testing.assert_allclose(anchors[grad], wt.grad.numpy(), rtol=1e-5, atol=1e-6)
