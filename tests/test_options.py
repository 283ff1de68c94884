"""poptorch.Options: storage and validation, freezing, copies, serialisation and every setter."""
import copy
import json
import logging
import pickle
import re
import warnings

import pytest
import torch

from openpop import enums
from openpop.enums import (
    CommGroupType,
    ConnectionType,
    HalfFloatCastingBehavior,
    MeanReductionStrategy,
    OutputMode,
    ReductionType,
    SyncPattern,
)
from openpop.errors import ConfigFileError, Error
from openpop.log import logger
from openpop.options import Options, OptionsDict, TensorLocationSettings
from openpop.strategies import ParallelPhasedExecution, PipelinedExecution, SerialPhasedExecution, ShardedExecution

FROZEN = "Can't modify frozen Options"
ENV_VARS = ["POPTORCH_CACHE_DIR", "POPTORCH_DEFAULT_OPTIONS", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
            "POPLAR_ENGINE_OPTIONS"]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def log_records():
    """Records emitted on openpop's logger (it does not propagate to the root logger)."""
    records = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = Collect(level=logging.DEBUG)
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def picked():
    """Options whose output mode is chosen, so toDict() is allowed."""
    return Options().outputMode(OutputMode.All)


# --- defaults ---------------------------------------------------------------------------
def test_defaults():
    opts = Options()
    assert opts.replication_factor == 1
    assert opts.input_group_size == 1
    assert opts.input_cgt == CommGroupType.Consecutive
    assert opts.broadcast_buffers is True
    assert opts.device_iterations == 1
    assert opts.log_dir == "."
    assert opts.max_repeat_logs == 4
    assert opts.auto_round_num_ipus is False
    assert opts.anchored_tensors == {}
    assert opts.output_mode == OutputMode.Default.value == 4
    assert type(opts.output_mode) is int
    assert opts.output_return_period == 1
    assert opts.connection_type == ConnectionType.Always.value
    assert opts.sync_pattern == SyncPattern.Full.value
    assert opts.available_memory_proportion == {}
    assert opts.show_compilation_progress_bar is True
    assert opts.relax_optimizer_attributes_checks is False
    assert opts.module_namescope_enabled is True
    assert opts.updatable_named_buffers == []
    assert opts.defaultOutputMode()
    assert not opts.exists("random_seed")
    strategy = opts._execution_strategy
    assert type(strategy) is PipelinedExecution and strategy.auto_stage == enums.AutoStage.SameAsIpu


def test_group_defaults():
    opts = Options()
    assert opts.Training.gradient_accumulation == 1
    assert opts.Training.accumulation_and_replication_reduction_type == ReductionType.Mean
    assert opts.Training.meanAccumulationAndReplicationReductionStrategy == MeanReductionStrategy.Post
    assert opts.Training.automaticLossScalingSettings == {"enabled": False}
    assert opts.Distributed.numProcesses == 1 and opts.Distributed.processId == 0
    assert opts.Distributed.num_distributed_processes == 1 and opts.Distributed.distributed_process_id == 0
    assert opts.Distributed.ipuof_configs == {}
    assert opts.Precision.partials_type == "float"
    assert opts.Precision.floating_point_exceptions is False
    assert opts.Precision.stochastic_rounding is False
    assert opts._Popart.options == {"instrumentWithHardwareCycleCounter": False, "rearrangeAnchorsOnHost": False}


def test_groups_are_separate_per_instance():
    a, b = Options(), Options()
    a.Training.gradientAccumulation(4)
    a.anchorTensor("g", "Gradient___fc.bias")
    assert b.Training.gradient_accumulation == 1
    assert b.anchored_tensors == {}


# --- storage mechanics --------------------------------------------------------------------
def test_assignment_goes_through_set():
    opts = Options()
    opts.replication_factor = 4
    assert opts.replication_factor == 4
    opts.Training.gradient_accumulation = 3
    assert opts.Training.gradient_accumulation == 3


def test_set_unknown_option():
    opts = Options()
    with pytest.raises(AssertionError, match=r"^Invalid option foo, valid options are dict_keys\(\["):
        opts.set(foo=1)
    with pytest.raises(AssertionError, match="Invalid option foo, valid options are"):
        opts.foo = 1


