"""The interpreter fuses MatMul+Add (addmm) and Softmax+Nll (cross_entropy) when the middle tensor
is used by nothing else; anchoring it (or its gradient) keeps the ops apart. Both give the
torch loop's numbers."""
import numpy as np
import onnx
import pytest
import torch

import popart

from helpers.popart_models import build_mlp, mlp_weights, torch_reference_training

pytestmark = pytest.mark.usefixtures("one_thread")

MB = 4


def _session(anchored=()):
    weights = mlp_weights()
    builder, x, labels, probs, loss, ids = build_mlp(MB, weights)
    anchors = {loss: popart.AnchorReturnType("All")}
    anchors.update({a: popart.AnchorReturnType("All") for a in anchored})
    session = popart.TrainingSession(builder.getModelProto(), popart.DataFlow(2, anchors), loss,
                                     popart.SGD({"defaultLearningRate": (0.1, False)}),
                                     popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    session.weightsFromHost()
    return session, builder, x, labels, probs, loss, ids, weights


def _op_types(session):
    return [step[2].__name__ for segment in session._module.segments for step in segment._steps]


def test_pairs_are_fused_unless_their_middle_tensor_is_anchored():
    session, *_ = _session()
    assert _op_types(session) == ["matmul_add", "relu", "matmul_add", "softmax_nll"]
    _, builder, _, _, probs, _, _, _ = _session()
    session, *_ = _session(anchored=[probs])
    assert _op_types(session) == ["matmul_add", "relu", "matmul_add", "softmax", "nll_loss"]
    matmul = next(n.output[0] for n in onnx.load_from_string(builder.getModelProto()).graph.node
                  if n.op_type == "MatMul")
    session, *_ = _session(anchored=[popart.reservedGradientPrefix() + matmul])
    assert _op_types(session) == ["matmul", "impl", "relu", "matmul_add", "softmax_nll"]  # impl: Add


@pytest.mark.parametrize("anchor_probs", [False, True])
def test_fused_and_unfused_sessions_match_the_torch_loop(anchor_probs):
    session, _builder, x, labels, _probs, loss, ids, weights = _session(["probs"] if anchor_probs else [])
    rng = np.random.default_rng(5)
    data = rng.standard_normal((2, 1, 1, MB, 8)).astype(np.float32)
    target = rng.integers(0, 4, (2, 1, 1, MB)).astype(np.int32)
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({x: data.reshape(2, MB, 8), labels: target.reshape(2, MB)}, anchors))
    losses, final = torch_reference_training(weights, data, target, bps=2, accl=1, repl=1,
                                             make_optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    np.testing.assert_allclose(anchors[loss], losses.reshape(2).numpy(), rtol=1e-6, atol=1e-6)
    session.weightsToHost()
    got = {i: np.zeros_like(w) for i, w in zip(ids, final)}
    session.readWeights(popart.PyWeightsIO(got))
    for i, w in zip(ids, final):
        np.testing.assert_allclose(got[i], w, rtol=1e-5, atol=1e-6, err_msg=i)
