"""PopART global replication under poprun: 2 instances x 1 replica, set up by
``popdist.popart``, train to the weights of one process with ``replicatedGraphCount`` 2."""
import numpy as np
import pytest

import popart

from helpers import popart_distributed_program as program
from helpers.poprun_runner import load_results, run_poprun


@pytest.fixture(scope="module")
def two_instances(tmp_path_factory):
    out = tmp_path_factory.mktemp("popart_two")
    result = run_poprun("--num-instances", "2", "--num-replicas", "2", "python",
                        program.__file__, str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    return load_results(out, 2)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(program.OPTIMIZERS))
def test_two_instances_equal_one_process_with_two_replicas(two_instances, name):
    options = popart.SessionOptions()
    options.enableReplicatedGraphs, options.replicatedGraphCount = True, 2
    oracle = program.train(name, options, popart.DeviceManager().acquireAvailableDevice(2), 2, 0, 2, init_seed=0)
    for rank, result in enumerate(two_instances):
        ours = result[name]
        for key, value in oracle["weights"].items():
            np.testing.assert_allclose(ours["weights"][key], value, atol=1e-6, rtol=0, err_msg=f"{rank} {key}")
        for mine, both in zip(ours["losses"], oracle["losses"]):
            # Each instance's anchors hold its own replica's losses: [bps, accl] of [bps, accl, 2].
            np.testing.assert_allclose(mine, both[:, :, rank], atol=1e-6, rtol=0)
        assert ours["shape"] == [program.MICRO, 4]  # Final anchor, one local replica


def test_popdist_popart_configures_each_instance(two_instances):
    assert [r["options"] for r in two_instances] == [
        {"enableReplicatedGraphs": False, "replicatedGraphCount": 1, "enableDistributedReplicatedGraphs": True,
         "globalReplicationFactor": 2, "globalReplicaOffset": i} for i in range(2)]
    assert [r["numIpus"] for r in two_instances] == [1, 1]


def test_distributed_options_outside_poprun_name_the_launch():
    options = popart.SessionOptions()
    options.enableDistributedReplicatedGraphs, options.globalReplicationFactor = True, 2
    with pytest.raises(popart.popart_exception, match="poprun --num-instances 2 --num-replicas 2"):
        program.train("sgd", options, popart.DeviceManager().acquireAvailableDevice(1), 2, 0, 1, init_seed=0)
    options.globalReplicaOffset = 3
    with pytest.raises(popart.popart_exception, match="globalReplicaOffset"):
        program.train("sgd", options, popart.DeviceManager().acquireAvailableDevice(1), 2, 0, 1, init_seed=0)


def test_popdist_popart_outside_poprun_is_one_replica():
    import popdist.popart
    options = popart.SessionOptions()
    popdist.popart.configureSessionOptions(options)
    assert not options.enableDistributedReplicatedGraphs and options.replicatedGraphCount == 1
    assert popdist.popart.getDevice().numIpus == 1


@pytest.mark.parametrize("instances,replicas", [(2, 2), (2, 4)])
def test_broadcast_weights_and_independent_sessions_under_poprun(tmp_path, instances, replicas):
    """``session.broadcastWeights()`` (before prepareDevice, as PopART's distributed_test) gives every
    instance instance 0's weights; a session without distributed options trains on its own,
    whatever poprun's --num-replicas."""
    from helpers import popart_broadcast_program
    result = run_poprun("--num-instances", str(instances), "--num-replicas", str(replicas), "python",
                        popart_broadcast_program.__file__, str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(instances):
        saved = np.load(tmp_path / f"rank{rank}.npz")
        np.testing.assert_allclose(saved["anchor"], [43.0])  # 1 + instance 0's 42
        np.testing.assert_allclose(saved["weight"], [10.0 * (rank + 1) - 0.5])  # its own step, not averaged
