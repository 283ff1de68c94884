"""ONNX recurrent ops as PopART runs them: LSTM with the activations PopART takes (and its errors),
sequence_lens as ONNX defines them, GRU without a bias - against a numpy reference."""
import numpy as np
import pytest

import popart

RNG = np.random.default_rng(3)
SEQ, BATCH, INPUT, HIDDEN = 4, 3, 5, 2
ACTS = {"Sigmoid": lambda t: 1 / (1 + np.exp(-t)), "Tanh": np.tanh, "Relu": lambda t: np.maximum(t, 0)}


def _lstm_reference(x, w, r, b, f, g, lens=None):
    h = np.zeros((BATCH, HIDDEN), np.float32)
    c = np.zeros((BATCH, HIDDEN), np.float32)
    ys = np.zeros((SEQ, 1, BATCH, HIDDEN), np.float32)
    for t in range(SEQ):
        gates = x[t] @ w[0].T + h @ r[0].T + b[0][:4 * HIDDEN] + b[0][4 * HIDDEN:]
        i, o, fg, cand = np.split(gates, 4, axis=-1)
        c_new = ACTS[f](fg) * c + ACTS[f](i) * ACTS[g](cand)
        h_new = ACTS[f](o) * ACTS[g](c_new)
        live = np.ones((BATCH, 1), bool) if lens is None else (t < lens)[:, None]
        c, h = np.where(live, c_new, c), np.where(live, h_new, h)
        ys[t, 0] = np.where(live, h_new, 0)
    return ys, h[None], c[None]


def _run_lstm(activations, lens=None):
    x = RNG.standard_normal((SEQ, BATCH, INPUT)).astype(np.float32)
    w = RNG.standard_normal((1, 4 * HIDDEN, INPUT)).astype(np.float32) / 2
    r = RNG.standard_normal((1, 4 * HIDDEN, HIDDEN)).astype(np.float32) / 2
    b = RNG.standard_normal((1, 8 * HIDDEN)).astype(np.float32) / 2
    builder = popart.Builder()
    ids = [builder.addInputTensor(popart.TensorInfo(a)) for a in (x, w, r, b)]
    feeds = dict(zip(ids, (x, w, r, b)))
    if lens is not None:
        ids.append(builder.addInputTensor(popart.TensorInfo(lens)))
        feeds[ids[-1]] = lens
    kwargs = {"activations": activations} if activations else {}
    outs = builder.aiOnnx.lstm(ids, 3, **kwargs)
    session = popart.InferenceSession(builder.getModelProto(), popart.DataFlow(1, outs),
                                      popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO(feeds, anchors))
    return [anchors[o] for o in outs], (x, w, r, b)


@pytest.mark.parametrize("activations", [None, ["Relu", "Tanh", "Tanh"], ["Sigmoid", "Relu", "Relu"],
                                         ["Tanh", "Sigmoid", "Sigmoid"]])
def test_lstm_activations(activations):
    got, (x, w, r, b) = _run_lstm(activations)
    f, g = (activations or ["Sigmoid", "Tanh"])[:2]
    for mine, expected in zip(got, _lstm_reference(x, w, r, b, f, g)):
        np.testing.assert_allclose(mine, expected, rtol=1e-5, atol=1e-6)


def test_lstm_sequence_lens_hold_the_state_and_zero_the_outputs():
    lens = np.array([4, 2, 1], np.int32)
    got, (x, w, r, b) = _run_lstm(None, lens)
    for mine, expected in zip(got, _lstm_reference(x, w, r, b, "Sigmoid", "Tanh", lens)):
        np.testing.assert_allclose(mine, expected, rtol=1e-5, atol=1e-6)
    assert not got[0][2:, 0, 1].any() and not got[0][1:, 0, 2].any()


@pytest.mark.parametrize("activations,message", [
    (["Affine", "Tanh", "Tanh"], "Activation type 'Affine' is not supported"),
    (["Sigmoid", "Tanh", "Relu"], "LSTM activations must be the same for output and forget gates."),
])
def test_lstm_activation_errors(activations, message):
    with pytest.raises(popart.popart_exception, match=message):
        _run_lstm(activations)


def test_gru_without_bias_has_shapes():
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [SEQ, BATCH, INPUT]))
    w = builder.addInputTensor(popart.TensorInfo("FLOAT", [1, 3 * HIDDEN, INPUT]))
    r = builder.addInputTensor(popart.TensorInfo("FLOAT", [1, 3 * HIDDEN, HIDDEN]))
    y, y_h = builder.aiOnnx.gru([x, w, r], 2)
    assert builder.getTensorShape(y) == [SEQ, 1, BATCH, HIDDEN] and builder.getTensorShape(y_h) == [1, BATCH, HIDDEN]
