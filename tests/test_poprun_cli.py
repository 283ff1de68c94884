"""poprun's command line: topology table, flags, validation (in process: nothing is launched
unless a test says so), and the per-instance environment."""
import json

import pytest

from openpop.distributed import instance, poprun
from openpop.distributed.topology import topology_table

from helpers.poprun_runner import run_poprun

TWO_INSTANCES_EIGHT_REPLICAS = """\
 ===========================================
|              poprun topology              |
|===========================================|
| hosts     |           localhost           |
|-----------|-------------------------------|
| ILDs      |               0               |
|-----------|-------------------------------|
| instances |       0       |       1       |
|-----------|-------------------------------|
| replicas  | 0 | 1 | 2 | 3 | 4 | 5 | 6 | 7 |
 -------------------------------------------
"""

ONE_INSTANCE_FOUR_REPLICAS = """\
 ===========================
|      poprun topology      |
|===========================|
| hosts     | gc-poplar-02  |
|-----------|---------------|
| ILDs      |       0       |
|-----------|---------------|
| instances |       0       |
|-----------|---------------|
| replicas  | 0 | 1 | 2 | 3 |
 ---------------------------
"""


def test_topology_tables_match_graphcores_byte_for_byte():
    assert topology_table(["localhost"], 2, 8) == TWO_INSTANCES_EIGHT_REPLICAS
    assert topology_table(["gc-poplar-02"], 1, 4) == ONE_INSTANCE_FOUR_REPLICAS


def test_topology_cells_widen_for_long_names_and_two_digit_replicas():
    table = topology_table(["a-very-long-host-name"], 1, 1)
    assert "| hosts     | a-very-long-host-name |" in table
    assert "| replicas  |           0           |" in table
    assert "| 0  | 1  |" in topology_table(["h"], 2, 16)


def test_print_topology_then_run(tmp_path):
    # One real launch: flags of IPU-era command lines are accepted, the table comes first, -x is
    # honoured, other mpirun arguments and V-IPU flags are reported as having no effect, and
    # --only-output-from-instance hides the other instances' output.
    result = run_poprun("--print-topology=yes", "--num-instances", "2", "--num-replicas", "8",
                        "--mpi-global-args", "--tag-output", "--mpi-local-args=-x POPRUN_TEST=forwarded --mca a b",
                        "--vipu-server-host", "10.1.3.101", "--executable-cache-path", str(tmp_path),
                        "--only-output-from-instance", "1",
                        "python", "-c", "import os; print(os.environ['POPRUN_TEST'], os.environ['POPTORCH_CACHE_DIR'],"
                                        " os.environ['POPDIST_REPLICA_INDEX_OFFSET'])",
                        "--not-a-poprun-flag")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(TWO_INSTANCES_EIGHT_REPLICAS)
    assert result.stdout[len(TWO_INSTANCES_EIGHT_REPLICAS):].splitlines() == [f"[1,1]<stdout>:forwarded {tmp_path} 4"]
    assert "POPRUN [W] --vipu-server-host has no effect: openpop has no V-IPU server" in result.stderr
    assert "not MPI): --mca a b" in result.stderr


def _usage_error(capsys, *argv):
    assert poprun.main(list(argv)) == poprun.USAGE_ERROR
    return capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--num-instances", "2", "--num-replicas", "3", "python"],
     "--num-replicas (3) must be divisible by --num-instances (2)"),
    (["--num-replicas", "0", "python"], "expected a positive integer, got '0'"),
    (["--num-instances", "2", "--num-replicas", "2", "--only-output-from-instance", "2", "python"],
     "--only-output-from-instance 2 is not an instance: instances are 0 to 1"),
    (["--host", "no-such-host.invalid,localhost", "python"], "host 'no-such-host.invalid' is unreachable"),
    (["--host", "localhost", "--hostfile", "hosts.txt", "python"], "mutually exclusive"),
    (["--num-instances", "3", "--num-replicas", "3", "--host", "127.0.0.1,127.0.0.2", "python"],
     "--num-instances (3) must be divisible by the number of hosts (2)"),
    (["--num-replicas", "2"], "no program given"),
    (["--print-topology=maybe", "python"], "expected yes/no or 1/0, got 'maybe'"),
])
def test_bad_command_lines_are_usage_errors(capsys, argv, message):
    assert message in _usage_error(capsys, *argv)


