"""PopART's gradient clipping (``ClipNormSettings``) against a hand-written torch step: a subset of the
weights, several groups each with its own norm, all weights with LAMB, and PopART's errors for an
ill-formed set of groups."""
import numpy as np
import pytest
import torch

import popart

RNG = np.random.default_rng(7)
DATA = RNG.standard_normal((4, 3)).astype(np.float32)
WEIGHTS = [RNG.standard_normal(s).astype(np.float32) for s in [(3, 3), (3, 3), (3, 2)]]


def _popart_step(optimizer_of, groups):
    """One training step of x @ w0 @ w1 @ w2 with an L1 loss; ``groups``: [([weight index], max norm)]
    (None: clipAllWeights)."""
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", list(DATA.shape)))
    ids = [builder.addInitializedInputTensor(w, f"w{i}") for i, w in enumerate(WEIGHTS)]
    out = x
    for w in ids:
        out = builder.aiOnnx.matmul([out, w])
    loss = builder.aiGraphcore.l1loss([out], 1.0)
    settings = [popart.ClipNormSettings.clipAllWeights(norm) if idx is None
                else popart.ClipNormSettings.clipWeights([ids[i] for i in idx], norm) for idx, norm in groups]
    session = popart.TrainingSession(fnModel=builder.getModelProto(),
                                     dataFlow=popart.DataFlow(1, {loss: popart.AnchorReturnType("All")}),
                                     loss=loss, optimizer=optimizer_of(settings),
                                     deviceInfo=popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    session.weightsFromHost()
    session.run(popart.PyStepIO({x: DATA}, session.initAnchorArrays()))
    session.weightsToHost()
    result = {w: np.zeros_like(v) for w, v in zip(ids, WEIGHTS)}
    session.readWeights(popart.PyWeightsIO(result))
    return [result[w] for w in ids]


def _torch_grads(groups):
    """The L1 loss's gradients of the three weights, each group clipped as PopART does:
    g * maxNorm / max(maxNorm, ||g of the group||)."""
    ws = [torch.tensor(w, requires_grad=True) for w in WEIGHTS]
    out = torch.tensor(DATA)
    for w in ws:
        out = out @ w
    out.abs().mean().backward()  # l1loss: mean reduction by default
    grads = [w.grad.clone() for w in ws]
    for idx, norm in groups:
        idx = range(len(ws)) if idx is None else idx
        total = torch.sqrt(sum((grads[i] ** 2).sum() for i in idx))
        factor = norm / max(norm, float(total))
        for i in idx:
            grads[i] = grads[i] * factor
    return grads


def _sgd(settings):
    return popart.SGD({"defaultLearningRate": (0.1, True)}, settings)


@pytest.mark.parametrize("groups", [[([0, 2], 0.5)], [([0], 0.3), ([1, 2], 0.7)], [(None, 0.4)]])
def test_sgd_clips_each_group_by_its_own_norm(groups):
    got = _popart_step(_sgd, groups)
    expected = [w - 0.1 * g.numpy() for w, g in zip(WEIGHTS, _torch_grads(groups))]
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
    unclipped = [w - 0.1 * g.numpy() for w, g in zip(WEIGHTS, _torch_grads([]))]
    if groups == [([0, 2], 0.5)]:  # the weight outside every group is not clipped
        np.testing.assert_allclose(got[1], unclipped[1], rtol=1e-5, atol=1e-6)
        assert not np.allclose(got[0], unclipped[0])


def _lamb_reference(grads, lr, wd, eps, bias_correction):
    b1, b2 = 0.9, 0.999
    out = []
    for w, g in zip(WEIGHTS, grads):
        w = torch.tensor(w, dtype=torch.float64)
        g = g.double()
        m, v = (1 - b1) * g, (1 - b2) * g * g
        if bias_correction:
            m, v = m / (1 - b1), v / (1 - b2)
        u = m / (v.sqrt() + eps) + wd * w
        r1, r2 = w.norm(), u.norm()
        ratio = r1 / r2 if r1 > 0 and r2 > 0 else 1.0
        out.append((w - lr * ratio * u).float().numpy())
    return out


@pytest.mark.parametrize("mode", [popart.AdamMode.Lamb, popart.AdamMode.LambNoBias])
@pytest.mark.parametrize("groups", [[(None, 0.2)], [([1, 2], 0.3)]])
def test_lamb_with_clipping(mode, groups):
    def lamb(settings):
        return popart.Adam({"defaultLearningRate": (0.01, False), "defaultWeightDecay": (0.1, False),
                            "defaultEps": (1e-6, False), "lossScaling": (10, False)},
                           mode=mode, weight_decay_mode=popart.WeightDecayMode.Decay, clip_norm_settings=settings)
    got = _popart_step(lamb, groups)
    expected = _lamb_reference(_torch_grads(groups), 0.01, 0.1, 1e-6, mode == popart.AdamMode.Lamb)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-6)


def test_adam_clips_a_subset():
    def adam(settings):
        return popart.Adam({"defaultLearningRate": (0.1, False)}, weight_decay_mode=popart.WeightDecayMode.Decay,
                           clip_norm_settings=settings)
    groups = [([0, 1], 0.25)]
    got = _popart_step(adam, groups)
    ws = [torch.nn.Parameter(torch.tensor(w)) for w in WEIGHTS]
    for w, g in zip(ws, _torch_grads(groups)):
        w.grad = g
    torch.optim.AdamW(ws, lr=0.1, eps=1e-6, weight_decay=0.0).step()
    for g, e in zip(got, ws):
        np.testing.assert_allclose(g, e.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_clip_all_weights_must_be_the_only_group():
    with pytest.raises(popart.popart_exception, match="only one group should be specified"):
        _popart_step(_sgd, [(None, 0.5), ([0], 0.5)])


def test_clipping_an_unknown_weight_is_an_error():
    def sgd(settings):
        return popart.SGD({"defaultLearningRate": (0.1, True)},
                          [popart.ClipNormSettings.clipWeights(["nope"], 1.0)])
    with pytest.raises(popart.popart_exception, match="No Ir::Tensor with TensorId 'nope'"):
        _popart_step(sgd, [])