def test_set_wrong_type():
    opts = Options()
    message = ("Unexpected type <class 'str'> for option device_iterations. Expected <class 'int'>")
    with pytest.raises(AssertionError, match="^" + re.escape(message) + "$"):
        opts.deviceIterations("2")
    with pytest.raises(AssertionError, match="Unexpected type <class 'float'> for option replication_factor"):
        opts.replication_factor = 2.0


def test_set_is_all_or_nothing():
    opts = Options()
    with pytest.raises(AssertionError):
        opts.set(device_iterations=3, replication_factor="x")
    assert opts.device_iterations == 1


def test_create_or_set_and_exists():
    opts = Options()
    opts.createOrSet(model_name="m")
    assert opts.exists("model_name") and opts.model_name == "m"
    opts.createOrSet(model_name="n", device_iterations=2)
    assert opts.model_name == "n" and opts.device_iterations == 2
    with pytest.raises(AssertionError, match="Unexpected type"):
        opts.createOrSet(device_iterations="2")


def test_unknown_attribute_read():
    with pytest.raises(AttributeError, match=r"^Invalid attribute nonexistent\.$"):
        _ = Options().nonexistent
    with pytest.raises(AttributeError, match="Invalid attribute nope."):
        _ = Options().Training.nope


def test_new_private_attribute_is_rejected():
    opts = Options()
    with pytest.raises(AttributeError, match="Invalid private attribute _mine"):
        opts._mine = 1
    opts._execution_strategy = ShardedExecution()  # existing private attributes may change


def test_subclass_may_create_private_attributes_in_init():
    class MyOptions(OptionsDict):
        def __init__(self):
            self._extra = 1
            super().__init__(value=2)

    mine = MyOptions()
    assert mine._extra == 1 and mine.value == 2


# --- freezing -----------------------------------------------------------------------------
def test_frozen_options_reject_every_change():
    opts = Options()
    opts._freeze()
    attempts = [
        lambda: opts.deviceIterations(2),
        lambda: setattr(opts, "replication_factor", 2),
        lambda: opts.createOrSet(model_name="x"),
        lambda: opts.anchorTensor("a", "b"),
        lambda: opts.outputMode(OutputMode.All),
        lambda: opts.setExecutionStrategy(ShardedExecution()),
        lambda: opts.enableExecutableCaching("/tmp/x"),
        lambda: opts.Training.gradientAccumulation(2),
        lambda: opts.Training.setConvolutionDithering(True),
        lambda: opts.Precision.setPartialsType(torch.half),
        lambda: opts.Distributed.configureProcessId(1, 2),
        lambda: opts.TensorLocations.numIOTiles(32),
        lambda: opts._Popart.set("x", 1),
        lambda: opts.from_json('{"deviceIterations": 3}'),
    ]
    for attempt in attempts:
        with pytest.raises(AttributeError, match="^" + re.escape(FROZEN) + "$"):
            attempt()
    assert opts.device_iterations == 1 and opts._Popart.options.get("x") is None


def test_frozen_random_seed_does_not_seed_torch():
    opts = Options()
    opts._freeze()
    torch.manual_seed(0)
    expected = torch.rand(1)
    torch.manual_seed(0)
    with pytest.raises(AttributeError, match=re.escape(FROZEN)):
        opts.randomSeed(42)
    assert torch.equal(torch.rand(1), expected)


def test_frozen_options_can_still_be_read_and_serialised():
    opts = picked()
    opts._freeze()
    assert opts.device_iterations == 1
    assert opts.toDict()["output_mode"] == OutputMode.All


def test_clone_is_an_unfrozen_deep_copy():
    opts = Options()
    opts.Training.gradientAccumulation(2)
    opts._freeze()
    duplicate = opts.clone()
    duplicate.deviceIterations(5)
    duplicate.Training.gradientAccumulation(3)
    duplicate._Popart.set("x", 1)
    duplicate.Precision.setPartialsType(torch.half)
    assert opts.device_iterations == 1 and opts.Training.gradient_accumulation == 2
    assert "x" not in opts._Popart.options and opts.Precision.partials_type == "float"
    assert duplicate.Precision.partials_type == "half"  # Precision still writes the copy's PopART options
    with pytest.raises(AttributeError, match=re.escape(FROZEN)):
        opts.deviceIterations(5)


def test_deepcopy_is_unfrozen():
    opts = Options()
    opts._freeze()
    duplicate = copy.deepcopy(opts)
    duplicate.replicationFactor(2)
    assert duplicate.replication_factor == 2 and opts.replication_factor == 1
    assert duplicate._execution_strategy is not opts._execution_strategy


