"""popart.Adaptive with PopART's equations: each mode, both weight-decay modes (PopART's default is
Decay), momentum and TensorFlow's RMSProp variant, checked step by step against a numpy transcription
of the equations in PopART's AdaptiveDecompose (issue 31)."""
import numpy as np
import pytest

import popart

LR, ALPHA, EPS, WD = 0.05, 0.9, 1e-3, 0.01


def _reference(w, grads, mode, decay, momentum, tf):
    a1 = np.full_like(w, 1.0 if tf else 0.0)
    a2 = np.zeros_like(w)
    a3 = np.zeros_like(w)
    for g in grads:
        if not decay:
            g = g + WD * w
        a1 = a1 + g * g if mode == popart.AdaptiveMode.AdaGrad else ALPHA * a1 + (1 - ALPHA) * g * g
        if mode == popart.AdaptiveMode.AdaDelta:
            u = np.sqrt(a2 + EPS) / np.sqrt(a1 + EPS) * g
            a2 = ALPHA * a2 + (1 - ALPHA) * u * u
        else:
            rms = a1
            if mode == popart.AdaptiveMode.CenteredRMSProp:
                a2 = ALPHA * a2 + (1 - ALPHA) * g
                rms = a1 - a2 * a2
            u = g / np.sqrt(rms + EPS) if tf else g / (np.sqrt(rms) + EPS)
        lr_in_updater = False
        if momentum:
            if tf:
                u, lr_in_updater = LR * u, True
            a3 = momentum * a3 + u
            u = a3
        if lr_in_updater:
            w = w * (1 - WD) - u if decay else w - u
        else:
            w = (1 - LR * WD) * w - LR * u if decay else w - LR * u
    return w


MODES = [popart.AdaptiveMode.AdaGrad, popart.AdaptiveMode.RMSProp, popart.AdaptiveMode.CenteredRMSProp,
         popart.AdaptiveMode.AdaDelta]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("decay", [True, False], ids=["decay", "l2"])
@pytest.mark.parametrize("momentum,tf", [(0.0, False), (0.8, False), (0.8, True)], ids=["plain", "mom", "tf"])
def test_adaptive_follows_popart_equations(mode, decay, momentum, tf):
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal([3, 4]).astype(np.float32)
    xs = rng.standard_normal([4, 3, 4]).astype(np.float32)
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [3, 4]))
    w = b.addInitializedInputTensor(w0)
    loss = b.aiGraphcore.identityloss([b.aiOnnx.mul([x, w])], reduction=popart.ReductionType.Sum)
    optimizer = popart.Adaptive({"defaultLearningRate": (LR, True), "defaultAlpha": (ALPHA, True),
                                 "defaultEps": (EPS, True), "defaultWeightDecay": (WD, True),
                                 "defaultMomentum": (momentum, True)}, mode=mode,
                                weight_decay_mode=popart.WeightDecayMode.Decay if decay
                                else popart.WeightDecayMode.L2Regularization, rmsprop_tf_variant=tf)
    session = popart.TrainingSession(fnModel=b.getModelProto(), dataFlow=popart.DataFlow(4, {}), loss=loss,
                                     optimizer=optimizer, deviceInfo=popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    session.weightsFromHost()
    session.run(popart.PyStepIO({x: xs}, session.initAnchorArrays()))
    session.weightsToHost()
    got = np.zeros_like(w0)
    session.readWeights(popart.PyWeightsIO({w: got}))
    np.testing.assert_allclose(got, _reference(w0, xs, mode, decay, momentum, tf), rtol=1e-5, atol=1e-6)


def test_adaptive_defaults_and_per_weight_values():
    assert popart.Adaptive({}).weight_decay_mode == popart.WeightDecayMode.Decay  # PopART's default
    opt = popart.Adaptive({"defaultLearningRate": (0.1, False)})
    opt.insertSpecific("w", {"alpha": (0.7, False), "momentum": (0.8, True)})
    assert opt.value("defaultAlpha", "w") == 0.7 and opt.value("defaultAlpha") == 0.99
