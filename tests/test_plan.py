"""The plan builder, directly: recorded blocks + execution strategy + options -> each block's
stage and IPU, the forward pipeline stages, IPUs per replica, whether the run is pipelined; and
PopTorch's rules (with their texts) for what cannot run."""
import pytest
import torch

import poptorch
from openpop import errors
from openpop.runtime.plan import BlockRecorder, build_plan
from openpop.runtime.settings import RunSettings


class Layers(torch.nn.Module):
    """Named modules for the recorded blocks to run; ``e`` has a submodule."""

    def __init__(self):
        super().__init__()
        for name in "abcd":
            setattr(self, name, torch.nn.Identity())
        self.e = torch.nn.Sequential(torch.nn.Identity())


def recorded(*segments):
    """A BlockRecorder that saw ``segments`` in order: ``(user_id, ipu_id, "module names")``,
    user_id None for ops before the first block."""
    model = Layers()
    recorder = BlockRecorder(model)
    x = torch.zeros(1)
    for user_id, ipu_id, names in segments:
        if user_id is not None:
            recorder.begin_block(user_id, ipu_id)
        for name in names.split():
            getattr(model, name)(x)
    recorder.close()
    return recorder


def plan_for(segments, strategy=None, *, training=False, ga=1, di=1, replicas=1, auto_round=False):
    options = poptorch.Options().deviceIterations(di).replicationFactor(replicas).autoRoundNumIPUs(auto_round)
    options.Training.gradientAccumulation(ga)
    if strategy is not None:  # Options() starts with PipelinedExecution(AutoStage.SameAsIpu)
        options.setExecutionStrategy(strategy)
    return build_plan(recorded(*segments), RunSettings.from_options(options, training))


XYZ = [("x", 0, "a"), ("y", 1, "b c"), ("z", 1, "d")]
Stage, Phase = poptorch.Stage, poptorch.Phase
AUTO_INCREMENT = poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement)

# id: (segments, strategy, settings, blocks as (name, stage, ipu), forward stages, IPUs per replica, pipelined)
PLANS = {
    "no_blocks": ([(None, None, "a b")], None, {}, [("a, b", 0, 0)], 1, 1, False),
    "same_as_ipu": (XYZ, None, {"di": 2}, [("x", 0, 0), ("y", 1, 1), ("z", 1, 1)], 2, 2, True),
    "ops_before_first_block_on_ipu_0": ([(None, None, "a"), ("x", 1, "b")], None, {"di": 2},
                                        [("a", 0, 0), ("x", 1, 1)], 2, 2, True),
    "unused_ipus_count": ([("x", 0, "a"), ("y", 3, "b")], None, {"di": 2}, [("x", 0, 0), ("y", 3, 3)], 2, 4, True),
    "same_ipu_is_one_stage": ([("x", 0, "a"), ("y", 0, "b")], None, {}, [("x", 0, 0), ("y", 0, 0)], 1, 1, False),
    "back_to_an_ipu_is_a_new_stage": ([("x", 0, "a"), ("y", 1, "b"), ("z", 0, "c")], None, {"di": 3},
                                      [("x", 0, 0), ("y", 1, 1), ("z", 0, 0)], 3, 2, True),
    "auto_increment": ([("x", None, "a"), ("y", None, "b")], AUTO_INCREMENT, {"di": 2},
                       [("x", 0, 0), ("y", 1, 1)], 2, 2, True),
    "auto_increment_keeps_ipu_ids": ([("x", 1, "a"), ("y", 0, "b")], AUTO_INCREMENT, {"di": 2},
                                     [("x", 0, 1), ("y", 1, 0)], 2, 2, True),
    "explicit_stages_and_stage_ipu": (XYZ, poptorch.PipelinedExecution(Stage("x", "y"), Stage("z").ipu(0)), {"di": 3},
                                      [("x", 0, 0), ("y", 0, 1), ("z", 1, 0)], 3, 2, True),
    "sharded_is_not_pipelined": (XYZ, poptorch.ShardedExecution(), {"training": True},
                                 [("x", 0, 0), ("y", 1, 1), ("z", 1, 1)], 2, 2, False),
    "serial_phased": ([("x", 0, "a"), ("y", 1, "b")], poptorch.SerialPhasedExecution(Phase("x"), Phase("y")),
                      {"training": True}, [("x", 0, 0), ("y", 1, 1)], 2, 2, False),
    "parallel_phased": ([("x", 0, "a"), ("y", 1, "b")], poptorch.ParallelPhasedExecution(Phase("x"), Phase("y")),
                        {"training": True}, [("x", 0, 0), ("y", 1, 1)], 2, 2, False),
    "pipelined_training_with_enough_accumulation": (XYZ, None, {"training": True, "ga": 3},
                                                    [("x", 0, 0), ("y", 1, 1), ("z", 1, 1)], 2, 2, True),
    "numbered_block_named_by_its_modules": ([("0", 0, "e"), ("1", 1, "a")], None, {"di": 2},
                                            [("e", 0, 0), ("a", 1, 1)], 2, 2, True),
    "replicated": (XYZ, None, {"replicas": 2, "di": 2}, [("x", 0, 0), ("y", 1, 1), ("z", 1, 1)], 2, 2, True),
    "three_ipus_rounded": ([("x", 0, "a"), ("y", 1, "b"), ("z", 2, "c")], None, {"di": 3, "auto_round": True},
                           [("x", 0, 0), ("y", 1, 1), ("z", 2, 2)], 3, 3, True),
}