def test_pickle_round_trip():
    opts = Options().deviceIterations(3)
    opts.Training.gradientAccumulation(2)
    restored = pickle.loads(pickle.dumps(opts))
    assert restored.device_iterations == 3 and restored.Training.gradient_accumulation == 2


# --- repr and toDict ------------------------------------------------------------------------
def test_repr():
    opts = Options().replicationFactor(4)
    text = repr(opts)
    assert text.startswith("Options(replication_factor=4, ")
    assert "log_dir='.'" in text
    assert "Training=_TrainingOptions(gradient_accumulation=1" in text
    assert "Distributed=_DistributedOptions(" in text
    assert text.endswith(")")


def test_to_dict_requires_an_output_mode():
    with pytest.raises(AssertionError, match="^An output mode must be picked before serialisation$"):
        Options().toDict()


def test_to_dict_merges_everything():
    opts = picked()
    opts.deviceIterations(2).replicationFactor(4).randomSeed(7).useIpuModel(True).syncPattern(
        SyncPattern.SinglePipeline)
    opts.Training.gradientAccumulation(3)
    opts.Distributed.configureProcessId(1, 2)
    opts.TensorLocations.numIOTiles(64).setWeightLocation(TensorLocationSettings().useOnChipStorage(False))
    opts.Precision.setPartialsType(torch.half).enableStochasticRounding(True)
    opts.setAvailableMemoryProportion({"IPU1": 0.3})
    opts._Popart.set("autoRecomputation", 3)
    opts.setExecutionStrategy(SerialPhasedExecution(["A"], ["B"]))
    d = opts.toDict()
    assert d["execution_mode"] == 2 and d["serial_phases_execution"] is True
    assert d["device_iterations"] == 2 and d["replication_factor"] == 4
    assert d["random_seed"] == 7 and d["use_model"] is True
    assert d["sync_pattern"] == SyncPattern.SinglePipeline
    assert d["gradient_accumulation"] == 3
    assert d["accumulation_and_replication_reduction_type"] == ReductionType.Mean
    assert d["num_distributed_processes"] == 2 and d["distributed_process_id"] == 1
    assert d["numIOTiles"] == 64 and d["location_weight"] == {"onChip": 0}
    assert d["partialsTypeMatMuls"] == "half" and d["convolutionOptions"] == {"partialsType": "half"}
    assert d["enableStochasticRounding"] is True
    assert d["available_memory_proportion"] == {1: 0.3}
    assert d["autoRecomputation"] == 3
    assert d["instrumentWithHardwareCycleCounter"] is False and d["rearrangeAnchorsOnHost"] is False


def test_to_dict_is_a_copy():
    opts = picked()
    d = opts.toDict()
    d["anchored_tensors"]["x"] = 1
    d["device_iterations"] = 99
    assert opts.anchored_tensors == {} and opts.device_iterations == 1


def test_to_dict_rejects_a_key_set_twice():
    opts = picked()
    opts._Popart.set("device_iterations", 3)
    with pytest.raises(AssertionError, match="Can't merge dictionaries, they have some keys in common"):
        opts.toDict()


def test_to_dict_uses_the_strategy():
    opts = picked()
    assert opts.toDict()["execution_mode"] == 0
    opts.setExecutionStrategy(ShardedExecution())
    assert opts.toDict()["execution_mode"] == 1
    opts.setExecutionStrategy(ParallelPhasedExecution(["A"]).useSeparateBackwardPhase())
    d = opts.toDict()
    assert d["execution_mode"] == 2 and d["separate_backward_phase"] is True
    assert d["serial_phases_execution"] is False


def test_set_execution_strategy_type_check():
    with pytest.raises(AssertionError):
        Options().setExecutionStrategy("pipelined")


