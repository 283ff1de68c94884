"""Options files that set an execution strategy, all-or-nothing loading, and option groups whose
class is swapped for a subclass (popdist wraps PopTorch's options that way)."""
import pytest
import torch

import poptorch
from openpop.errors import FROZEN_OPTIONS
from openpop.options import _DistributedOptions, _TrainingOptions


def write(tmp_path, text):
    path = tmp_path / "options.cfg"
    path.write_text(text)
    return str(path)


def test_file_setting_an_execution_strategy(tmp_path):
    """The options-file example of PopTorch's user guide."""
    opts = poptorch.Options().loadFromFile(write(tmp_path, (
        "deviceIterations(1)\n"
        "setExecutionStrategy(poptorch.ShardedExecution())\n"
        "replicationFactor(1)\n"
        "enableSyntheticData(True)\n")))
    assert type(opts._execution_strategy) is poptorch.ShardedExecution
    assert opts._Popart.options["syntheticDataMode"] == 2


def test_file_strategies_with_stages_and_enums(tmp_path):
    opts = poptorch.Options().loadFromFile(write(tmp_path, (
        "setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))\n")))
    assert opts._execution_strategy.auto_stage == poptorch.AutoStage.AutoIncrement
    opts = poptorch.Options().loadFromFile(write(tmp_path, (
        "setExecutionStrategy(poptorch.SerialPhasedExecution(poptorch.Phase(poptorch.Stage('a').ipu(0)), "
        "poptorch.Phase('b')))\n"
        "outputMode(poptorch.OutputMode.All)\n")))
    strategy = opts._execution_strategy
    assert isinstance(strategy, poptorch.SerialPhasedExecution)
    assert [stage.blocks for stage in strategy.stages] == [["a"], ["b"]]
    assert opts.output_mode == poptorch.OutputMode.All


def test_a_file_with_a_failing_line_changes_nothing(tmp_path):
    opts = poptorch.Options()
    path = write(tmp_path, ("deviceIterations(4)\n"
                            "setExecutionStrategy(poptorch.ShardedExecution())\n"
                            "Training.gradientAccumulation(2)\n"
                            "_Popart.set('autoRecomputation', 0)\n"
                            "Distributed.__class__ = Subclass\n"))
    with pytest.raises(NameError) as info:
        opts.loadFromFile(path)
    assert any("line 5" in note and "no line of the file was applied" in note
               for note in getattr(info.value, "__notes__", []))
    assert opts.device_iterations == 1 and opts.Training.gradient_accumulation == 1
    assert type(opts._execution_strategy) is poptorch.PipelinedExecution
    assert "autoRecomputation" not in opts._Popart.options
    assert not opts.explicitlySet("device_iterations")
    assert type(opts.Distributed) is _DistributedOptions
    opts.deviceIterations(3)  # still usable
    assert opts.device_iterations == 3


class PopdistDistributed(_DistributedOptions):
    """What popdist does: the group refuses to be reconfigured by hand."""

    def configureProcessId(self, process_id, num_processes):
        raise RuntimeError("Cannot call `configureProcessId` with popdist.poptorch.Options")


def test_an_option_group_class_can_be_replaced_by_a_subclass():
    opts = poptorch.Options()
    opts.Distributed.__class__ = PopdistDistributed
    assert isinstance(opts.Distributed, PopdistDistributed)
    with pytest.raises(RuntimeError, match="Cannot call `configureProcessId`"):
        opts.Distributed.configureProcessId(0, 2)
    assert opts.Distributed.numProcesses == 1
    copied = opts.clone()
    assert isinstance(copied.Distributed, PopdistDistributed)

    class Training(_TrainingOptions):
        pass

    opts.Training.__class__ = Training
    opts.Training.gradientAccumulation(2)
    assert opts.Training.gradient_accumulation == 2

    class WrappedOptions(poptorch.Options):
        pass

    opts.__class__ = WrappedOptions
    assert isinstance(opts, WrappedOptions) and opts.Training.gradient_accumulation == 2


def test_other_private_attributes_still_cannot_be_created_and_frozen_classes_stay():
    opts = poptorch.Options()
    with pytest.raises(AttributeError, match="Invalid private attribute _new"):
        opts.Distributed._new = 1
    model = torch.nn.Linear(2, 2)
    poptorch.inferenceModel(model, opts)
    with pytest.raises(AttributeError, match=FROZEN_OPTIONS):
        opts.Distributed.__class__ = PopdistDistributed
    assert type(opts.Distributed) is _DistributedOptions
