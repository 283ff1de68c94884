"""Global replication under poprun: N instances of R/N replicas train to the weights of one
process with replicationFactor(R); loaders shard; popdist, execute_on_instances and the horovod
compatibility layer work across instances. Launches are shared between the assertions."""
import pytest

from helpers import poprun_programs as programs
from helpers.poprun_runner import PROGRAMS, assert_matches_oracle, load_results, run_poprun

ALL_CONFIGS = list(programs.CONFIGS)


@pytest.fixture(scope="module")
def two_instances(tmp_path_factory):
    out = tmp_path_factory.mktemp("two")
    # Buckets of 500 bytes: the small model's gradients go in two buckets, the first (last layer)
    # all-reduced while the backward of the first layer goes on.
    result = run_poprun("--num-instances", "2", "--num-replicas", "2", "--mpi-global-args", "--tag-output",
                        "python", PROGRAMS, "train", str(out), *ALL_CONFIGS, OPENPOP_ALLREDUCE_BUCKET_MB="0.0005")
    assert result.returncode == 0, result.stdout + result.stderr
    return result, load_results(out, 2)


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL_CONFIGS)
def test_two_instances_equal_one_process_with_all_replicas(two_instances, name):
    _, results = two_instances
    assert_matches_oracle(results, name, total_replicas=2, local_replicas=1)


def test_buckets_are_all_reduced_during_the_last_backward(two_instances):
    _, results = two_instances
    for r in results:
        # 2 buckets per step, 3 host calls x device iterations steps; the second bucket holds fc1.weight,
        # the last gradient of the backward, so it too starts from the hook.
        assert r["sgd_momentum_mean"]["overlapped_buckets"] == 2 * programs.STEPS * 2
        assert r["pipelined"]["overlapped_buckets"] == 2 * programs.STEPS


def test_automatic_loss_scaling_skips_the_same_step_everywhere(two_instances):
    _, results = two_instances
    # 1024 halved once: the overflow in instance 1's micro-batch made both instances skip.
    assert [r["als_skip"]["loss_scaling"] for r in results] == [512.0, 512.0]


def test_popdist_api_inside_poprun(two_instances):
    _, results = two_instances
    assert [r["api"] for r in results] == [
        {"instance": i, "instances": 2, "total": 2, "local": 1, "offset": i, "local_index": i,
         "env_set": True, "ipus": 1} for i in range(2)]
    assert [r["execute_on_instances"] for r in results] == [10, None]


def test_output_is_tagged_per_instance_and_stream(two_instances):
    run, _ = two_instances
    assert "[1,0]<stdout>:instance 0 done" in run.stdout.splitlines()
    assert "[1,1]<stdout>:instance 1 done" in run.stdout.splitlines()
    assert all(line.startswith(("[1,0]<stderr>:", "[1,1]<stderr>:")) or "POPRUN" in line
               for line in run.stderr.splitlines() if line)


def test_loader_shards_do_not_overlap_and_lose_nothing(two_instances):
    _, results = two_instances
    shards = [r["shards"] for r in results]
    for drop_last in (True, False):
        first, second = (shard[drop_last] for shard in shards)
        assert not set(first) & set(second)
        assert len(first) == len(set(first)) and len(second) == len(set(second))
    # drop_last: each instance a whole number of combined batches (2 x 1 replica): 2 * 9 of 37
    assert len(shards[0][True]) == len(shards[1][True]) == 18
    # without drop_last every element is read once
    assert sorted(shards[0][False] + shards[1][False]) == list(range(37))


def test_horovod_scripts_run_on_the_compatibility_layer(two_instances):
    _, results = two_instances
    for rank, r in enumerate(results):
        assert r["horovod"] == {"module": "horovod.torch", "rank": rank, "size": 2, "average": 0.5, "sum": 3.0,
                                "broadcast": 6.0, "params": [1.0, 1.0, 1.0]}


@pytest.mark.slow
def test_four_instances_equal_one_process_with_four_replicas(tmp_path):
    result = run_poprun("--num-instances", "4", "--num-replicas", "4", "python", PROGRAMS, "train",
                        str(tmp_path), "sgd_momentum_mean")
    assert result.returncode == 0, result.stdout + result.stderr
    assert_matches_oracle(load_results(tmp_path, 4), "sgd_momentum_mean", total_replicas=4, local_replicas=1)


def test_float16_overflow_in_one_instance_reruns_the_call_in_all(tmp_path):
    """Float16 overflow is watched per call (runtime/half_saturation.py): instance 1's loss
    overflows while the summed gradients stay finite, so both instances must agree to run the
    call again saturating (else instance 0 would go on to the next collective alone)."""
    import torch
    result = run_poprun("--num-instances", "2", "--num-replicas", "2", "python", PROGRAMS, "half-loss-overflow",
                        str(tmp_path), timeout=120, OPENPOP_COLLECTIVE_TIMEOUT="60")
    assert result.returncode == 0, result.stderr
    first, second = load_results(tmp_path, 2)
    assert first["saturating"] and second["saturating"]
    assert torch.equal(first["weights"], second["weights"])
    assert second["losses"].max() == 65504.0  # saturated, not inf (the losses are each instance's own)