# --- general setters -------------------------------------------------------------------------
def test_simple_setters_return_self_and_store():
    opts = Options()
    assert opts.deviceIterations(4) is opts and opts.device_iterations == 4
    assert opts.replicationFactor(2) is opts and opts.replication_factor == 2
    assert opts.broadcastBuffers(False) is opts and opts.broadcast_buffers is False
    assert opts.broadcastBuffers() is opts and opts.broadcast_buffers is True
    assert opts.autoRoundNumIPUs() is opts and opts.auto_round_num_ipus is True
    assert opts.logDir("/tmp/logs") is opts and opts.log_dir == "/tmp/logs"
    assert opts.modelName("net") is opts and opts.model_name == "net"
    assert opts.useIpuModel(True) is opts and opts.use_model is True
    assert opts.useIpuId(3) is opts and opts.ipu_id == 3
    assert opts.showCompilationProgressBar(False) is opts and opts.show_compilation_progress_bar is False
    assert opts.relaxOptimizerAttributesChecks() is opts and opts.relax_optimizer_attributes_checks is True
    assert opts.disableModuleNamescope() is opts and opts.module_namescope_enabled is False
    assert opts.updatableNamedBuffers(["bn.running_mean"]) is opts
    assert opts.updatable_named_buffers == ["bn.running_mean"]


def test_use_ipu_id_must_be_int():
    with pytest.raises(AssertionError):
        Options().useIpuId("0")


def test_connection_and_sync_pattern():
    opts = Options()
    opts.connectionType(ConnectionType.OnDemand)
    assert opts.connection_type == 1 and type(opts.connection_type) is int
    opts.syncPattern(SyncPattern.ReplicaAndLadder)
    assert opts.sync_pattern == 2
    with pytest.raises(AssertionError):
        opts.connectionType(1)
    with pytest.raises(AssertionError):
        opts.syncPattern(0)


def test_offline_ipu_target():
    opts = Options().useOfflineIpuTarget()
    assert opts.connection_type == ConnectionType.Never and opts.ipu_version == 2
    assert Options().useOfflineIpuTarget(21).ipu_version == 21


def test_input_replica_grouping():
    opts = Options().replicationFactor(4)
    opts.inputReplicaGrouping(2, CommGroupType.Orthogonal)
    assert opts.input_group_size == 2 and opts.input_cgt == CommGroupType.Orthogonal
    opts.inputReplicaGrouping(4, CommGroupType.NoGrouping)
    assert opts.input_group_size == 1 and opts.input_cgt == CommGroupType.Consecutive


@pytest.mark.parametrize("size, group_type, message", [
    (1, CommGroupType.All, "input_group_type cannot be All"),
    (8, CommGroupType.Consecutive, "input_group_size cannot be larger than replication_factor"),
    (3, CommGroupType.Consecutive, "input_group_size must be a factor of replication_factor"),
])
def test_input_replica_grouping_errors(size, group_type, message):
    opts = Options().replicationFactor(4)
    with pytest.raises(ValueError, match="^" + message + "$"):
        opts.inputReplicaGrouping(size, group_type)
    assert opts.input_group_size == 1


def test_output_mode():
    opts = Options()
    assert opts.outputMode(OutputMode.Sum) is opts
    assert opts.output_mode == 3 and type(opts.output_mode) is int and opts.output_return_period == 1
    assert not opts.defaultOutputMode()
    opts.outputMode(OutputMode.EveryN, 5)
    assert opts.output_mode == OutputMode.EveryN and opts.output_return_period == 5
    opts.outputMode(OutputMode.Default)
    assert opts.defaultOutputMode()


@pytest.mark.parametrize("period", [None, 0, -1])
def test_output_mode_every_n_needs_a_period(period):
    with pytest.raises(AssertionError, match="^EveryN anchor must have output_return_period set to valid "
                                             "positive integer$"):
        Options().outputMode(OutputMode.EveryN, period)


def test_output_mode_must_be_enum():
    with pytest.raises(AssertionError):
        Options().outputMode(2)


def test_output_mode_period_ignored_is_logged(log_records):
    opts = Options().outputMode(OutputMode.All, 3)
    assert opts.output_return_period == 3  # stored as given, like PopTorch; only EveryN uses it
    infos = [r.getMessage() for r in log_records if r.levelno == logging.INFO]
    assert any(m.startswith("Anchor return period argument ignored with output_mode set to") for m in infos)


def test_anchor_mode_is_a_deprecated_alias():
    opts = Options()
    with pytest.warns(DeprecationWarning, match="Use outputMode instead, previous name was misleading"):
        assert opts.anchorMode(OutputMode.EveryN, 2) is opts
    assert opts.output_mode == OutputMode.EveryN and opts.output_return_period == 2
    with pytest.warns(DeprecationWarning, match="Use outputMode instead, previous name was misleading"):
        assert opts.defaultAnchorMode() is False
    with pytest.warns(DeprecationWarning):
        with pytest.raises(AssertionError, match="EveryN anchor must have output_return_period"):
            opts.anchorMode(OutputMode.EveryN)


