"""The compiled backend runs block-annotated models (pipelined, sharded) whose virtual IPUs all
map onto one device as one program, with eager's results; PopTorch's plan checks still raise
first; plans the program cannot run decline with their reason."""
import copy

import pytest
import torch

import poptorch

from helpers.models import FourBlocks, loss_of
from helpers.oracle import train_loop

STEPS = 2


def options(strategy, ga, mode, backend):
    opts = poptorch.Options().deviceIterations(STEPS).outputMode(mode).openpopBackend(backend)
    opts.Training.gradientAccumulation(ga)
    opts.setExecutionStrategy(strategy)
    opts.showCompilationProgressBar(False)
    return opts


def train(model, opts, calls):
    pop = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    results = [pop(x, t) for x, t in calls]
    return pop, results


@pytest.mark.slow
@pytest.mark.parametrize("style,strategy,ga,mode", [
    # A pipelined plan of 4 stages needs GA >= 2 * 4 - 1 in training.
    ("begin_block", poptorch.PipelinedExecution(), 7, poptorch.OutputMode.Sum),
    ("block", poptorch.ShardedExecution(), 2, poptorch.OutputMode.Final),
])
def test_four_blocks_train_compiled_as_eager_and_oracle(style, strategy, ga, mode):
    torch.manual_seed(0)
    model = FourBlocks(style)
    eager_model = copy.deepcopy(model)
    reference = FourBlocks()
    reference.load_state_dict(model.state_dict())
    calls = [(torch.randn(STEPS * ga * 2, 8), torch.randn(STEPS * ga * 2, 8)) for _ in range(2)]

    pop, compiled = train(model, options(strategy, ga, mode, "compiled"), calls)
    assert pop._dispatch.compiled.last == "compiled"
    assert [b.ipu for b in pop.executionPlan().blocks] == [0, 1, 2, 3]
    _, eager = train(eager_model, options(strategy, ga, mode, "eager"), calls)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for (x, t), (out, losses), (eager_out, eager_losses) in zip(calls, compiled, eager):
        ref_losses = train_loop(reference, ref_opt, (x, t), loss_of, STEPS, ga, 1)
        expected = ref_losses.sum() if mode == poptorch.OutputMode.Sum else ref_losses[-1]
        torch.testing.assert_close(losses, expected, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(losses, eager_losses, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out, eager_out, rtol=1e-5, atol=1e-6)
    for p, q, e in zip(model.parameters(), reference.parameters(), eager_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(p, e, rtol=1e-5, atol=1e-6)


def test_pipeline_depth_check_raises_as_eager_before_the_backend():
    texts = []
    for backend in ("eager", "compiled"):
        model = FourBlocks("begin_block")
        state = copy.deepcopy(model.state_dict())
        opts = options(poptorch.PipelinedExecution(), 4, poptorch.OutputMode.All, backend)
        pop = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1))
        with pytest.raises(poptorch.Error, match="gradientAccumulation must be greater than or equal") as info:
            pop(torch.randn(STEPS * 4 * 2, 8), torch.randn(STEPS * 4 * 2, 8))
        texts.append(str(info.value))
        for key, value in model.state_dict().items():
            torch.testing.assert_close(value, state[key])
    assert texts[0] == texts[1]


def test_concurrent_stages_decline_with_their_reason(monkeypatch, warnings_logged):
    monkeypatch.setenv("OPENPOP_CONCURRENT_STAGES", "on")
    x, t = torch.randn(STEPS * 7 * 2, 8), torch.randn(STEPS * 7 * 2, 8)
    forced = poptorch.trainingModel(FourBlocks("begin_block"),
                                    options(poptorch.PipelinedExecution(), 7, poptorch.OutputMode.All, "compiled"))
    with pytest.raises(poptorch.Error, match="concurrent micro-batch threads \\(OPENPOP_CONCURRENT_STAGES=on\\)"):
        forced(x, t)

    auto = options(poptorch.PipelinedExecution(), 7, poptorch.OutputMode.All, "auto")
    auto.openpopBackend("auto", compile_after=0.0)
    pop = poptorch.trainingModel(FourBlocks("begin_block"), auto)
    pop(x, t)
    assert pop._dispatch.compiled.last == "eager"
    assert any("OPENPOP_CONCURRENT_STAGES=on" in m for m in warnings_logged())
