"""PopART's rules around sessions and patterns, as its users meet them (issue 31 items 1-3): Patterns
with PopART's names, levels and errors; every ``reserved*Prefix``; training a graph whose weights are
all constants; weights must come from the host before a training run; modelToHost needs a prepared
device."""
import numpy as np
import pytest

import popart


def test_patterns_levels_properties_and_errors():
    default = popart.Patterns()
    assert default.PreUniRepl and default.InPlace and default.SoftMaxGradDirect
    assert not default.isPatternEnabled("TiedGather")  # off by default in PopART
    none = popart.Patterns(popart.PatternsLevel.NoPatterns)
    assert not none.PreUniRepl and not none.InPlace and not none.isPatternEnabled("MatMulOp")
    minimal = popart.Patterns(popart.PatternsLevel.Minimal)
    assert minimal.isPatternEnabled("MatMulOp") and not minimal.isPatternEnabled("PreUniRepl")
    assert popart.Patterns(popart.PatternsLevel.All).isPatternEnabled("TiedGather")
    listed = popart.Patterns(["PostNRepl", "InPlace"])
    assert listed.PostNRepl and listed.InPlace and not listed.SoftMaxGradDirect
    default.PreUniRepl = False
    assert not default.PreUniRepl and default.PostNRepl
    assert default.enableRuntimeAsserts(False) is default
    with pytest.raises(popart.popart_exception, match="^Unknown pattern Inplace, did you mean InPlace\\?$"):
        popart.Patterns(["Inplace"])
    with pytest.raises(popart.popart_exception, match="^Pattern 'MatMulOp' is mandatory and cannot be disabled$"):
        popart.Patterns().enablePattern("MatMulOp", False)


def _identity_loss_model(constant=True):
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 2]))
    if constant:
        c = b.aiOnnx.constant(np.array([[1, 2], [3, 4]], np.float32))
    else:
        c = b.addInitializedInputTensor(np.array([[1, 2], [3, 4]], np.float32))
    out = b.aiOnnx.add([x, c])
    loss = b.aiGraphcore.identityloss([out])
    return b.getModelProto(), x, out, loss


def _training(proto, out, loss, patterns=None):
    return popart.TrainingSession(fnModel=proto, dataFlow=popart.DataFlow(1, {out: popart.AnchorReturnType("All")}),
                                  loss=loss, optimizer=popart.ConstSGD(0.01), patterns=patterns,
                                  deviceInfo=popart.DeviceManager().createCpuDevice())


def test_a_session_refuses_mandatory_patterns_off_unless_asserts_are_off():
    proto, _x, out, loss = _identity_loss_model()
    with pytest.raises(popart.popart_exception, match="^Pattern '.*' must be enabled$"):
        _training(proto, out, loss, popart.Patterns(popart.PatternsLevel.NoPatterns))
    _training(proto, out, loss, popart.Patterns(popart.PatternsLevel.NoPatterns).enableRuntimeAsserts(False))


def test_reserved_prefixes_are_popart_s():
    assert popart.reservedGradientPrefix() == "Gradient___"
    assert popart.reservedAccl1Prefix() == "Accl1___"
    assert popart.reservedStepPrefix() == "Step___"
    assert popart.reservedDefaultLearningRatePrefix() == "learningRate___default___"


def test_training_a_graph_without_trainable_weights(tmp_path):
    proto, x, out, loss = _identity_loss_model(constant=True)
    session = _training(proto, out, loss)
    anchors = session.initAnchorArrays()
    with pytest.raises(popart.popart_exception,
                       match="^Devicex::prepare\\(\\) must be called before Devicex::weightsToHost"):
        session.modelToHost(str(tmp_path / "early.onnx"))
    session.prepareDevice()
    session.run(popart.PyStepIO({x: np.full([2, 2], 6, np.float32)}, anchors))
    np.testing.assert_array_equal(anchors[out], [[7, 8], [9, 10]])
    session.modelToHost(str(tmp_path / "model.onnx"))
    assert (tmp_path / "model.onnx").read_bytes() == proto