def test_anchor_tensor():
    opts = Options()
    assert opts.anchorTensor("grad", "Gradient___fc2.bias") is None
    opts.anchorTensor("w", "fc.weight", OutputMode.EveryN, 4)
    opts.anchorTensor("s", "fc.bias", OutputMode.Sum, 4)
    assert opts.anchored_tensors == {
        "grad": ["Gradient___fc2.bias", True, None, 1],
        "w": ["fc.weight", False, OutputMode.EveryN, 4],
        "s": ["fc.bias", False, OutputMode.Sum, 1],
    }


def test_random_seed_seeds_torch():
    opts = Options()
    assert opts.randomSeed(1234) is opts
    first = torch.rand(3)
    torch.manual_seed(1234)
    assert torch.equal(first, torch.rand(3))
    assert opts.exists("random_seed") and opts.random_seed == 1234
    with pytest.raises(AssertionError):
        opts.randomSeed(1.5)


def test_executable_caching():
    opts = Options()
    assert opts.enableExecutableCaching("/tmp/cache") is opts
    assert opts._Popart.options["cachePath"] == "/tmp/cache"
    assert opts._Popart.options["enableEngineCaching"] is True
    opts.enableExecutableCaching(None)
    assert opts._Popart.options["enableEngineCaching"] is False


def test_cache_dir_from_environment(monkeypatch):
    monkeypatch.setenv("POPTORCH_CACHE_DIR", "/tmp/env_cache")
    opts = Options()
    assert opts._Popart.options["cachePath"] == "/tmp/env_cache"
    assert opts._Popart.options["enableEngineCaching"] is True


def test_default_options_from_environment(monkeypatch):
    monkeypatch.setenv("POPTORCH_DEFAULT_OPTIONS",
                       json.dumps({"deviceIterations": 5, "Training.gradientAccumulation": 2,
                                   "outputMode": ["OutputMode.EveryN", 3]}))
    opts = Options()
    assert opts.device_iterations == 5
    assert opts.Training.gradient_accumulation == 2
    assert opts.output_mode == OutputMode.EveryN and opts.output_return_period == 3


def test_available_memory_proportion():
    opts = Options()
    assert opts.setAvailableMemoryProportion({"IPU0": 0.5, "IPU12": 0.1}) is opts
    assert opts.available_memory_proportion == {0: 0.5, 12: 0.1}
    message = ('Available memory proportions are expected to be in a dictionary of {"IPU0": 0.5} where the '
               "0 in IPU is the index of the IPU. Invalid key: GPU0")
    with pytest.raises(AssertionError, match="^" + re.escape(message) + "$"):
        opts.setAvailableMemoryProportion({"GPU0": 0.5})


def test_max_repeat_logs():
    opts = Options()
    assert opts.maxRepeatLogs(10) is opts and opts.max_repeat_logs == 10
    opts.maxRepeatLogs(None)
    assert opts.max_repeat_logs == 2**64 - 1


def test_popart_backed_general_setters():
    opts = Options()
    opts.enableSyntheticData(True)
    assert opts._Popart.options["syntheticDataMode"] == 2
    opts.enableSyntheticData(False)
    assert opts._Popart.options["syntheticDataMode"] == 0
    opts.logCycleCount(True)
    assert opts._Popart.options["instrumentWithHardwareCycleCounter"] is True
    opts.enableStableNorm(True)
    assert opts._Popart.options["enableStableNorm"] is True


def test_enable_profiling(monkeypatch, log_records):
    opts = Options()
    assert opts.enableProfiling("/tmp/profile") is opts
    engine = opts._Popart.options["engineOptions"]
    assert engine["autoReport.directory"] == "/tmp/profile" and engine["autoReport.all"] == "true"
    assert Options().enableProfiling()._Popart.options["engineOptions"]["autoReport.directory"] == "."
    monkeypatch.setenv("POPLAR_ENGINE_OPTIONS", '{"autoReport.directory": "/x"}')
    Options().enableProfiling()
    assert any("Profiling setting overriden by environment variable" in r.getMessage() for r in log_records)


def test_source_location_excludes():
    opts = Options()
    opts.sourceLocationExcludes(["a"])
    assert opts.source_location_excludes == ["a"]
    opts.appendToLocationExcludes("b", "c")
    assert opts.source_location_excludes == ["a", "b", "c"]


