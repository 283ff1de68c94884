"""PopART training on openpop against a hand-written torch loop: batchesPerStep x accumulation x
replication, SGD (momentum, weight decay, per-weight values) and Adam, anchors of every return type,
virtual graphs / pipelining equal to the plain run."""
import numpy as np
import pytest
import torch

import popart

from helpers.popart_models import build_mlp, mlp_weights, torch_reference_training

MB = 4


def _session(builder, loss, anchors, optimizer, *, bps, accl=1, repl=1, opts=None, ipus=1):
    opts = opts or popart.SessionOptions()
    if accl > 1:
        opts.enableGradientAccumulation = True
        opts.accumulationFactor = accl
    if repl > 1:
        opts.enableReplicatedGraphs = True
        opts.replicatedGraphCount = repl
    device = popart.DeviceManager().createIpuModelDevice({"numIPUs": ipus * repl})
    session = popart.TrainingSession(fnModel=builder.getModelProto(), dataFlow=popart.DataFlow(bps, anchors),
                                     loss=loss, optimizer=optimizer, userOptions=opts, deviceInfo=device)
    session.prepareDevice()
    session.weightsFromHost()
    return session


def _data(bps, accl, repl, seed=1):
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((bps, accl, repl, MB, 8)).astype(np.float32)
    labels = rng.integers(0, 4, (bps, accl, repl, MB)).astype(np.int32)
    return data, labels


def _weights_of(session, ids):
    session.weightsToHost()
    out = {i: np.zeros_like(w) for i, w in zip(ids, [a for wb in mlp_weights() for a in wb])}
    session.readWeights(popart.PyWeightsIO(out))
    return [out[i] for i in ids]