@pytest.mark.parametrize("name", PLANS)
def test_plan(name):
    segments, strategy, settings, blocks, stages, ipus, pipelined = PLANS[name]
    plan = plan_for(segments, strategy, **settings)
    assert [(b.name, b.stage, b.ipu) for b in plan.blocks] == blocks
    assert (plan.pipeline_stages, plan.ipus_per_replica, plan.pipelined) == (stages, ipus, pipelined)


def test_blocks_keep_the_modules_that_ran_in_them():
    plan = plan_for([(None, None, "a"), ("x", 0, "b e"), ("y", 1, "c"), ("x", 0, "d")], di=2)
    assert {b.user_id: b.modules for b in plan.blocks} == {
        "__before_first_block__": ["a"], "x": ["b", "e", "e.0", "d"], "y": ["c"]}


GA_RULE = ("poptorch.Options().Training.gradientAccumulation must be greater than or equal to the number of "
           "pipeline stages ({stages}) when using poptorch.PipelinedExecution. Please note that a model with "
           "{fwd} pipeline stages in PopTorch will have an additional {extra} stages when training.")

# id: (segments, strategy, settings, exception type, message)
REFUSED = {
    "same_as_ipu_without_ipu": ([("x", None, "a")], None, {}, poptorch.Error,
                                "poptorch.AutoStage.SameAsIpu was selected but no IPU was specified for block x"),
    "block_missing_from_explicit_stages": (XYZ, poptorch.PipelinedExecution(Stage("x", "y")), {}, AssertionError,
                                           "Unknown Block 'z' list of expected Blocks: ['x', 'y']"),
    "parallel_phase_on_wrong_parity": ([("x", 0, "a"), ("y", 0, "b")],
                                       poptorch.ParallelPhasedExecution(Phase("x"), Phase("y")), {}, poptorch.Error,
                                       "When phases are executed in parallel: even phases must run on even IPUs"),
    "pipelined_training_short_of_accumulation": (XYZ, None, {"training": True, "ga": 2}, poptorch.Error,
                                                 GA_RULE.format(stages=3, fwd=2, extra=1)),
    "four_stages_training": ([("w", 0, "a"), ("x", 1, "b"), ("y", 2, "c"), ("z", 3, "d")], None,
                             {"training": True, "ga": 6}, poptorch.Error, GA_RULE.format(stages=7, fwd=4, extra=3)),
    "pipelined_inference_short_of_iterations": (XYZ, None, {"di": 1}, poptorch.Error,
                                                "poptorch.Options().deviceIterations must be greater than or equal "
                                                "to the number of pipeline stages (2) when using "
                                                "PopTorch.PipelinedExecution."),
    "ipus_not_a_power_of_two": ([("x", 0, "a"), ("y", 1, "b"), ("z", 2, "c")], None, {"di": 3}, poptorch.Error,
                                "The model specifies the use of 3 IPUs, however PopTorch must reserve a minimum "
                                "of 4 in order to allow the model to run"),
    "replicas_times_ipus_over_64": (XYZ, None, {"replicas": 33, "di": 2}, poptorch.Error,
                                    "Too many IPUs requested (66). Experiments that need more than 64 IPUs require "
                                    "distributed execution."),
}


@pytest.mark.parametrize("name", REFUSED)
def test_plan_refused(name):
    segments, strategy, settings, kind, message = REFUSED[name]
    with pytest.raises(kind) as info:
        plan_for(segments, strategy, **settings)
    assert message in str(info.value)


def test_ops_outside_every_block_after_one_ended_are_refused():
    model = Layers()
    recorder = BlockRecorder(model)
    x = torch.zeros(1)
    with recorder.checking_ops():
        x = x + 1  # before the first block: stage 0
        recorder.begin_block("x", 0)
        model.a(x * 2)
        recorder.end_block()
        model.b(x)  # an Identity computes nothing: no op outside the blocks yet
        with pytest.raises(poptorch.Error, match=errors.NO_ACTIVE_BLOCK):
            x * 2
        x.detach()  # aliases compute nothing
    recorder.close()


def test_a_module_entered_between_blocks_joins_the_next_block():
    model = Layers()
    recorder = BlockRecorder(model)
    recorder.begin_block("x", 0)
    model.a(torch.zeros(1))
    recorder.end_block()
    model.b(torch.zeros(1))  # (a container whose own first block starts inside it)
    recorder.begin_block("y", 1)
    model.c(torch.zeros(1))
    recorder.close()
    assert [(b.user_id, b.modules) for b in recorder.used_blocks()] == [("x", ["a"]), ("y", ["b", "c"])]
