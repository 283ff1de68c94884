"""Recomputation without pipelining: ``autoRecomputation`` (Standard, NormOnly, RecomputeAll) and
the user annotations (``recomputeOutputInBackwardPass``, ``checkpointOutput``) re-run forward
nodes in backward: the trained weights and BatchNorm statistics are the plain run's, and the
activations autograd keeps for backward shrink."""
import numpy as np
import onnx
import pytest
import torch

import popart
from openpop.popart import recompute
from openpop.popart.recompute import run_checkpointed

from helpers.popart_models import build_mlp, mlp_weights

pytestmark = pytest.mark.usefixtures("one_thread")

MB, SIZES = 16, (8, 64, 64, 64, 4)


def _train(builder, loss, ids, feeds, *, mode=popart.RecomputationType.NoRecompute, steps=2):
    opts = popart.SessionOptions()
    opts.autoRecomputation = mode
    flow = popart.DataFlow(1, {loss: popart.AnchorReturnType("All")})
    optimizer = popart.SGD({"defaultLearningRate": (0.1, False), "defaultMomentum": (0.5, True)})
    session = popart.TrainingSession(builder.getModelProto(), flow, loss, optimizer,
                                     popart.DeviceManager().createCpuDevice(), userOptions=opts)
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    losses = []
    for _ in range(steps):
        session.run(popart.PyStepIO(feeds, anchors))
        losses.append(float(anchors[loss]))
    session.weightsToHost()
    weights = {i: np.zeros(session.getInfo(i).shape(), np.float32) for i in ids}
    session.readWeights(popart.PyWeightsIO(weights))
    return session, losses, weights


def _saved_activation_bytes(session, feeds, monkeypatch):
    """Bytes of the non-weight tensors kept for backward in one training forward: those autograd
    saves, and the inputs each recomputed region keeps to re-run from."""
    module = session._module
    weights = {t.data_ptr() for t in module.parameters()} | {t.data_ptr() for t in module.buffers()}
    seen = {}

    def keep(tensor):
        if tensor.data_ptr() not in weights:
            seen[tensor.data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    def checkpointed(state, function, inputs):
        for tensor in inputs:
            keep(tensor)
        return run_checkpointed(state, function, inputs)
    monkeypatch.setattr(recompute, "run_checkpointed", checkpointed)
    inputs = tuple(torch.from_numpy(feeds[i]) for i in module.input_ids)
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        module(torch.zeros(1, dtype=torch.int64), *inputs)
    monkeypatch.undo()
    return sum(seen.values())


def _mlp():
    builder, x, labels, _probs, loss, ids = build_mlp(MB, mlp_weights(3, SIZES))
    rng = np.random.default_rng(0)
    feeds = {x: rng.standard_normal((MB, 8)).astype(np.float32), labels: rng.integers(0, 4, MB).astype(np.int32)}
    return builder, loss, ids, feeds


@pytest.mark.parametrize("mode", [popart.RecomputationType.Standard, popart.RecomputationType.RecomputeAll])
def test_auto_recomputation_trains_identically_and_keeps_less(mode, monkeypatch):
    builder, loss, ids, feeds = _mlp()
    plain, plain_losses, plain_weights = _train(builder, loss, ids, feeds)
    recomputed, losses, weights = _train(builder, loss, ids, feeds, mode=mode)
    assert losses == plain_losses
    for i in ids:
        np.testing.assert_array_equal(weights[i], plain_weights[i], err_msg=i)
    kept = _saved_activation_bytes(recomputed, feeds, monkeypatch)
    plain_kept = _saved_activation_bytes(plain, feeds, monkeypatch)
    print(mode, kept, plain_kept)
    # RecomputeAll keeps the model input only; Standard the boundaries of its sqrt(n) regions.
    assert kept < (0.5 if mode == popart.RecomputationType.RecomputeAll else 0.75) * plain_kept, (kept, plain_kept)


def test_user_annotations_recompute_marked_nodes_only(monkeypatch):
    builder, loss, ids, feeds = _mlp()
    plain, plain_losses, plain_weights = _train(builder, loss, ids, feeds)
    nodes = onnx.load_from_string(builder.getModelProto()).graph.node
    last_relu = max(k for k, n in enumerate(nodes) if n.op_type == "Relu")
    for node in nodes[:last_relu + 1]:  # the hidden layers: one recomputed region
        builder.recomputeOutputInBackwardPass(node.output[0])
    annotated, losses, weights = _train(builder, loss, ids, feeds)
    assert losses == plain_losses
    for i in ids:
        np.testing.assert_array_equal(weights[i], plain_weights[i], err_msg=i)
    kept = _saved_activation_bytes(annotated, feeds, monkeypatch)
    plain_kept = _saved_activation_bytes(plain, feeds, monkeypatch)
    assert kept < 0.5 * plain_kept, (kept, plain_kept)


def _chain(checkpoint):
    """x -> 3 x (matmul, tanh), the second tanh's output optionally checkpointed -> l1 loss."""
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [MB, 32]), "x")
    rng = np.random.default_rng(4)
    ids, h = [], x
    for k in range(3):
        w = builder.addInitializedInputTensor((rng.standard_normal((32, 32)) / 6).astype(np.float32), f"w{k}")
        ids.append(w)
        h = builder.aiOnnx.tanh([builder.aiOnnx.matmul([h, w])])
        if checkpoint and k == 1:
            h = builder.checkpointOutput([h])[0]
    loss = builder.aiGraphcore.l1loss([h], 0.1)
    return builder, {x: rng.standard_normal((MB, 32)).astype(np.float32)}, loss, ids


