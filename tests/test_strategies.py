"""Stage, Phase and the execution strategies: arguments, validation texts, backend options."""
import re

import pytest

from openpop.enums import AutoStage, Liveness
from openpop.errors import Error
from openpop.strategies import (
    ParallelPhasedExecution,
    Phase,
    PipelinedExecution,
    SerialPhasedExecution,
    ShardedExecution,
    Stage,
    _IExecutionStrategy,
)


# --- Stage ------------------------------------------------------------------------
def test_stage_holds_blocks_and_no_ipu_by_default():
    stage = Stage("A", "B")
    assert stage.blocks == ["A", "B"]
    assert isinstance(stage.blocks, list)
    assert stage._ipu is None


def test_stage_ipu_sets_and_returns_the_stage():
    stage = Stage("A")
    assert stage.ipu(3) is stage
    assert stage._ipu == 3


def test_stage_ipu_must_be_int():
    with pytest.raises(AssertionError):
        Stage("A").ipu("1")


def test_stage_block_ids_must_be_strings():
    with pytest.raises(AssertionError, match=re.escape("Block IDs are supposed to be strings but got ('A', 1)")):
        Stage("A", 1)


# --- Phase ------------------------------------------------------------------------
def test_phase_of_strings_is_one_stage():
    phase = Phase("A", "B")
    assert len(phase.stages) == 1
    assert phase.stage(0).blocks == ["A", "B"]


def test_phase_of_stages_keeps_them():
    a, b = Stage("A"), Stage("B")
    phase = Phase(a, b)
    assert phase.stage(0) is a and phase.stage(1) is b


def test_phase_rejects_mixed_arguments():
    with pytest.raises(AssertionError, match="All arguments must either be block ids \\(strings\\) or Stages"):
        Phase(Stage("A"), "B")


def test_phase_ipus_assigns_one_ipu_per_stage():
    phase = Phase(Stage("A"), Stage("B"))
    phase.ipus(0, 2)
    assert [s._ipu for s in phase.stages] == [0, 2]


def test_phase_ipus_count_must_match():
    with pytest.raises(AssertionError, match="Phase contains 2 stages but you provided 1 ipus"):
        Phase(Stage("A"), Stage("B")).ipus(0)


# --- Pipelined / Sharded -------------------------------------------------------------
def test_pipelined_default_is_same_as_ipu():
    strategy = PipelinedExecution()
    assert strategy.auto_stage == AutoStage.SameAsIpu
    assert strategy.stages == []
    assert strategy.stage_of("anything") is None
    strategy.assert_known_block("anything")  # auto-staged: every block is welcome


def test_pipelined_auto_increment():
    assert PipelinedExecution(AutoStage.AutoIncrement).auto_stage == AutoStage.AutoIncrement


def test_pipelined_explicit_stages_from_strings_lists_and_stages():
    b = Stage("B1", "B2").ipu(1)
    strategy = PipelinedExecution("A", b, ["C1", "C2"])
    assert strategy.auto_stage is None
    assert [s.blocks for s in strategy.stages] == [["A"], ["B1", "B2"], ["C1", "C2"]]
    assert strategy.stage_of("B2") == (1, b)
    assert strategy.stage_of("C1")[0] == 2
    assert strategy.stage("B1") is b
    assert strategy.stage_of("Z") is None


def test_block_in_two_stages_is_rejected():
    with pytest.raises(AssertionError, match="^A associated with more than one stage$"):
        PipelinedExecution("A", Stage("B", "A"))


def test_block_in_two_stages_leaves_stages_untouched():
    a = Stage("A")
    with pytest.raises(AssertionError):
        PipelinedExecution(a, Stage("A"))
    assert a._stage_id == -1


def test_stage_of_unknown_block_asserts():
    with pytest.raises(AssertionError, match="Unknown block X"):
        PipelinedExecution("A").stage("X")


def test_unknown_block_in_explicit_strategy():
    strategy = PipelinedExecution("A", "B")
    strategy.assert_known_block("A")
    with pytest.raises(AssertionError, match=re.escape("Unknown Block 'C' list of expected Blocks: ['A', 'B']")):
        strategy.assert_known_block("C")


def test_autostage_cannot_be_mixed_with_stages():
    with pytest.raises(AssertionError):
        PipelinedExecution(AutoStage.AutoIncrement, "A")


def test_bad_stage_argument():
    with pytest.raises(AssertionError):
        PipelinedExecution(["A", 2])


def test_sharded_takes_the_same_arguments():
    strategy = ShardedExecution("A", "B")
    assert isinstance(strategy, _IExecutionStrategy)
    assert strategy.stage_of("B")[0] == 1
    assert ShardedExecution().auto_stage == AutoStage.SameAsIpu