def test_kubeflow_pod_with_inconsistent_nproc_per_node(capsys, monkeypatch):
    monkeypatch.setenv("PET_NNODES", "2")
    monkeypatch.setenv("PET_MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("PET_MASTER_PORT", "23456")
    monkeypatch.setenv("PET_NPROC_PER_NODE", "2")
    err = _usage_error(capsys, "--num-instances", "2", "--num-replicas", "2", "python")
    assert "PET_NPROC_PER_NODE is 2: make nprocPerNode match" in err


def test_option_values_may_start_with_dashes():
    parser = poprun.build_parser()
    argv = poprun.normalise_argv(["--mpi-global-args", "--tag-output", "--num-instances", "2", "python",
                                  "train.py", "--num-instances", "9"], parser)
    args = parser.parse_args(argv)
    assert args.mpi_global_args == "--tag-output" and args.num_instances == 2
    assert args.program == "python" and args.program_args == ["train.py", "--num-instances", "9"]


def test_hosts_expand_like_poprun():
    assert poprun.expand_hosts("host[0-2,4]") == ["host0", "host1", "host2", "host4"]
    assert poprun.expand_hosts("a,b") == ["a", "b"]
    assert poprun.expand_hosts("node[08-10],x") == ["node08", "node09", "node10", "x"]


def test_export_then_import_config(tmp_path, capsys):
    path = tmp_path / "poprun.json"
    assert poprun.main(["--export-config", str(path), "--num-instances", "2", "--num-replicas", "4"]) == 0
    assert json.loads(path.read_text())["num_replicas"] == 4
    assert "exists: pass --overwrite-config=yes" in _usage_error(capsys, "--export-config", str(path))
    parser = poprun.build_parser()
    poprun._import_config(parser, ["--import-config", str(path)])
    args = parser.parse_args(poprun.normalise_argv(["--num-instances", "1", "python"], parser))
    assert (args.num_replicas, args.num_instances) == (4, 1)  # the command line wins


def test_version(capsys):
    assert poprun.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("poprun (openpop ")


def test_instance_environment_splits_gpus_and_threads():
    base = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
            instance.LOCAL_REPLICAS: "2", instance.IPUS_PER_REPLICA: "2"}
    cpu = instance.instance_environment({**base, instance.HOST_GPUS: "0"}, cpu_count=8)
    assert cpu[instance.REPLICA_OFFSET] == "6" and cpu[instance.LOCAL_INSTANCE_INDEX] == "1"
    assert cpu["OMP_NUM_THREADS"] == "4" and cpu[instance.DIST_BACKEND] == "gloo"
    assert instance.DEVICE_MAP not in cpu
    gpu = instance.instance_environment({**base, instance.HOST_GPUS: "4"}, cpu_count=8)
    assert gpu[instance.DEVICE_MAP] == "cuda:2,cuda:3,cuda:2,cuda:3"  # 2 replicas x 2 IPUs on GPUs 2, 3
    assert gpu[instance.DIST_BACKEND] == "cpu:gloo,cuda:nccl"
    shared = instance.instance_environment({**base, instance.HOST_GPUS: "1"}, cpu_count=1)
    assert shared[instance.DEVICE_MAP] == "cuda:0,cuda:0,cuda:0,cuda:0" and shared[instance.DIST_BACKEND] == "gloo"
    assert shared["OMP_NUM_THREADS"] == "1"
    user_threads = instance.instance_environment({**base, "OMP_NUM_THREADS": "7"}, 8)
    assert "OMP_NUM_THREADS" not in user_threads and user_threads["MKL_NUM_THREADS"] == "7"
