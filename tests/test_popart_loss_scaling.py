"""SessionOptions.automaticLossScalingSettings: PopART's AutomaticLossScale errors, in its order, and a
session with automatic loss scaling that PopART accepts builds and trains (with the optimizer's loss
scaling, fixed)."""
import re

import numpy as np
import pytest

import popart

CONV_AND_MATMUL = popart.GradientTensorTrackingMethod.ConvAndMatmulGradients


def _model(dtype="FLOAT16", op="matmul"):
    builder = popart.Builder()
    np_type = np.float16 if dtype == "FLOAT16" else np.float32
    x = builder.addInputTensor(dtype, [2, 2])
    w = builder.addInitializedInputTensor(np.eye(2, dtype=np_type))
    out = builder.aiOnnx.matmul([x, w]) if op == "matmul" else builder.aiOnnx.relu([builder.aiOnnx.add([x, w])])
    return builder, x, builder.aiGraphcore.identityloss([out])


def _als(**settings):
    opts = popart.SessionOptions()
    opts.automaticLossScalingSettings.enabled = True
    for key, value in {"binEdgeLocation": 0.5, "thresholdUpperCountProportion": 0.2, **settings}.items():
        setattr(opts.automaticLossScalingSettings, key, value)
    return opts


def _training(builder, loss, opts, loss_scaling=(2, False), ipus=1):
    return popart.TrainingSession(builder.getModelProto(), loss=loss,
                                  optimizer=popart.SGD({"lossScaling": loss_scaling}),
                                  dataFlow=popart.DataFlow(1, [loss]), userOptions=opts,
                                  deviceInfo=popart.DeviceManager().createIpuModelDevice({"numIPUs": ipus}))


@pytest.mark.parametrize("case,message", [
    ("inference", "Only compatible when doing training"),
    ("const", "The optimizer must have non-const loss scaling"),
    ("float32", "No tracked gradient tensors of type fp16 were found."),
    ("no matmul", "No tracked gradient tensors of type fp16 were found."),
    ("bin edge", "Out of range value for 'binEdgeLocation'. The current value is 1.5"),
    ("threshold", "Out of range value for 'thresholdUpperCountProportion'. The current value is -0.1"),
    ("to track", "toTrackTensors has been set, but gradientTensorTrackingMethod has not been set"),
    ("pipelining", "'enablePipelining' SessionOption is set to 'true', but the 'enableGradientAccumulation'"),
])
def test_automatic_loss_scaling_errors(case, message):
    builder, x, loss = _model("FLOAT" if case == "float32" else "FLOAT16", "relu" if case == "no matmul" else "matmul")
    opts = _als(**{"bin edge": {"binEdgeLocation": 1.5}, "threshold": {"thresholdUpperCountProportion": -0.1},
                   "to track": {"toTrackTensors": [x]},
                   "no matmul": {"gradientTensorTrackingMethod": CONV_AND_MATMUL},
                   }.get(case, {}))
    with pytest.raises(popart.popart_exception, match=re.escape(message)):
        if case == "inference":
            popart.InferenceSession(builder.getModelProto(), dataFlow=popart.DataFlow(1, [loss]), userOptions=opts,
                                    deviceInfo=popart.DeviceManager().createCpuDevice())
        elif case == "pipelining":
            opts.enablePipelining = True
            _training(builder, loss, opts)
        else:
            _training(builder, loss, opts, loss_scaling=(2, case == "const"))


def test_automatic_loss_scaling_session_trains_with_the_loss_scaling_given():
    builder, x, loss = _model()
    session = _training(builder, loss, _als())
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    session.run(popart.PyStepIO({x: np.ones((2, 2), dtype=np.float16)}, anchors))
    assert anchors[loss] == 1.0  # identityloss: the mean by default
