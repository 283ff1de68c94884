"""A Builder-made CNN (Conv, BatchNormalization, MaxPool, Flatten, Gemm, softmax + NLL) trains for
several steps with batchesPerStep x accumulation x replication and matches a hand-written torch
loop to 1e-5; anchors of the four return types (All, EveryN, Final, Sum) hold what the loop saw."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import popart

pytestmark = pytest.mark.usefixtures("one_thread")

BPS, ACCL, REPL, MB, STEPS, CLASSES = 4, 2, 2, 3, 2, 5
LR, MOMENTUM, DECAY, BN_MOMENTUM, EPS = 0.05, 0.9, 1e-3, 0.9, 1e-5


def _initial():
    rng = np.random.default_rng(7)
    f = lambda *s: (rng.standard_normal(s) * 0.3).astype(np.float32)  # noqa: E731
    return {"conv_w": f(4, 2, 3, 3), "conv_b": f(4), "bn_scale": 1 + f(4), "bn_bias": f(4),
            "gemm_w": f(CLASSES, 4 * 3 * 3), "gemm_b": f(CLASSES)}


def _build(initial):
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [MB, 2, 6, 6]), "x")
    labels = builder.addInputTensor(popart.TensorInfo("INT32", [MB]), "labels")
    w = {name: builder.addInitializedInputTensor(value, name) for name, value in initial.items()}
    mean = builder.addInitializedInputTensor(np.zeros(4, np.float32), "bn_mean")
    var = builder.addInitializedInputTensor(np.ones(4, np.float32), "bn_var")
    conv = builder.aiOnnx.conv([x, w["conv_w"], w["conv_b"]], pads=[1, 1, 1, 1], debugContext="conv")
    bn = builder.aiOnnx.batchnormalization([conv, w["bn_scale"], w["bn_bias"], mean, var], 5, EPS, BN_MOMENTUM)[0]
    pooled = builder.aiOnnx.maxpool([builder.aiOnnx.relu([bn])], 1, kernel_shape=[2, 2], strides=[2, 2])[0]
    logits = builder.aiOnnx.gemm([builder.aiOnnx.flatten([pooled]), w["gemm_w"], w["gemm_b"]], transB=1)
    probs = builder.aiOnnx.softmax([logits], axis=1, debugContext="probs")
    loss = builder.aiGraphcore.nllloss([probs, labels], reduction=popart.ReductionType.Mean)
    return builder, x, labels, conv, probs, loss


def _torch_forward(p, stats, x, y):
    conv = F.conv2d(x, p["conv_w"], p["conv_b"], padding=1)
    dims = (0, 2, 3)
    mean, var = conv.mean(dims), conv.var(dims, unbiased=False)
    with torch.no_grad():
        stats["mean"] = stats["mean"] * BN_MOMENTUM + mean * (1 - BN_MOMENTUM)
        stats["var"] = stats["var"] * BN_MOMENTUM + var * (1 - BN_MOMENTUM)
    bn = (conv - mean[None, :, None, None]) / torch.sqrt(var[None, :, None, None] + EPS)
    bn = bn * p["bn_scale"][None, :, None, None] + p["bn_bias"][None, :, None, None]
    pooled = F.max_pool2d(torch.relu(bn), 2)
    probs = torch.softmax(pooled.flatten(1) @ p["gemm_w"].T + p["gemm_b"], dim=1)
    return conv, probs, F.nll_loss(torch.log(probs), y.long())


def test_cnn_trains_like_a_hand_written_loop_with_all_anchor_types():
    initial = _initial()
    builder, x, labels, conv, probs, loss = _build(initial)
    grad_w = popart.reservedGradientPrefix() + "gemm_w"
    anchors = {loss: popart.AnchorReturnType("All"), probs: popart.AnchorReturnType("EveryN", 2),
               conv: popart.AnchorReturnType("Final"), grad_w: popart.AnchorReturnType("Sum")}
    opts = popart.SessionOptions()
    opts.enableGradientAccumulation, opts.accumulationFactor = True, ACCL
    opts.enableReplicatedGraphs, opts.replicatedGraphCount = True, REPL
    optimizer = popart.SGD({"defaultLearningRate": (LR, False), "defaultMomentum": (MOMENTUM, True),
                            "defaultWeightDecay": (DECAY, True)})
    session = popart.TrainingSession(builder.getModelProto(), popart.DataFlow(BPS, anchors), loss, optimizer,
                                     popart.DeviceManager().acquireAvailableDevice(REPL), userOptions=opts)
    session.prepareDevice()
    session.weightsFromHost()
    arrays = session.initAnchorArrays()
    assert arrays[loss].shape == (BPS, ACCL, REPL)
    assert arrays[probs].shape == (BPS // 2, ACCL, REPL, MB, CLASSES)
    assert arrays[conv].shape == (REPL, MB, 4, 6, 6)
    assert arrays[grad_w].shape == (REPL, CLASSES, 36)

    params = {k: torch.tensor(v, requires_grad=True) for k, v in initial.items()}
    torch_optimizer = torch.optim.SGD(params.values(), lr=LR, momentum=MOMENTUM, weight_decay=DECAY)
    stats = {"mean": torch.zeros(4), "var": torch.ones(4)}
    rng = np.random.default_rng(11)
    for step in range(STEPS):
        data = rng.standard_normal((BPS, ACCL, REPL, MB, 2, 6, 6)).astype(np.float32)
        target = rng.integers(0, CLASSES, (BPS, ACCL, REPL, MB)).astype(np.int32)
        session.run(popart.PyStepIO({x: data, labels: target}, arrays))
        losses = np.zeros((BPS, ACCL, REPL), np.float32)
        all_probs = np.zeros((BPS, ACCL, REPL, MB, CLASSES), np.float32)
        grad_sum = np.zeros((REPL, CLASSES, 36), np.float32)
        for d in range(BPS):
            torch_optimizer.zero_grad()
            for a in range(ACCL):
                for r in range(REPL):
                    out, p, micro_loss = _torch_forward(params, stats, torch.from_numpy(data[d, a, r]),
                                               torch.from_numpy(target[d, a, r]))
                    micro_loss.backward()  # PopART's default: gradients summed over accumulation and replicas
                    losses[d, a, r], all_probs[d, a, r] = micro_loss.item(), p.detach().numpy()
                    last_conv = out.detach().numpy()
                    grad_sum[r] += torch.autograd.grad(
                        _torch_forward(params, dict(stats), torch.from_numpy(data[d, a, r]),
                                       torch.from_numpy(target[d, a, r]))[2], params["gemm_w"])[0].numpy()
            torch_optimizer.step()
        np.testing.assert_allclose(arrays[loss], losses, rtol=1e-5, atol=1e-5, err_msg=f"step {step}")
        np.testing.assert_allclose(arrays[probs], all_probs[1::2], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(arrays[conv][-1], last_conv, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(arrays[grad_w], grad_sum, rtol=1e-5, atol=1e-5)
    session.weightsToHost()
    trained = {k: np.zeros_like(v) for k, v in initial.items()}
    session.readWeights(popart.PyWeightsIO(trained))
    for name, value in trained.items():
        np.testing.assert_allclose(value, params[name].detach().numpy(), rtol=1e-5, atol=1e-5, err_msg=name)
