"""openpop-k8s convert/render: the IPUJob -> PyTorchJob / TrainJob field mapping (golden files
under tests/data/k8s; OPENPOP_UPDATE_GOLDEN=1 rewrites them after a reviewed change)."""


import pytest
import yaml

from openpop.k8s.sdk_models import check_pod_template
from openpop.k8s.validation import validate_kubeflow_job

from helpers.k8s_cli import DATA, UPDATE_GOLDEN, documents, run_cli, write_manifest

GOLDEN_CASES = {
    "seed_single_worker.pytorchjob": ("seed_single_worker", ["--to", "pytorchjob"]),
    "seed_single_worker.trainjob": ("seed_single_worker", ["--to", "trainjob"]),
    "seed_poprun.pytorchjob": ("seed_poprun", ["--to", "pytorchjob", "--device", "gpu",
                                               "--image", "ghcr.io/example/openpop:0.1"]),
    "seed_poprun.trainjob": ("seed_poprun", ["--to", "trainjob", "--device", "gpu",
                                             "--image", "ghcr.io/example/openpop:0.1"]),
    "all_fields.pytorchjob": ("all_fields", ["--to", "pytorchjob"]),
    "all_fields.trainjob": ("all_fields", ["--to", "trainjob", "--device", "gpu"]),
}


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_golden_mapping(case, capsys):
    source, options = GOLDEN_CASES[case]
    code, out, err = run_cli(capsys, "convert", DATA / f"{source}.ipujob.yaml", *options)
    assert code == 0, err
    golden_yaml, golden_err = DATA / f"{case}.yaml", DATA / f"{case}.stderr"
    if UPDATE_GOLDEN:
        golden_yaml.write_text(out)
        golden_err.write_text(err)
    assert out == golden_yaml.read_text()
    assert err == golden_err.read_text()
    for manifest in documents(out):
        validate_kubeflow_job(manifest)


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_converting_twice_gives_identical_output(case, capsys):
    source, options = GOLDEN_CASES[case]
    first = run_cli(capsys, "convert", DATA / f"{source}.ipujob.yaml", *options)
    second = run_cli(capsys, "convert", DATA / f"{source}.ipujob.yaml", *options)
    assert first == second


def _pod_specs(manifest):
    if manifest["kind"] == "PyTorchJob":
        return [replica["template"]["spec"] for replica in manifest["spec"]["pytorchReplicaSpecs"].values()]
    patches = manifest["spec"].get("runtimePatches") or []
    return [job["template"]["spec"]["template"].get("spec", {})
            for patch in patches
            for job in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]]


@pytest.mark.parametrize("target", ["pytorchjob", "trainjob"])
def test_no_privileges_in_output_and_a_warning_per_removed_field(target, capsys):
    code, out, err = run_cli(capsys, "convert", DATA / "all_fields.ipujob.yaml", "--to", target)
    assert code == 0
    text = yaml.safe_dump(documents(out))
    for word in ("privileged", "hostNetwork", "hostIPC", "hostPID", "IPC_LOCK", "ClusterFirstWithHostNet"):
        assert word not in text
    warnings = [line for line in err.splitlines() if ": warning: " in line]
    for field in ("spec.hostNetwork", "spec.hostPID", "spec.dnsPolicy",
                  "containers[0].securityContext.privileged",
                  "containers[0].securityContext.capabilities.add"):
        assert any(field in line for line in warnings), field
    assert any("SYS_PTRACE" in yaml.safe_dump(spec) for spec in _pod_specs(documents(out)[0]))


def test_seed_hostipc_and_ipc_lock_removed_with_warnings_and_kept_on_request(capsys):
    code, out, err = run_cli(capsys, "convert", DATA / "seed_single_worker.ipujob.yaml")
    assert "hostIPC" not in out and "IPC_LOCK" not in out
    assert "warning: spec.workers.template.spec.hostIPC" in err
    assert "removed IPC_LOCK" in err
    code, out, err = run_cli(capsys, "convert", DATA / "seed_single_worker.ipujob.yaml",
                             "--keep-ipc-lock")
    assert code == 0 and "IPC_LOCK" in out and "removed IPC_LOCK" not in err
    assert "hostIPC" not in out


def test_dev_shm_volume_is_kept(capsys):
    _code, out, _err = run_cli(capsys, "convert", DATA / "seed_single_worker.ipujob.yaml")
    master = documents(out)[0]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert master["volumes"] == [{"emptyDir": {"medium": "Memory", "sizeLimit": "10Gi"}, "name": "devshm"}]
    assert master["containers"][0]["volumeMounts"] == [{"mountPath": "/dev/shm", "name": "devshm"}]