@pytest.mark.parametrize("bps,accl,repl", [(1, 1, 1), (3, 1, 1), (2, 3, 1), (2, 1, 2), (2, 2, 2)])
def test_mlp_sgd_matches_torch_loop(bps, accl, repl):
    weights = mlp_weights()
    builder, x, labels, _probs, loss, ids = build_mlp(MB, weights)
    anchors = {loss: popart.AnchorReturnType("All")}
    sgd = popart.SGD({"defaultLearningRate": (0.05, False), "defaultMomentum": (0.9, True),
                      "defaultWeightDecay": (0.01, True)})
    session = _session(builder, loss, anchors, sgd, bps=bps, accl=accl, repl=repl)
    arrays = session.initAnchorArrays()
    data, lab = _data(bps, accl, repl)
    expected_losses, expected = torch_reference_training(
        weights, data, lab, bps=bps, accl=accl, repl=repl,
        make_optimizer=lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01))
    session.run(popart.PyStepIO({x: data, labels: lab}, arrays))
    got_losses = arrays[loss].reshape(bps, accl, repl)
    np.testing.assert_allclose(got_losses, expected_losses.numpy(), rtol=1e-5, atol=1e-6)
    for got, want in zip(_weights_of(session, ids), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode,weight_decay_mode,make", [
    (popart.AdamMode.Adam, popart.WeightDecayMode.Decay,
     lambda p: torch.optim.AdamW(p, lr=0.01, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.1)),
    (popart.AdamMode.Adam, popart.WeightDecayMode.L2Regularization,
     lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.1)),
])
def test_mlp_adam_matches_torch_loop(mode, weight_decay_mode, make):
    bps, accl, repl = 3, 2, 1
    weights = mlp_weights()
    builder, x, labels, _probs, loss, ids = build_mlp(MB, weights)
    adam = popart.Adam({"defaultLearningRate": (0.01, False), "defaultBeta1": (0.9, True),
                        "defaultBeta2": (0.99, True), "defaultEps": (1e-6, True),
                        "defaultWeightDecay": (0.1, True)}, mode=mode, weight_decay_mode=weight_decay_mode)
    session = _session(builder, loss, {loss: popart.AnchorReturnType("All")}, adam, bps=bps, accl=accl)
    arrays = session.initAnchorArrays()
    data, lab = _data(bps, accl, repl)
    _, expected = torch_reference_training(weights, data, lab, bps=bps, accl=accl, repl=repl, make_optimizer=make)
    for _ in range(1):
        session.run(popart.PyStepIO({x: data, labels: lab}, arrays))
    for got, want in zip(_weights_of(session, ids), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_mean_reduction_and_specific_learning_rate():
    bps, accl, repl = 2, 2, 2
    weights = mlp_weights()
    builder, x, labels, _probs, loss, ids = build_mlp(MB, weights)
    sgd = popart.SGD({"defaultLearningRate": (0.1, False)})
    sgd.insertSpecific("w0", {"learningRate": (0.02, False)})
    opts = popart.SessionOptions()
    opts.accumulationAndReplicationReductionType = popart.ReductionType.Mean
    session = _session(builder, loss, {loss: popart.AnchorReturnType("Final")}, sgd, bps=bps, accl=accl,
                       repl=repl, opts=opts)
    data, lab = _data(bps, accl, repl)

    def make(p):
        return torch.optim.SGD([{"params": [p[0]], "lr": 0.02}, {"params": p[1:]}], lr=0.1)
    _, expected = torch_reference_training(weights, data, lab, bps=bps, accl=accl, repl=repl, make_optimizer=make,
                                           reduction="mean")
    session.run(popart.PyStepIO({x: data, labels: lab}, session.initAnchorArrays()))
    for got, want in zip(_weights_of(session, ids), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_anchor_return_types_shapes_and_contents():
    bps, accl, repl = 4, 2, 2
    weights = mlp_weights()
    builder, x, labels, probs, loss, _ids = build_mlp(MB, weights)
    g = popart.reservedGradientPrefix()
    anchors = {loss: popart.AnchorReturnType("All"), probs: popart.AnchorReturnType("EveryN", 2),
               "w1": popart.AnchorReturnType("Final"), g + "b1": popart.AnchorReturnType("Sum"),
               g + "w0": popart.AnchorReturnType("All"), popart.reservedUpdatedVarPrefix() + "b0":
               popart.AnchorReturnType("All")}
    session = _session(builder, loss, anchors, popart.ConstSGD(0.1), bps=bps, accl=accl, repl=repl)
    arrays = session.initAnchorArrays()
    assert arrays[loss].shape == (bps, accl, repl)
    assert arrays[probs].shape == (bps // 2, accl, repl, MB, 4)
    assert arrays["w1"].shape == (repl, 16, 4)
    assert arrays[g + "b1"].shape == (repl, 4)
    assert arrays[g + "w0"].shape == (bps, accl, repl, 8, 16)
    data, lab = _data(bps, accl, repl)
    session.run(popart.PyStepIO({x: data, labels: lab}, arrays))
    # Oracle: per micro-batch forward/backward with the step's weights.
    params = [torch.tensor(a, requires_grad=True) for wb in weights for a in wb]
    from helpers.popart_models import torch_mlp_loss
    all_probs = np.zeros((bps, accl, repl, MB, 4), np.float32)
    grad_b1 = np.zeros((repl, 4), np.float32)
    grad_w0 = np.zeros((bps, accl, repl, 8, 16), np.float32)
    updated_b0 = []
    w1_last = None
    for d in range(bps):
        w1_last = params[2].detach().numpy().copy()
        grads = [torch.zeros_like(p) for p in params]
        for a in range(accl):
            for r in range(repl):
                xb, yb = torch.from_numpy(data[d, a, r]), torch.from_numpy(lab[d, a, r])
                h = torch.relu(xb @ params[0] + params[1]) @ params[2] + params[3]
                all_probs[d, a, r] = torch.softmax(h, 1).detach().numpy()
                gs = torch.autograd.grad(torch_mlp_loss(params, xb, yb), params)
                grad_b1[r] += gs[3].numpy()
                grad_w0[d, a, r] = gs[0].numpy()
                grads = [s + t for s, t in zip(grads, gs)]
        with torch.no_grad():
            for p, gr in zip(params, grads):
                p -= 0.1 * gr
        updated_b0.append(params[1].detach().numpy().copy())
    np.testing.assert_allclose(arrays[probs], all_probs[1::2], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(arrays["w1"], np.stack([w1_last] * repl), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(arrays[g + "b1"], grad_b1, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(arrays[g + "w0"], grad_w0, rtol=1e-4, atol=1e-5)
    upd = arrays[popart.reservedUpdatedVarPrefix() + "b0"]
    np.testing.assert_allclose(upd[:, 0, 0], np.stack(updated_b0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("pipelining", [False, True])
def test_virtual_graphs_and_pipelining_equal_plain_run(pipelining):
    bps, accl, repl = 2, 4, 2
    weights = mlp_weights()
    data, lab = _data(bps, accl, repl)
    results = []
    for placed in (False, True):
        builder, x, labels, probs, loss, ids = build_mlp(MB, weights, vgraphs=placed, stages=placed and pipelining)
        opts = popart.SessionOptions()
        if placed:
            opts.virtualGraphMode = popart.VirtualGraphMode.Manual
            opts.enablePipelining = pipelining
            opts.autoRecomputation = popart.RecomputationType.Pipeline
        session = _session(builder, loss, {loss: popart.AnchorReturnType("All"), probs: popart.AnchorReturnType("Sum")},
                           popart.SGD({"defaultLearningRate": (0.05, False)}), bps=bps, accl=accl, repl=repl,
                           opts=opts, ipus=2 if placed else 1)
        arrays = session.initAnchorArrays()
        session.run(popart.PyStepIO({x: data, labels: lab}, arrays))
        results.append((arrays, _weights_of(session, ids)))
        if placed:
            plan = session.executor.executionPlan()
            assert plan.pipelined == pipelining and plan.ipus_per_replica == 2 and len(plan.blocks) == 2
    (plain, plain_w), (placed_a, placed_w) = results
    for key in plain:
        np.testing.assert_allclose(placed_a[key], plain[key], rtol=1e-6, atol=1e-7)
    for a, b in zip(plain_w, placed_w):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_auto_virtual_graphs_split_and_match():
    bps, accl = 2, 1
    weights = mlp_weights()
    data, lab = _data(bps, accl, 1)
    builder, x, labels, _probs, loss, ids = build_mlp(MB, weights)
    opts = popart.SessionOptions()
    opts.virtualGraphMode = popart.VirtualGraphMode.Auto
    opts.virtualGraphSplitRatios = [0.5, 0.5]
    session = _session(builder, loss, {loss: popart.AnchorReturnType("All")}, popart.ConstSGD(0.05), bps=bps,
                       opts=opts, ipus=2)
    assert [s.ipu for s in session._plan.segments] == [0, 1]
    arrays = session.initAnchorArrays()
    session.run(popart.PyStepIO({x: data, labels: lab}, arrays))
    _, expected = torch_reference_training(weights, data, lab, bps=bps, accl=accl, repl=1,
                                           make_optimizer=lambda p: torch.optim.SGD(p, lr=0.05))
    for got, want in zip(_weights_of(session, ids), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
