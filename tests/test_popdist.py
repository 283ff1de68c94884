"""popdist outside poprun (PopDist's documented defaults), popdist.poptorch.Options, and the
errors of a multi-process run that was not launched as one."""
import os
import subprocess
import sys

import pytest
import torch

import popdist
import popdist.poptorch
import poptorch
from openpop.distributed import instance

from helpers.poprun_runner import SRC
from helpers.processes import free_port


@pytest.fixture
def no_poprun(monkeypatch):
    for name in (instance.TOTAL_REPLICAS, instance.LOCAL_REPLICAS, instance.IPUS_PER_REPLICA, instance.REPLICA_OFFSET,
                 instance.LOCAL_INSTANCE_INDEX, "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "MASTER_ADDR",
                 "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def as_instance_1_of_2(monkeypatch):
    """The environment poprun gives instance 1 of --num-instances 2 --num-replicas 4 --ipus-per-replica 2."""
    for name, value in {instance.TOTAL_REPLICAS: "4", instance.LOCAL_REPLICAS: "2", instance.IPUS_PER_REPLICA: "2",
                        instance.REPLICA_OFFSET: "2", instance.LOCAL_INSTANCE_INDEX: "1",
                        instance.UNIFORM_REPLICAS: "1"}.items():
        monkeypatch.setenv(name, value)
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def test_defaults_outside_poprun(no_poprun):
    assert popdist.isPopdistEnvSet() is False
    assert (popdist.getNumTotalReplicas(), popdist.getNumLocalReplicas(), popdist.getNumIpusPerReplica()) == (1, 1, 1)
    assert (popdist.getReplicaIndexOffset(), popdist.getLocalInstanceIndex()) == (0, 0)
    assert (popdist.getNumInstances(), popdist.getInstanceIndex(), popdist.getDeviceId()) == (1, 0, 0)
    assert popdist.checkNumIpusPerReplica(1) and popdist.checkNumIpusPerReplica(2)  # poprun did not say
    popdist.init()  # harmless: no process group outside poprun
    assert popdist.isBackendInitialized() is False
    assert popdist.execute_on_instances({0}, lambda a, b: a + b, 1, b=2) == 3
    assert popdist.execute_on_instances({1}, lambda: 1) is None
    opts = popdist.poptorch.Options()
    assert (opts.Distributed.processId, opts.Distributed.numProcesses, opts.replication_factor) == (0, 1, 1)


def test_getters_read_poprun_environment(as_instance_1_of_2):
    assert popdist.isPopdistEnvSet() is True
    assert (popdist.getNumTotalReplicas(), popdist.getNumLocalReplicas(), popdist.getNumIpusPerReplica()) == (4, 2, 2)
    assert (popdist.getNumInstances(), popdist.getInstanceIndex(), popdist.getLocalInstanceIndex()) == (2, 1, 1)
    opts = popdist.poptorch.Options(ipus_per_replica=2)
    assert (opts.Distributed.processId, opts.Distributed.numProcesses, opts.replication_factor) == (1, 2, 2)
    clone = opts.clone()
    assert type(clone) is popdist.poptorch.Options and clone.Distributed.numProcesses == 2


@pytest.mark.parametrize("call, name", [
    (lambda o: o.useIpuId(1), "useIpuId"),
    (lambda o: o.replicationFactor(1), "replicationFactor"),
    (lambda o: o.Distributed.disable(), "disable"),
    (lambda o: o.Distributed.setEnvVarNames("A", "B"), "setEnvVarNames"),
    (lambda o: o.Distributed.configureProcessId(1, 2), "configureProcessId"),
])
def test_popdist_options_reject_what_poptorch_rejected(no_poprun, call, name):
    opts = popdist.poptorch.Options()
    with pytest.raises(RuntimeError, match=f"^Cannot call `{name}` with popdist.poptorch.Options$"):
        call(opts)
    with pytest.raises(RuntimeError, match=f"^Cannot call `{name}` with popdist.poptorch.Options$"):
        call(opts.clone())


def test_ipus_per_replica_must_match_poprun(as_instance_1_of_2):
    with pytest.raises(RuntimeError, match=r"asks for 1 IPU per replica but poprun was started with "
                                           r"--ipus-per-replica 2: pass the same number to both"):
        popdist.poptorch.Options(ipus_per_replica=1)
    with pytest.raises(RuntimeError, match="--ipus-per-replica 2"):
        popdist.getDeviceId(4)


def test_several_processes_need_a_launcher(no_poprun):
    class WithLoss(torch.nn.Linear):
        def forward(self, x):
            return poptorch.identity_loss(super().forward(x).sum(), reduction="sum")

    model = WithLoss(2, 1)
    opts = poptorch.Options()
    opts.Distributed.configureProcessId(0, 2)
    training = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1))
    before = model.weight.detach().clone()
    with pytest.raises(poptorch.Error, match=r"numProcesses is 2 but this process was not started by poprun "
                                             r"\(or torchrun\): launch it with `poprun --num-instances 2 \.\.\.`"):
        training(torch.ones(4, 2))
    assert torch.equal(model.weight, before)


EXIT_CHECK = """
import atexit, os
def gloo_threads_left():  # registered first: runs after the handlers popdist.init() registers
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    print("gloo threads at exit:", sorted(n for n in names if "gloo" in n))
atexit.register(gloo_threads_left)
import popdist, torch, torch.distributed as dist
popdist.init()
dist.all_reduce(torch.ones(2))
import torch.distributed.nn.functional  # torch._dynamo imports it (trainingModel) after init: it binds group.WORLD
raise SystemExit(3)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads the threads from /proc")
def test_the_process_group_is_gone_before_the_interpreter_finalizes(no_poprun):
    """gloo's threads must be joined while Python is whole: an instance whose threads outlive its
    exit handlers may abort at exit ("terminate called without an active exception", status 134)."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
               PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", EXIT_CHECK], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 3, result.stderr
    assert "gloo threads at exit: []" in result.stdout, result.stdout + result.stderr