# --- loadFromFile ---------------------------------------------------------------------------
def test_load_from_file(tmp_path):
    config = tmp_path / "opts.cfg"
    config.write_text("# a comment\n\ndeviceIterations(4)\n  replicationFactor(2)\n"
                      "Training.gradientAccumulation(8)\noutputMode(poptorch.OutputMode.Sum)\n"
                      "Precision.setPartialsType(torch.half)\nconnectionType(ConnectionType.OnDemand)\n")
    opts = Options()
    assert opts.loadFromFile(str(config)) is opts
    assert opts.device_iterations == 4 and opts.replication_factor == 2
    assert opts.Training.gradient_accumulation == 8
    assert opts.output_mode == OutputMode.Sum
    assert opts.Precision.partials_type == "half"
    assert opts.connection_type == ConnectionType.OnDemand


def test_load_from_file_syntax_error(tmp_path):
    config = tmp_path / "bad.cfg"
    config.write_text("deviceIterations(4)\n# comment\nreplicationFactor(2\n")
    opts = Options()
    with pytest.raises(ConfigFileError) as info:
        opts.loadFromFile(str(config))
    message = str(info.value)
    assert re.fullmatch(r"SyntaxError at line 3 of file: .+\n> replicationFactor\(2", message), message
    assert opts.device_iterations == 1  # nothing applied


def test_load_from_file_propagates_validation_errors(tmp_path):
    config = tmp_path / "bad_value.cfg"
    config.write_text("deviceIterations('4')\n")
    with pytest.raises(AssertionError, match="Unexpected type"):
        Options().loadFromFile(str(config))


# --- from_json ------------------------------------------------------------------------------
def test_from_json():
    opts = Options()
    result = opts.from_json(json.dumps({
        "deviceIterations": 3,
        "replicationFactor": 4,
        "inputReplicaGrouping": [2, "CommGroupType.Orthogonal"],
        "Training.accumulationAndReplicationReductionType": "ReductionType.Sum",
        "Training.setMeanAccumulationAndReplicationReductionStrategy": "poptorch.MeanReductionStrategy.Running",
        "Distributed.configureProcessId": [1, 4],
        "_Popart.set": ["autoRecomputation", 3],
        "connectionType": "ConnectionType.Never",
        "log_dir": "/tmp/l",
    }))
    assert result is opts
    assert opts.device_iterations == 3 and opts.replication_factor == 4
    assert opts.input_group_size == 2 and opts.input_cgt is CommGroupType.Orthogonal
    assert opts.Training.accumulation_and_replication_reduction_type is ReductionType.Sum
    assert opts.Training.meanAccumulationAndReplicationReductionStrategy is MeanReductionStrategy.Running
    assert opts.Distributed.processId == 1 and opts.Distributed.numProcesses == 4
    assert opts._Popart.options["autoRecomputation"] == 3
    assert opts.connection_type == ConnectionType.Never
    assert opts.log_dir == "/tmp/l"


def test_from_json_keeps_other_strings():
    opts = Options().from_json('{"logDir": "runs.today", "modelName": "NotAnEnum.Value"}')
    assert opts.log_dir == "runs.today" and opts.model_name == "NotAnEnum.Value"


# --- Training -------------------------------------------------------------------------------
def test_training_setters():
    training = Options().Training
    assert training.gradientAccumulation(4) is training and training.gradient_accumulation == 4
    assert training.accumulationAndReplicationReductionType(ReductionType.Sum) is training
    assert training.accumulation_and_replication_reduction_type == ReductionType.Sum
    training.setMeanAccumulationAndReplicationReductionStrategy(MeanReductionStrategy.PostAndLoss)
    assert training.meanAccumulationAndReplicationReductionStrategy == MeanReductionStrategy.PostAndLoss
    assert training.setAutomaticLossScaling(True) is training
    assert training.automaticLossScalingSettings == {"enabled": True}


def test_convolution_dithering_goes_to_popart():
    opts = Options()
    assert opts.Training.setConvolutionDithering(True) is opts.Training
    assert opts._Popart.options["convolutionDithering"] is True


@pytest.mark.parametrize("bad", [ReductionType.NoReduction, 0, "Mean"])
def test_reduction_type_must_be_mean_or_sum(bad):
    with pytest.raises(ValueError, match="^accumulationAndReplicationReductionType must be set to "
                                         "poptorch.ReductionType.Mean or poptorch.ReductionType.Sum$"):
        Options().Training.accumulationAndReplicationReductionType(bad)