def test_checkpoint_output_is_kept_under_recompute_all(monkeypatch):
    results = {}
    for checkpoint in (False, True):
        builder, feeds, loss, ids = _chain(checkpoint)
        nodes = list(onnx.load_from_string(builder.getModelProto()).graph.node)
        found = recompute.regions(nodes, popart.RecomputationType.RecomputeAll)
        session, losses, weights = _train(builder, loss, ids, feeds, mode=popart.RecomputationType.RecomputeAll)
        results[checkpoint] = (found, losses, weights, _saved_activation_bytes(session, feeds, monkeypatch))
    assert results[False][0] == [1] * 7
    assert results[True][0] == [1, 1, 1, 1, None, 2, 2, 2]  # the checkpoint splits the region
    assert results[True][1] == results[False][1]
    for i in results[True][2]:
        np.testing.assert_array_equal(results[True][2][i], results[False][2][i])
    # the checkpointed [MB, 32] activation is kept as well
    assert results[True][3] >= results[False][3] + MB * 32 * 4


def test_batchnorm_statistics_update_once_when_recomputed():
    def build():
        builder = popart.Builder()
        x = builder.addInputTensor(popart.TensorInfo("FLOAT", [4, 3, 5, 5]), "x")
        rng = np.random.default_rng(1)
        w = builder.addInitializedInputTensor(rng.standard_normal((6, 3, 3, 3)).astype(np.float32) * 0.3, "w")
        ids = [w]
        h = builder.aiOnnx.conv([x, w], pads=[1, 1, 1, 1])
        scale = builder.addInitializedInputTensor(np.ones(6, np.float32), "scale")
        bias = builder.addInitializedInputTensor(np.zeros(6, np.float32), "bias")
        mean = builder.addInitializedInputTensor(np.zeros(6, np.float32), "mean")
        var = builder.addInitializedInputTensor(np.ones(6, np.float32), "var")
        h = builder.aiOnnx.batchnormalization([h, scale, bias, mean, var], 5)[0]
        loss = builder.aiGraphcore.l1loss([builder.aiOnnx.relu([h])], 0.1)
        return builder, x, loss, ids + [scale, bias, mean, var]
    builder, x, loss, ids = build()
    feeds = {x: np.random.default_rng(2).standard_normal((4, 3, 5, 5)).astype(np.float32)}
    _, plain_losses, plain = _train(builder, loss, ids, feeds)
    for mode in (popart.RecomputationType.RecomputeAll, popart.RecomputationType.NormOnly):
        _, losses, recomputed = _train(builder, loss, ids, feeds, mode=mode)
        assert losses == plain_losses
        for i in ids:
            np.testing.assert_array_equal(recomputed[i], plain[i], err_msg=f"{mode} {i}")
