"""Two "hosts" on loopback meet through torchrun's c10d rendezvous: one started with --host,
the other as a Kubeflow PyTorchJob pod would start it (PET_* / MASTER_* environment)."""
import subprocess

import pytest

from helpers.poprun_runner import PROGRAMS, assert_matches_oracle, environment, load_results, poprun_command
from helpers.processes import free_port


@pytest.mark.slow
def test_two_hosts_on_loopback_train_like_one_process(tmp_path):
    port = free_port()
    program = ["python", PROGRAMS, "train", str(tmp_path), "sgd_momentum_mean"]
    topology = ["--num-instances", "2", "--num-replicas", "4"]
    with_hosts = subprocess.Popen(
        poprun_command("--host", "127.0.0.1,127.0.0.2", "--rendezvous-port", str(port), *topology, *program),
        env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # The environment the Kubeflow training operator injects into the second pod of a PyTorchJob.
    kubeflow = environment(PET_NNODES="2", PET_NPROC_PER_NODE="1", PET_NODE_RANK="1", PET_MASTER_ADDR="127.0.0.1",
                           PET_MASTER_PORT=str(port), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                           WORLD_SIZE="2", RANK="1")
    in_pod = subprocess.Popen(poprun_command(*topology, *program), env=kubeflow,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    outputs = [process.communicate(timeout=300) for process in (with_hosts, in_pod)]
    assert [with_hosts.returncode, in_pod.returncode] == [0, 0], outputs
    # 2 instances x 2 local replicas == one process with replicationFactor(4)
    assert_matches_oracle(load_results(tmp_path, 2), "sgd_momentum_mean", total_replicas=4, local_replicas=2)