def test_training_runs_only_after_weights_from_host():
    proto, x, out, loss = _identity_loss_model(constant=False)
    session = _training(proto, out, loss)
    session.prepareDevice()
    stepio = popart.PyStepIO({x: np.zeros([2, 2], np.float32)}, session.initAnchorArrays())
    with pytest.raises(popart.popart_exception, match="^Must call weightsFromHost before run as the model has "
                                                      "initializers and the session has been created in training"):
        session.run(stepio)
    session.weightsFromHost()
    session.run(stepio)


def test_variable_settings_arithmetic():
    """PopART's user guide (replication_popart.py): groups, representatives and read-back counts."""
    grouped = popart.VariableSettings(popart.CommGroup(popart.CommGroupType.Consecutive, 2),
                                      popart.VariableRetrievalMode.OnePerGroup)
    every = popart.VariableSettings(popart.CommGroup(popart.CommGroupType.Consecutive, 2),
                                    popart.VariableRetrievalMode.AllReplicas)
    assert grouped.getGroupCount(4) == 2 and grouped.getRealGroupSize(4) == 2
    assert grouped.numReplicasReturningVariable(4) == 2 and every.numReplicasReturningVariable(4) == 4
    assert grouped.groups(4) == [[0, 1], [2, 3]]
    orthogonal = popart.VariableSettings(popart.CommGroup(popart.CommGroupType.Orthogonal, 2))
    assert orthogonal.groups(4) == [[0, 2], [1, 3]] and orthogonal.getStride(4) == 2
    assert grouped.shapeOnReplica([2, 3, 5], 4) == [3, 5] and grouped.shapeOnHost([3, 5], 4) == [2, 3, 5]
    assert popart.VariableSettings().getGroupCount(8) == 1
    strided = popart.VariableSettings(2, 2)
    assert strided.getGroupCount(8) == 4 and strided.groups(8) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    b = popart.Builder()
    assert b.addInitializedInputTensor(np.zeros([2, 3, 5], np.float32), grouped)


def test_sessions_refuse_what_popart_refuses():
    b = popart.Builder()
    x = b.addInputTensor(popart.TensorInfo("FLOAT", [2, 3]))
    out = b.aiOnnx.relu([x])
    b.addOutputTensor(out)
    device = popart.DeviceManager().createCpuDevice()
    with pytest.raises(popart.popart_exception, match="^User must specify an anchor tensor when doing inference.$"):
        popart.InferenceSession(fnModel=b.getModelProto(), dataFlow=popart.DataFlow(1, {}), deviceInfo=device)
    with pytest.raises(popart.popart_exception, match="^Failed to load a ModelProto from the string 'nothing'"):
        popart.InferenceSession(fnModel="nothing", dataFlow=popart.DataFlow(1, {}), deviceInfo=device)
    w = b.addInitializedInputTensor(np.ones([2, 3], np.float32))
    vector_loss = b.aiGraphcore.identityloss([b.aiOnnx.mul([out, w])], reduction=popart.ReductionType.NoReduction)
    with pytest.raises(popart.popart_exception, match=f"^Loss tensor, '{vector_loss}', must be a scalar tensor$"):
        _training(b.getModelProto(), vector_loss, vector_loss)
    probs = b.aiOnnx.softmax([b.addInputTensor(popart.TensorInfo("FLOAT", [2, 4, 3]))], axis=2)
    labels = b.addInputTensor(popart.TensorInfo("INT32", [2, 5]))
    nll = b.aiGraphcore.nllloss([probs, labels])
    with pytest.raises(popart.popart_exception, match=r"^The label tensor \(INT32   \[2 5\]\) must have shape \[2 4\] "
                                                      r"to match all but the final dimension of the probabilities "
                                                      r"tensor \(FLOAT   \[2 4 3\]\)$"):
        _training(b.getModelProto(), nll, nll)