def test_backend_options_pipelined_and_sharded():
    assert PipelinedExecution().backendOptions() == {"execution_mode": 0}
    assert ShardedExecution().backendOptions() == {"execution_mode": 1}


# --- Phased ---------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [SerialPhasedExecution, ParallelPhasedExecution])
def test_phased_needs_phases(cls):
    with pytest.raises(AssertionError, match="^There is currently no AutoStage for PhasedExecution, please "
                                             "explicitly specify the phases$"):
        cls()


@pytest.mark.parametrize("cls", [SerialPhasedExecution, ParallelPhasedExecution])
def test_phased_accepts_phases_lists_of_stages_and_lists_of_blocks(cls):
    strategy = cls(Phase(Stage("A"), Stage("A2")), [Stage("B"), Stage("B2")], ["C", "C2"], "D")
    assert len(strategy.phases) == 4
    assert [s.blocks for s in strategy.phase(2).stages] == [["C", "C2"]]
    assert strategy.stage_of("B2")[0] == 3  # stages are numbered across phases
    assert strategy.stage("B2")._phase_id == 1
    assert strategy.stage("D")._phase_id == 3


def test_phased_block_in_two_stages():
    with pytest.raises(AssertionError, match="A associated with more than one stage"):
        SerialPhasedExecution(["A"], ["A", "B"])


def test_phase_index_must_be_non_negative_int():
    strategy = SerialPhasedExecution(["A"])
    with pytest.raises(AssertionError, match="Phases are identified by positive integers"):
        strategy.phase(-1)
    with pytest.raises(AssertionError, match="Phases are identified by positive integers"):
        strategy.phase("0")


def test_phase_ipus_through_the_strategy():
    strategy = SerialPhasedExecution(Phase(Stage("A"), Stage("A2")), Phase(Stage("B"), Stage("B2")))
    strategy.phase(0).ipus(0, 1)
    strategy.phase(1).ipus(0, 1)
    assert strategy.stage("B2")._ipu == 1


def test_serial_backend_options_and_liveness():
    strategy = SerialPhasedExecution(["A"], ["B"])
    assert strategy.backendOptions() == {"execution_mode": 2, "separate_backward_phase": False,
                                         "tensors_liveness": 0, "serial_phases_execution": True}
    assert strategy.setTensorsLiveness(Liveness.OffChipAfterEachPhase) is strategy
    assert strategy.useSeparateBackwardPhase() is strategy
    assert strategy.backendOptions() == {"execution_mode": 2, "separate_backward_phase": True,
                                         "tensors_liveness": 3, "serial_phases_execution": True}


def test_serial_liveness_must_be_enum():
    with pytest.raises(AssertionError):
        SerialPhasedExecution(["A"]).setTensorsLiveness(1)


def test_separate_backward_phase_must_be_bool():
    with pytest.raises(AssertionError):
        SerialPhasedExecution(["A"]).useSeparateBackwardPhase(1)


def test_parallel_backend_options_and_off_chip():
    strategy = ParallelPhasedExecution(["A"], ["B"])
    assert strategy.backendOptions()["serial_phases_execution"] is False
    assert strategy.sendTensorsOffChipAfterFwd() is strategy
    assert strategy.backendOptions()["tensors_liveness"] == Liveness.OffChipAfterFwd
    strategy.sendTensorsOffChipAfterFwd(False)
    assert strategy.backendOptions()["tensors_liveness"] == Liveness.AlwaysLive
    with pytest.raises(AssertionError):
        strategy.sendTensorsOffChipAfterFwd("yes")


PARITY = ("When phases are executed in parallel: even phases must run on even IPUs and odd phases on "
          "odd IPUs")


def test_parallel_phases_even_odd_ipus():
    strategy = ParallelPhasedExecution(Phase(Stage("0"), Stage("1")), Phase(Stage("2"), Stage("3")),
                                       Phase(Stage("4"), Stage("5")))
    strategy.phase(0).ipus(0, 2)
    strategy.phase(1).ipus(1, 3)
    strategy.phase(2).ipus(0, 2)
    strategy.validate()
    strategy.check_phase_ipu(1, 3)
    with pytest.raises(Error, match=PARITY):
        strategy.check_phase_ipu(1, 2)
    strategy.phase(1).ipus(1, 2)
    with pytest.raises(Error, match=PARITY):
        strategy.validate()


def test_serial_phases_have_no_parity_rule():
    strategy = SerialPhasedExecution(Phase(Stage("A"), Stage("A2")), Phase(Stage("B"), Stage("B2")))
    strategy.phase(0).ipus(0, 1)
    strategy.phase(1).ipus(0, 1)
    strategy.validate()