def test_mean_reduction_strategy_type_checked():
    with pytest.raises(AssertionError, match="Unexpected type"):
        Options().Training.setMeanAccumulationAndReplicationReductionStrategy(1)


# --- Precision ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype, name", [(torch.float, "float"), (torch.float32, "float"),
                                         (torch.half, "half"), (torch.float16, "half")])
def test_partials_type(dtype, name):
    opts = Options()
    assert opts.Precision.setPartialsType(dtype) is opts.Precision
    assert opts._Popart.options["partialsTypeMatMuls"] == name
    assert opts._Popart.options["convolutionOptions"] == {"partialsType": name}
    assert opts.Precision.partials_type == name


def test_partials_type_error_text():
    with pytest.raises(ValueError, match="^parameter to setPartialsType should be eithertorch.float or "
                                         "torch.half$"):
        Options().Precision.setPartialsType(torch.bfloat16)


def test_floating_point_exceptions():
    opts = Options()
    opts.Precision.enableFloatingPointExceptions(True)
    assert opts._Popart.options["enableFloatingPointChecks"] is True
    assert opts.Precision.floating_point_exceptions is True
    with pytest.raises(AssertionError, match="^enableFloatingPointExceptions needs to be set to a bool$"):
        opts.Precision.enableFloatingPointExceptions(1)


def test_stochastic_rounding():
    opts = Options()
    opts.Precision.enableStochasticRounding(True)
    assert opts._Popart.options["enableStochasticRounding"] is True
    assert opts.Precision.stochastic_rounding is True


def test_deprecated_precision_setters():
    precision = Options().Precision
    with pytest.warns(DeprecationWarning, match="halfFloatCasting"):
        assert precision.halfFloatCasting(HalfFloatCastingBehavior.HalfUpcastToFloat) is precision
    with pytest.warns(DeprecationWarning, match="runningStatisticsAlwaysFloat"):
        assert precision.runningStatisticsAlwaysFloat(True) is precision
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(ValueError, match="^runningStatisticsAlwaysFloat needs to be set to a bool$"):
            precision.runningStatisticsAlwaysFloat(1)


# --- Distributed ----------------------------------------------------------------------------
def test_distributed_setters():
    distributed = Options().Distributed
    assert distributed.configureProcessId(2, 4) is distributed
    assert distributed.processId == 2 and distributed.numProcesses == 4
    assert distributed.disable() is distributed
    assert distributed.processId == 0 and distributed.numProcesses == 1


def test_distributed_reads_mpi_environment_at_construction(monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "8")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    opts = Options()
    assert opts.Distributed.numProcesses == 8 and opts.Distributed.processId == 3


def test_distributed_custom_env_var_names(monkeypatch):
    monkeypatch.setenv("MY_SIZE", "2")
    monkeypatch.setenv("MY_RANK", "1")
    distributed = Options().Distributed
    assert distributed.setEnvVarNames("MY_SIZE", "MY_RANK") is distributed
    assert distributed.numProcesses == 2 and distributed.processId == 1
    distributed.setEnvVarNames("UNSET_SIZE", "UNSET_RANK")
    assert distributed.numProcesses == 1 and distributed.processId == 0


# --- TensorLocations -------------------------------------------------------------------------
@pytest.mark.parametrize("tiles", [32, 64, 192])
def test_num_io_tiles(tiles):
    opts = Options()
    assert opts.TensorLocations.numIOTiles(tiles) is opts.TensorLocations
    # The key has the setter's name, so it is read through toDict(), as in PopTorch.
    assert opts.TensorLocations.toDict()["numIOTiles"] == tiles


@pytest.mark.parametrize("tiles", [30, 33, 194, 0, "32"])
def test_num_io_tiles_error(tiles):
    with pytest.raises(AssertionError, match=r"^numIOTiles must be an even number between 32 and 192\.$"):
        Options().TensorLocations.numIOTiles(tiles)


def test_tensor_location_settings():
    settings = (TensorLocationSettings().minElementsForOffChip(10).minElementsForReplicatedTensorSharding(20)
                .useOnChipStorage(False).useReplicatedTensorSharding().useIOTilesToLoad().useIOTilesToStore(False))
    assert settings.toDict() == {"minElementsForOffChip": 10, "minElementsForReplicatedTensorSharding": 20,
                                 "onChip": 0, "useReplicatedTensorSharding": 1, "useIOTilesToLoad": 1,
                                 "useIOTilesToStore": 0}
    settings.useOnChipStorage(None)
    assert not settings.exists("onChip")
    with pytest.raises(AssertionError):
        settings.useIOTilesToLoad(1)
    with pytest.raises(AssertionError):
        settings.minElementsForOffChip(1.0)


