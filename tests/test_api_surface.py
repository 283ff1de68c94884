"""The poptorch facade, logging, the seed's PopTorch-only snippets, and state after errors."""
import copy
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import poptorch


def test_facade_exports_the_poptorch_api():
    for name in ("Options", "DataLoader", "AsynchronousDataAccessor", "trainingModel", "inferenceModel",
                 "PoplarExecutor", "BeginBlock", "Block", "BlockFunction", "identity_loss", "OutputMode",
                 "DataLoaderMode", "isRunningOnIpu", "ipuHardwareIsAvailable", "setLogLevel", "logger",
                 "for_loop", "cond", "ipu_print_tensor", "recomputationCheckpoint", "load",
                 "registerPreCompileHook", "ICustomArgParser", "Stage", "PipelinedExecution"):
        assert hasattr(poptorch, name), name
    assert issubclass(poptorch.Error, Exception) and not issubclass(poptorch.Error, RuntimeError)
    assert poptorch.poptorch_core.Error is poptorch.Error
    assert issubclass(poptorch.RecoverableError, poptorch.Error)
    assert poptorch.__version__.startswith("3.4.0")
    assert issubclass(poptorch.optim.SGD, torch.optim.SGD)
    assert poptorch.enums.OutputMode.All == 2


def test_anchor_mode_is_a_deprecated_alias():
    with pytest.warns(DeprecationWarning):
        mode = poptorch.AnchorMode
    assert mode is poptorch.OutputMode


def test_set_log_level_and_errors():
    poptorch.setLogLevel("DEBUG")
    assert poptorch.logger.isEnabledFor(10)
    poptorch.setLogLevel(3)  # WARN
    assert not poptorch.logger.isEnabledFor(20)
    with pytest.raises(ValueError, match="Invalid log level integer"):
        poptorch.setLogLevel(9)
    with pytest.raises(ValueError, match="Unknown log level: LOUD. Valid values are DEBUG, ERR, INFO, OFF, TRACE "
                                         "and WARN"):
        poptorch.setLogLevel("LOUD")
    poptorch.setLogLevel("WARN")


@pytest.mark.slow
def test_log_level_from_environment_and_format():
    code = ("import poptorch; poptorch.logger.debug('hello from debug')")
    env = dict(os.environ, POPTORCH_LOG_LEVEL="DEBUG")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "[poptorch::python] [debug] hello from debug" in result.stderr


def test_seed_snippet_options_for_lightning_guide():
    """The PopTorch part of the Lightning IPU guide's 'Advanced IPU options' snippet."""
    inference_opts = poptorch.Options()
    inference_opts.deviceIterations(32)
    training_opts = poptorch.Options()
    with pytest.warns(DeprecationWarning):
        training_opts.anchorMode(poptorch.OutputMode.All)
    training_opts.deviceIterations(32)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 2)

        def forward(self, x, y):
            out = self.fc(x)
            return out, F.cross_entropy(out, y)

    model = Model()
    training = poptorch.trainingModel(model, training_opts)
    _, losses = training(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    assert losses.shape == (32,)  # AnchorMode.All: every device iteration's loss
    inference = poptorch.inferenceModel(model, inference_opts)
    out, _ = inference(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    assert out.shape == (64, 2)


def test_failed_calls_leave_weights_and_optimizer_state_intact():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 3)

        def forward(self, x):
            out = self.fc(x)
            return out, F.mse_loss(out, x)

    model = Model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    opts = poptorch.Options().deviceIterations(2)
    training = poptorch.trainingModel(model, opts, optimizer)
    training(torch.randn(4, 3))
    weights = copy.deepcopy(model.state_dict())
    state = copy.deepcopy(optimizer.state_dict())
    for bad_call in (lambda: training(torch.randn(5, 3)),            # batch not divisible / shape mismatch
                     lambda: training(torch.randn(4, 3).double()),   # dtype mismatch
                     lambda: training(torch.randn(4, 3), torch.randn(4, 3))):  # too many arguments
        with pytest.raises((poptorch.Error, AssertionError)):
            bad_call()
        for k, v in model.state_dict().items():
            assert torch.equal(v, weights[k])
        after = optimizer.state_dict()
        for pid, values in state["state"].items():
            for key, value in values.items():
                assert torch.equal(torch.as_tensor(after["state"][pid][key]), torch.as_tensor(value))
    with pytest.raises(AttributeError, match="Can't modify frozen Options"):
        opts.deviceIterations(4)
    assert training.options.device_iterations == 2
