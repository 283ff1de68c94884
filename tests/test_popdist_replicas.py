"""popdist as PopTorch expects it: ``popdist.poptorch.Options(ipus_per_replica=2)`` in a plain
process (PopTorch's own popdist tests run so), ``checkNumIpusPerReplica`` binding only under
poprun, and under poprun a replica count that is poprun's ``--num-replicas`` or an error, never a
different number of replicas."""
import copy

import pytest
import torch

import popdist
import popdist.popart
import popdist.poptorch
import poptorch
from openpop.distributed import instance

from helpers.poprun_runner import PROGRAMS, run_poprun

POPRUN_VARIABLES = (instance.TOTAL_REPLICAS, instance.LOCAL_REPLICAS, instance.IPUS_PER_REPLICA,
                    instance.REPLICA_OFFSET, instance.LOCAL_INSTANCE_INDEX, instance.UNIFORM_REPLICAS)
REPLICAS_MESSAGE = (r"poprun was started with --num-replicas 4 over 2 instance\(s\), 2 replica\(s\) each, but this "
                    r"model's options give replicationFactor\(1\) in each of Options.Distributed.numProcesses=2 "
                    r"process\(es\): 2 replicas. Use popdist.poptorch.Options\(\), which takes the replication factor "
                    r"from poprun \(with Lightning: Trainer\(devices=2\)\), set replicationFactor\(2\), or start "
                    r"poprun with --num-replicas 2.")


@pytest.fixture
def no_poprun(monkeypatch):
    for name in (*POPRUN_VARIABLES, "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "MASTER_ADDR", "MASTER_PORT",
                 "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def as_instance_1_of_2(monkeypatch):
    """What poprun --num-instances 2 --num-replicas 4 gives instance 1 (with mpirun's variables)."""
    for name, value in {instance.TOTAL_REPLICAS: "4", instance.LOCAL_REPLICAS: "2", instance.IPUS_PER_REPLICA: "1",
                        instance.REPLICA_OFFSET: "2", instance.LOCAL_INSTANCE_INDEX: "1",
                        instance.UNIFORM_REPLICAS: "1", "OMPI_COMM_WORLD_SIZE": "2",
                        "OMPI_COMM_WORLD_RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


class Summed(torch.nn.Linear):
    def forward(self, x):
        return poptorch.identity_loss(super().forward(x).sum(), reduction="sum")


# ------------------------------------------------------------------------------ outside poprun
def test_popdist_options_with_ipus_per_replica_in_a_plain_process(no_poprun):
    opts = popdist.poptorch.Options(ipus_per_replica=2)
    assert (opts.Distributed.processId, opts.Distributed.numProcesses, opts.replication_factor) == (0, 1, 1)
    assert popdist.isPopdistEnvSet() is False
    assert (popdist.getInstanceIndex(), popdist.getNumInstances(), popdist.getReplicaIndexOffset()) == (0, 1, 0)
    assert (popdist.getNumLocalReplicas(), popdist.getNumTotalReplicas(), popdist.getLocalInstanceIndex()) == (1, 1, 0)
    assert popdist.getNumIpusPerReplica() == 1  # documented default: poprun did not say
    assert all(popdist.checkNumIpusPerReplica(n) for n in (1, 2, 4, 16))
    assert popdist.getDeviceId(2) == 0 and popdist.popart.getNumIpus(2) == 2
    with pytest.raises(RuntimeError, match=r"^Cannot call `replicationFactor` with popdist\.poptorch\.Options$"):
        opts.replicationFactor(1)


def test_popdist_options_in_a_plain_process_train_like_the_oracle(no_poprun):
    model = Summed(4, 1)
    reference = copy.deepcopy(model)
    opts = popdist.poptorch.Options(ipus_per_replica=2)
    training = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1))
    x = torch.randn(3, 4)
    training(x)
    training.destroy()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    reference(x).backward()
    optimizer.step()
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs)


# ------------------------------------------------------------------ in a poprun instance's environment
def test_ipus_per_replica_still_binds_under_poprun(as_instance_1_of_2):
    assert popdist.checkNumIpusPerReplica(1) and not popdist.checkNumIpusPerReplica(2)
    with pytest.raises(RuntimeError, match="--ipus-per-replica 1"):
        popdist.poptorch.Options(ipus_per_replica=2)


@pytest.mark.parametrize("kind", ["training", "inference"])
def test_plain_options_whose_replicas_do_not_add_up_fail_before_the_first_call(as_instance_1_of_2, kind):
    model = Summed(4, 1)
    before = [p.detach().clone() for p in model.parameters()]
    opts = poptorch.Options().replicationFactor(1)
    assert opts.Distributed.numProcesses == 2  # read from mpirun's variables, as PopTorch does
    if kind == "training":
        executor = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1))
    else:
        executor = poptorch.inferenceModel(model, opts)
    with pytest.raises(poptorch.Error, match=REPLICAS_MESSAGE):
        executor(torch.ones(2, 4))
    assert not executor.isCompiled()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_replicas_that_add_up_run(as_instance_1_of_2):
    model = torch.nn.Linear(4, 1)
    for opts in (poptorch.Options().replicationFactor(2), popdist.poptorch.Options()):
        out = poptorch.inferenceModel(model, opts)(torch.ones(4, 4))
        torch.testing.assert_close(out, model(torch.ones(4, 4)))


def test_a_process_that_left_the_job_is_not_held_to_it(as_instance_1_of_2):
    model = torch.nn.Linear(4, 1)
    opts = poptorch.Options().replicationFactor(1)
    opts.Distributed.disable()
    torch.testing.assert_close(poptorch.inferenceModel(model, opts)(torch.ones(2, 4)), model(torch.ones(2, 4)))


# ------------------------------------------------------------------------------ under poprun
@pytest.mark.slow
def test_under_poprun_a_script_never_runs_a_different_replica_count():
    mismatched = run_poprun("--num-instances", "2", "--num-replicas", "4", "python", PROGRAMS, "replicas", "1")
    assert mismatched.returncode != 0
    assert "this model's options give replicationFactor(1) in each of Options.Distributed.numProcesses=2" \
        in mismatched.stderr
    for rank in (0, 1):
        assert f"[1,{rank}]<stdout>:instance {rank}: 1 replicas, weights unchanged" in mismatched.stdout.splitlines()

    # popdist.poptorch.Options: replicationFactor is poprun's; changing it is PopTorch's RuntimeError.
    fixed = run_poprun("--num-instances", "2", "--num-replicas", "4", "python", PROGRAMS, "replicas", "popdist")
    assert fixed.returncode == 0, fixed.stderr
    lines = fixed.stdout.splitlines()
    for rank in (0, 1):
        assert f"[1,{rank}]<stdout>:instance {rank}: Cannot call `replicationFactor` with popdist.poptorch.Options" \
            in lines
        assert f"[1,{rank}]<stdout>:instance {rank}: 2 replicas, weights trained" in lines