@pytest.mark.parametrize("pods, master, workers, nproc", [(2, 1, 1, 1), (1, 1, 0, 2)])
def test_poprun_instances_become_pods_or_processes_per_pod(pods, master, workers, nproc, capsys):
    code, out, err = run_cli(capsys, "convert", DATA / "poprun_two_instances.ipujob.yaml",
                             "--pods", pods)
    assert code == 0, err
    spec = documents(out)[0]["spec"]
    assert spec["nprocPerNode"] == str(nproc)
    assert spec["pytorchReplicaSpecs"]["Master"]["replicas"] == master
    assert spec["pytorchReplicaSpecs"].get("Worker", {}).get("replicas", 0) == workers
    command = spec["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"]
    assert command[:7] == ["poprun", "--num-instances", "2", "--num-replicas", "2",
                           "--ipus-per-replica", "1"]
    code, out, err = run_cli(capsys, "convert", DATA / "poprun_two_instances.ipujob.yaml",
                             "--pods", pods, "--to", "trainjob")
    trainer = documents(out)[0]["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (pods, nproc)


def test_gpu_device_requests_gpus_per_pod(capsys):
    _code, out, _err = run_cli(capsys, "convert", DATA / "poprun_two_instances.ipujob.yaml",
                               "--pods", 2, "--device", "gpu")
    container = documents(out)[0]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    _code, out, _err = run_cli(capsys, "convert", DATA / "poprun_two_instances.ipujob.yaml",
                             "--device", "gpu", "--gpus-per-pod", 4)
    container = documents(out)[0]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"


def test_poprun_found_in_shell_script_with_continuations_and_env_prefix():
    from openpop.k8s.poprun_command import find_poprun
    script = ("cd /w ; pip install -r r.txt ;\nOMPI_ALLOW_RUN_AS_ROOT=1 \\\n poprun \\\n --vv "
              "--num-instances 2 \\\n --num-replicas=8 --print-topology=yes --only-output-from-instance 0 "
              "--mpi-global-args=\"--tag-output --x\" \\\n python3 train.py --epochs 1 && echo done")
    launch = find_poprun(["/bin/bash", "-c", "--"], [script], "x")
    assert (launch.num_instances, launch.num_replicas, launch.ipus_per_replica) == (2, 8, 1)
    assert launch.program == ("python3", "train.py", "--epochs", "1")
    assert ("--mpi-global-args", "--tag-output --x") in launch.options
    assert find_poprun(["python3", "train.py"], None, "x") is None


def test_render_poprun_command_line(capsys):
    code, out, err = run_cli(capsys, "render", "--image", "ghcr.io/example/openpop:0.1",
                             "--name", "bert", "--pods", 2, "--to", "pytorchjob", "--",
                             "poprun", "--num-instances", 4, "--num-replicas", 4,
                             "openpop-bert", "--config", "cpu_tiny_128")
    assert code == 0, err
    job = documents(out)[0]
    validate_kubeflow_job(job)
    assert job["spec"]["nprocPerNode"] == "2"
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    pod = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    check_pod_template(pod, "template")
    assert pod["spec"]["containers"][0]["command"][0] == "poprun"
    assert pod["spec"]["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]


def test_render_topology_flags_wrap_the_command_in_poprun(capsys):
    code, out, err = run_cli(capsys, "render", "--image", "img:1", "--name", "bert", "--to",
                             "trainjob", "--num-instances", 2, "--num-replicas", 2,
                             "--device", "gpu", "--", "openpop-bert", "--config", "cpu_tiny_128")
    assert code == 0, err
    trainer = documents(out)[0]["spec"]["trainer"]
    assert trainer["command"] == ["poprun", "--num-instances", "2", "--num-replicas", "2",
                                  "openpop-bert", "--config", "cpu_tiny_128"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (1, 2)
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "2"


def test_render_plain_command_runs_once_per_pod(capsys):
    _code, out, _err = run_cli(capsys, "render", "--image", "img:1", "--name", "bert", "--",
                             "openpop-bert", "--config", "cpu_tiny_128")
    spec = documents(out)[0]["spec"]
    assert spec["nprocPerNode"] == "1" and "Worker" not in spec["pytorchReplicaSpecs"]


def test_validate_accepts_ipujob_and_converted_manifests(tmp_path, capsys):
    code, out, err = run_cli(capsys, "convert", DATA / "seed_poprun.ipujob.yaml", "--to", "trainjob")
    path = write_manifest(tmp_path, out)
    assert run_cli(capsys, "validate", path)[0] == 0
    code, out, err = run_cli(capsys, "validate", DATA / "seed_poprun.ipujob.yaml")
    assert code == 0 and "valid: document 0: IPUJob bert-poprun-64ipus-" in err


def test_a_graphcore_image_is_warned_about_unless_replaced(capsys):
    code, _, err = run_cli(capsys, "convert", DATA / "seed_single_worker.ipujob.yaml")
    assert code == 0
    assert ("containers[0].image: 'graphcore/pytorch:3.3.0' is Graphcore's image for IPUs: it has no openpop"
            in err) and "--image IMAGE" in err
    code, out, err = run_cli(capsys, "convert", DATA / "seed_single_worker.ipujob.yaml", "--image", "me/openpop:1")
    assert code == 0 and "Graphcore's image" not in err and "me/openpop:1" in out
