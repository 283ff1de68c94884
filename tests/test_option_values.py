"""Integer count options and IPU indices are checked when they are set, whichever way they are
set, and name the option (before: a 0 or a negative count died inside the first call with a
ZeroDivisionError or ``invalid shape dimension -8``; ``ipu_id=-1`` printed ``IPU -1``)."""
import json

import pytest
import torch

import poptorch

BAD_COUNTS = [0, -1, -8, True, False]

# (how to set it, the option's key, where it is read back)
COUNT_SETTERS = {
    "deviceIterations": (lambda o, v: o.deviceIterations(v), "device_iterations", lambda o: o.device_iterations),
    "replicationFactor": (lambda o, v: o.replicationFactor(v), "replication_factor", lambda o: o.replication_factor),
    "gradientAccumulation": (lambda o, v: o.Training.gradientAccumulation(v), "gradient_accumulation",
                             lambda o: o.Training.gradient_accumulation),
}


@pytest.mark.parametrize("value", BAD_COUNTS)
@pytest.mark.parametrize("setter", sorted(COUNT_SETTERS))
def test_counts_must_be_positive_integers(setter, value):
    set_it, key, read = COUNT_SETTERS[setter]
    opts = poptorch.Options()
    with pytest.raises(ValueError, match=f"{setter}: {key} must be an integer >= 1, not {value!r}"):
        set_it(opts, value)
    assert read(opts) == 1 and not (opts.Training if key == "gradient_accumulation" else opts).explicitlySet(key)


@pytest.mark.parametrize("value", [0, -2, True])
def test_every_way_of_setting_a_count_is_checked(tmp_path, value):
    opts = poptorch.Options()
    with pytest.raises(ValueError, match="device_iterations must be an integer >= 1"):
        opts.set(device_iterations=value)
    with pytest.raises(ValueError, match="replication_factor must be an integer >= 1"):
        opts.replication_factor = value
    with pytest.raises(ValueError, match="gradient_accumulation must be an integer >= 1"):
        opts.Training.set(gradient_accumulation=value)
    with pytest.raises(ValueError, match="device_iterations must be an integer >= 1"):
        opts.createOrSet(device_iterations=value)
    with pytest.raises(ValueError, match="gradient_accumulation must be an integer >= 1"):
        opts.from_json(json.dumps({"Training.gradientAccumulation": value}))
    config = tmp_path / "opts.cfg"
    config.write_text(f"deviceIterations(2)\nreplicationFactor({value})\n")
    with pytest.raises(ValueError, match="replication_factor must be an integer >= 1"):
        opts.loadFromFile(str(config))
    assert (opts.device_iterations, opts.replication_factor, opts.Training.gradient_accumulation) == (1, 1, 1)


def test_valid_counts_are_kept():
    opts = poptorch.Options().deviceIterations(3).replicationFactor(2)
    opts.Training.gradientAccumulation(5)
    assert (opts.device_iterations, opts.replication_factor, opts.Training.gradient_accumulation) == (3, 2, 5)


def test_the_other_counts_of_the_same_kind():
    opts = poptorch.Options().replicationFactor(4)
    with pytest.raises(ValueError, match="input_group_size must be an integer >= 1, not 0"):
        opts.inputReplicaGrouping(0, poptorch.CommGroupType.Consecutive)  # was a ZeroDivisionError
    with pytest.raises(ValueError, match="output_return_period must be an integer >= 1, not True"):
        opts.outputMode(poptorch.OutputMode.EveryN, True)
    with pytest.raises(ValueError, match="output_return_period must be an integer >= 1, not -2"):
        opts.set(output_return_period=-2)
    with pytest.raises(ValueError, match="max_repeat_logs must be an integer >= 0, not -1"):
        opts.maxRepeatLogs(-1)
    opts.maxRepeatLogs(0)
    with pytest.raises(ValueError, match="ipu_id must be an integer >= 0, not -1"):
        opts.useIpuId(-1)
    with pytest.raises(ValueError, match="ipu_id must be an integer >= 0, not True"):
        opts.useIpuId(True)
    with pytest.raises(AssertionError, match="Invalid key: IPU-1"):
        opts.setAvailableMemoryProportion({"IPU-1": 0.5})
    with pytest.raises(ValueError, match="num_distributed_processes must be an integer >= 1, not 0"):
        opts.Distributed.configureProcessId(0, 0)
    with pytest.raises(ValueError, match="distributed_process_id must be an integer >= 0, not -1"):
        opts.Distributed.configureProcessId(-1, 2)
    with pytest.raises(ValueError, match=r"process_id \(2\) must be smaller than num_processes \(2\)"):
        opts.Distributed.configureProcessId(2, 2)
    assert (opts.input_group_size, opts.output_return_period, opts.max_repeat_logs) == (1, 1, 0)
    assert not opts.exists("ipu_id") and opts.available_memory_proportion == {}
    assert (opts.Distributed.processId, opts.Distributed.numProcesses) == (0, 1)


def test_a_bad_count_never_reaches_a_run():
    """The first call used to fail inside the run (ZeroDivisionError); now the options refuse it."""
    model = torch.nn.Linear(4, 4)
    opts = poptorch.Options()
    with pytest.raises(ValueError):
        opts.deviceIterations(0)
    inference = poptorch.inferenceModel(model, opts)
    assert inference(torch.ones(2, 4)).shape == (2, 4)


@pytest.mark.parametrize("ipu_id", [-1, True, 1.0])
def test_block_annotations_need_an_ipu_index(ipu_id):
    layer = torch.nn.Linear(2, 2)
    with pytest.raises(poptorch.Error, match=f"BeginBlock: ipu_id must be an integer >= 0 .*not {ipu_id!r}"):
        poptorch.BeginBlock(layer, ipu_id=ipu_id)
    assert not layer._forward_pre_hooks  # not annotated
    with pytest.raises(poptorch.Error, match="BeginBlock: ipu_id must be"):
        poptorch.BeginBlock(lambda x: x, ipu_id=ipu_id)
    with pytest.raises(poptorch.Error, match="Block: ipu_id must be"):
        poptorch.Block("b", ipu_id=ipu_id)
    with pytest.raises(poptorch.Error, match="Block.start: ipu_id must be"):
        poptorch.Block.start("b", ipu_id=ipu_id)
    with pytest.raises(poptorch.Error, match="BlockFunction: ipu_id must be"):
        poptorch.BlockFunction("b", ipu_id=ipu_id)
    if not isinstance(ipu_id, float):  # a non-int is PopTorch's AssertionError
        with pytest.raises(poptorch.Error, match="Stage.ipu: ipu must be an integer >= 0"):
            poptorch.Stage("a").ipu(ipu_id)
        with pytest.raises(poptorch.Error, match="Stage.ipu: ipu must be"):
            poptorch.Phase(poptorch.Stage("a")).ipus(ipu_id)


def test_valid_ipu_indices_are_accepted():
    layer = poptorch.BeginBlock(torch.nn.Linear(2, 2), user_id="l", ipu_id=0)
    assert "ipu_id=0" in poptorch.module_repr(layer)
    assert poptorch.Block("b", ipu_id=3).extra_repr() == "user_id=b, ipu_id=3"
    assert poptorch.Stage("a").ipu(1)._ipu == 1
    poptorch.BlockFunction("b")  # ipu_id None: from the strategy