def test_tensor_locations():
    locations = Options().TensorLocations
    on_chip = TensorLocationSettings().useOnChipStorage(True)
    off_chip = TensorLocationSettings().useOnChipStorage(False)
    assert locations.setActivationLocation(on_chip) is locations
    locations.setWeightLocation(off_chip).setOptimizerLocation(off_chip).setAccumulatorLocation(on_chip)
    assert locations.location_activation == {"onChip": 1}
    assert locations.location_weight == {"onChip": 0}
    assert locations.location_optimizer == {"onChip": 0}
    assert locations.location_accumulator == {"onChip": 1}
    off_chip.useIOTilesToLoad()
    assert locations.location_weight == {"onChip": 0}  # a snapshot, not a reference
    with pytest.raises(AssertionError):
        locations.setWeightLocation({"onChip": 0})


# --- Jit and _Popart ---------------------------------------------------------------------------
def test_jit_trace_model():
    jit = Options().Jit
    with pytest.warns(DeprecationWarning, match="traceModel"):
        assert jit.traceModel(False) is jit
    with pytest.warns(DeprecationWarning):
        with pytest.raises(ValueError, match=r"^options.Jit.traceModel\(True\) is no longer supported$"):
            jit.traceModel(True)


def test_popart_options():
    popart = Options()._Popart
    assert popart.set("anything", [1, 2]) is popart
    assert popart.options["anything"] == [1, 2]
    assert popart.setEngineOptions({"debug.x": "true"}) is popart
    assert popart.options["engineOptions"] == {"debug.x": "true"}
    assert popart.setPatterns({"PadSum": True}) is popart
    assert popart.options["patterns"] == {"PadSum": True} and popart.options["patterns_level"] == 2
    popart.setPatterns({}, 0)
    assert popart.options["patterns_level"] == 0
    with pytest.raises(AssertionError):
        popart.setPatterns({}, "2")
    with pytest.raises(AssertionError):
        popart.setPatterns(["PadSum"])


def test_explicitly_set_records_setter_calls_even_with_default_values():
    opts = Options()
    assert not opts.explicitlySet("device_iterations")
    opts.deviceIterations(1)
    assert opts.explicitlySet("device_iterations")
    assert opts.clone().explicitlySet("device_iterations")
    assert not opts.Training.explicitlySet("gradient_accumulation")
    opts.Training.gradientAccumulation(1)
    assert opts.Training.explicitlySet("gradient_accumulation")


def test_the_openpop_group_sets_what_the_setters_outside_it_set():
    """``Options.Openpop`` groups openpop's own settings; each setter stores its value where the
    setter of the same name outside the group does, so toDict() is the same either way."""
    grouped, flat = Options(), Options()
    grouped.Openpop.backend("compiled", compile_after=5, unit="regions").deviceMap(["cpu"]) \
        .autocast(True, torch.float16).rollbackFailedCalls(False)
    flat.openpopBackend("compiled", compile_after=5, unit="regions").deviceMap(["cpu"])
    flat.Precision.autocast(True, torch.float16)
    flat.Training.rollbackFailedCalls(False)
    for options in (grouped, flat):
        options.outputMode(OutputMode.All)  # (toDict() needs one)
    assert grouped.toDict() == flat.toDict()
    assert grouped.Openpop.toDict() == {
        "backend": "compiled", "compile_after": 5.0, "unit": "regions", "device_map": ["cpu"],
        "autocast_enabled": True, "autocast_dtype": torch.float16, "rollback_failed_calls": False}
    with pytest.raises(Error, match="Unknown openpop backend"):
        grouped.Openpop.backend("fast")
    assert grouped.openpop_backend == "compiled"  # (a refused value changes nothing)


def test_the_openpop_group_lists_the_process_settings_from_the_environment(monkeypatch):
    monkeypatch.setenv("OPENPOP_DEVICE_MAP", "cpu,cpu")
    settings = Options().Openpop.processSettings()
    assert settings["OPENPOP_DEVICE_MAP"] == "cpu,cpu"
    assert all(name.startswith("OPENPOP_") for name in settings)
