"""openpop-k8s run-local: Kubeflow jobs run here with the controller's environment,
one process group per pod; one pod failing fails the job and leaves no process behind."""

import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.k8s_cli import DATA, documents, run_cli, write_manifest
from helpers.processes import free_port, wait_gone

SRC = str(Path(__file__).resolve().parents[1] / "src")
PRINT_ENV = ("import json, os; names = ('PYTHONUNBUFFERED', 'MASTER_ADDR', 'MASTER_PORT', "
             "'WORLD_SIZE', 'RANK', 'HOSTNAME'); "
             "print('ENV ' + json.dumps({k: v for k, v in os.environ.items() "
             "if k in names or k.startswith('PET_')}, sort_keys=True))")


@pytest.fixture(autouse=True)
def _worktree_on_path(monkeypatch):
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", SRC + (os.pathsep + path if path else ""))
    for name in ("PYTHONUNBUFFERED", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"):
        monkeypatch.delenv(name, raising=False)  # only the controller's values, not the caller's


def pod_envs(out):
    envs = {}
    for line in out.splitlines():
        pod, _, text = line.partition(" | ")
        if text.startswith("ENV "):
            envs[pod.strip()] = json.loads(text[4:])
    return envs


def pytorchjob(name, pods, nproc, command):
    replica = {"restartPolicy": "Never", "template": {"spec": {"containers": [
        {"name": "pytorch", "image": "img:1", "command": command}]}}}
    specs = {"Master": dict(replica, replicas=1)}
    if pods > 1:
        specs["Worker"] = dict(replica, replicas=pods - 1)
    return json.dumps({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                       "metadata": {"name": name},
                       "spec": {"nprocPerNode": str(nproc), "pytorchReplicaSpecs": specs}})


def test_two_pods_get_exactly_the_pytorchjob_controller_env(tmp_path, capsys):
    code, out, err = run_cli(capsys, "render", "--image", "img:1", "--name", "envtest",
                             "--pods", 2, "--", sys.executable, "-c", PRINT_ENV)
    manifest = write_manifest(tmp_path, out)
    port = free_port()
    code, out, err = run_cli(capsys, "run-local", manifest, "--master-port", port)
    assert code == 0, err
    common = {"PYTHONUNBUFFERED": "1", "MASTER_ADDR": "127.0.0.1", "PET_MASTER_ADDR": "127.0.0.1",
              "MASTER_PORT": str(port), "PET_MASTER_PORT": str(port), "WORLD_SIZE": "2",
              "PET_NNODES": "2", "PET_NPROC_PER_NODE": "1"}
    assert pod_envs(out) == {
        "envtest-master-0": dict(common, RANK="0", PET_NODE_RANK="0", HOSTNAME="envtest-master-0"),
        "envtest-worker-0": dict(common, RANK="1", PET_NODE_RANK="1", HOSTNAME="envtest-worker-0"),
    }
    assert "all 2 pods succeeded" in err


def test_one_pod_two_processes_env_and_job_port_default(tmp_path, capsys):
    manifest = write_manifest(tmp_path, pytorchjob("one", 1, 2, [sys.executable, "-c", PRINT_ENV]))
    code, out, err = run_cli(capsys, "run-local", manifest)
    assert code == 0, err
    assert pod_envs(out) == {"one-master-0": {
        "PYTHONUNBUFFERED": "1", "MASTER_ADDR": "127.0.0.1", "PET_MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "23456", "PET_MASTER_PORT": "23456", "WORLD_SIZE": "2", "RANK": "0",
        "PET_NODE_RANK": "0", "PET_NNODES": "1", "PET_NPROC_PER_NODE": "2", "HOSTNAME": "one-master-0"}}


def test_trainjob_nodes_get_the_trainer_torch_plugin_env(tmp_path, capsys):
    code, out, err = run_cli(capsys, "render", "--image", "img:1", "--name", "tj", "--to",
                             "trainjob", "--pods", 2, "--", sys.executable, "-c", PRINT_ENV)
    code, out, err = run_cli(capsys, "run-local", write_manifest(tmp_path, out))
    assert code == 0, err
    common = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_MASTER_ADDR": "127.0.0.1",
              "PET_MASTER_PORT": "29400"}
    assert pod_envs(out) == {
        "tj-node-0-0": dict(common, PET_NODE_RANK="0", HOSTNAME="tj-node-0-0"),
        "tj-node-0-1": dict(common, PET_NODE_RANK="1", HOSTNAME="tj-node-0-1"),
    }


def test_container_env_and_kubernetes_references(tmp_path, capsys):
    job = json.loads(pytorchjob("refs", 1, 1, [sys.executable, "-c",
                                               "import os; print('ENV ' + os.environ['GREETING'])",
                                               "$(GREETING)", "$$(GREETING)"]))
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    container["command"][2] = ("import json, os, sys; print('ENV ' + json.dumps("
                               "{'argv': sys.argv[1:], 'G': os.environ['GREETING'], 'POD': os.environ['POD'], "
                               "'RANK': os.environ['RANK']}))")
    container["env"] = [{"name": "GREETING", "value": "hello"}, {"name": "RANK", "value": "7"},
                        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    code, out, err = run_cli(capsys, "run-local", write_manifest(tmp_path, json.dumps(job)))
    assert code == 0, err
    # $(VAR) expands, $$ escapes, and the controller's RANK wins over the container's.
    assert pod_envs(out)["refs-master-0"] == {"argv": ["hello", "$(GREETING)"], "G": "hello",
                                              "POD": "refs-master-0", "RANK": "0"}


TORCHRUN_SCRIPT = """\
import json, os, torch, torch.distributed as dist
dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
env = {"rank": str(dist.get_rank()), "world": str(dist.get_world_size()), "local": os.environ["LOCAL_RANK"],
       "sum": f"{value.item():.0f}"}
print("ENV " + json.dumps(env), flush=True)
dist.destroy_process_group()
"""


# Across pods (the rendezvous goes through the injected master address and port); the
# 1 pod x 2 processes layout's env is checked above without paying for two more torch imports.
@pytest.mark.slow
@pytest.mark.parametrize("pods, nproc", [(2, 1)])
def test_bare_torchrun_in_the_pods_rendezvous_with_the_injected_env(pods, nproc, tmp_path, capsys,
                                                                    monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    script = tmp_path / "allreduce.py"
    script.write_text(TORCHRUN_SCRIPT)
    manifest = write_manifest(tmp_path, pytorchjob(
        "ddp", pods, nproc, [sys.executable, "-m", "torch.distributed.run", str(script)]))
    code, out, err = run_cli(capsys, "run-local", manifest, "--master-port", free_port())
    assert code == 0, out + err
    results = [json.loads(line.split(" | ", 1)[1].split("ENV ", 1)[1])
               for line in out.splitlines() if " | " in line and "ENV " in line]
    assert sorted(r["rank"] for r in results) == ["0", "1"]
    assert {r["world"] for r in results} == {"2"} and {r["sum"] for r in results} == {"3"}
    assert sorted(r["local"] for r in results) == (["0", "0"] if nproc == 1 else ["0", "1"])


def _sleeper_job(tmp_path, worker_exit=None):
    """Master and worker each start a grandchild and write both pids; the worker may exit."""
    code = (
        "import os, subprocess, sys, time, pathlib; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
        f"pathlib.Path(r'{tmp_path}', os.environ['HOSTNAME']).write_text(f'{{os.getpid()}} {{child.pid}}'); "
        f"rank = int(os.environ['RANK']); exit_code = {worker_exit!r}; "
        "time.sleep(1.0); "
        "sys.exit(exit_code) if rank == 1 and exit_code is not None else time.sleep(120)"
    )
    return write_manifest(tmp_path, pytorchjob("sleepers", 2, 1, [sys.executable, "-c", code]))


def _wait_for(path, timeout=120):
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.1)
    return [int(pid) for pid in path.read_text().split()]


def test_a_failing_pod_fails_the_job_and_stops_the_others(tmp_path, capsys):
    manifest = _sleeper_job(tmp_path, worker_exit=3)
    started = time.monotonic()
    code, _out, err = run_cli(capsys, "run-local", manifest, "--master-port", free_port())
    assert code == 1
    assert "pod sleepers-worker-0 exited with code 3: the job failed" in err
    assert time.monotonic() - started < 100  # not the master's 120 s sleep
    pids = _wait_for(tmp_path / "sleepers-master-0") + _wait_for(tmp_path / "sleepers-worker-0")
    assert wait_gone(pids, 5.0) == []  # SIGKILL to a group is delivered asynchronously


@pytest.mark.slow
def test_killing_one_pods_process_fails_the_whole_job_without_orphans(tmp_path):
    manifest = _sleeper_job(tmp_path)
    run = subprocess.Popen([sys.executable, "-m", "openpop.k8s", "run-local", str(manifest),
                            "--master-port", str(free_port())],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        worker_pid, _ = _wait_for(tmp_path / "sleepers-worker-0")
        master_pids = _wait_for(tmp_path / "sleepers-master-0")
        os.kill(worker_pid, signal.SIGKILL)
        _out, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 1
    assert "pod sleepers-worker-0 was killed by SIGKILL: the job failed" in err
    pids = master_pids + _wait_for(tmp_path / "sleepers-worker-0")
    assert wait_gone(pids, 5.0) == []  # SIGKILL to a group is delivered asynchronously


BERT = "openpop-bert --config cpu_tiny_128 --training-steps 4"


@pytest.mark.slow
def test_seed_single_worker_manifest_trains_with_run_local(tmp_path, capsys):
    code, out, err = run_cli(capsys, "convert", DATA / "seed_single_worker.ipujob.yaml")
    manifest = write_manifest(tmp_path, out)
    code, out, err = run_cli(capsys, "run-local", manifest, "--command", BERT,
                             "--master-port", free_port())
    assert code == 0, out + err
    assert "bert-training-multi-ipu-master-0 | Step: 3 / 3" in out
    assert "training_steps: 4" in out
    assert f"every pod runs --command {BERT!r}" in err


def _poprun_module():
    for name in ("openpop.distributed.poprun", "openpop.poprun", "poprun"):
        try:
            if importlib.util.find_spec(name) is not None:
                return name
        except ModuleNotFoundError:
            continue
    return None


@pytest.mark.slow
@pytest.mark.skipif(_poprun_module() is None, reason="openpop's poprun is not importable yet")
@pytest.mark.parametrize("pods", [2, 1])
def test_poprun_manifest_trains_with_run_local(pods, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    code, out, err = run_cli(capsys, "convert", DATA / "poprun_two_instances.ipujob.yaml",
                             "--pods", pods)
    job = documents(out)[0]
    command = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"]
    local = shlex.join([sys.executable, "-m", _poprun_module(), *command[1:]])
    code, out, err = run_cli(capsys, "run-local", write_manifest(tmp_path, out), "--command",
                             local, "--master-port", free_port())
    assert code == 0, out + err
    assert "training_steps: 4" in out


def _stoppable_job(tmp_path, name="stopped"):
    """Master and worker each start a child in their process group and one in a session of its own
    (as poprun's agent starts its instances), write the three pids, and wait."""
    code = (
        "import os, subprocess, sys, time, pathlib; "
        "sleep = [sys.executable, '-c', 'import time; time.sleep(120)']; "
        "child = subprocess.Popen(sleep); detached = subprocess.Popen(sleep, start_new_session=True); "
        f"pathlib.Path(r'{tmp_path}', os.environ['HOSTNAME'] + '.tmp').write_text("
        "f'{os.getpid()} {child.pid} {detached.pid}'); "
        f"pathlib.Path(r'{tmp_path}', os.environ['HOSTNAME'] + '.tmp').rename("
        f"pathlib.Path(r'{tmp_path}', os.environ['HOSTNAME'])); "
        "time.sleep(120)"
    )
    return write_manifest(tmp_path, pytorchjob(name, 2, 1, [sys.executable, "-c", code]))


@pytest.mark.parametrize("target", ["worker pod", "run-local"])
def test_sigterm_stops_the_job_with_143_and_leaves_nothing(target, tmp_path):
    """SIGTERM is how Kubernetes stops a pod: to one pod (its main process, as the kubelet sends it) or
    to openpop-k8s itself, every pod stops, the exit status is 143 and no process is left."""
    manifest = _stoppable_job(tmp_path)
    run = subprocess.Popen([sys.executable, "-m", "openpop.k8s", "run-local", str(manifest),
                            "--master-port", str(free_port())],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        worker = _wait_for(tmp_path / "stopped-worker-0")
        master = _wait_for(tmp_path / "stopped-master-0")
        os.kill(worker[0] if target == "worker pod" else run.pid, signal.SIGTERM)
        _out, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 128 + signal.SIGTERM, err
    if target == "worker pod":
        assert ("openpop-k8s: pod stopped-worker-0 was killed by SIGTERM (how Kubernetes stops a pod): every pod "
                "was stopped") in err.splitlines()
    else:
        assert "openpop-k8s: received SIGTERM: all pods stopped" in err.splitlines()
    assert wait_gone(worker + master, 5.0) == []  # the detached children too


@pytest.mark.slow
@pytest.mark.skipif(_poprun_module() is None, reason="openpop's poprun is not importable yet")
def test_sigterm_to_a_poprun_pod_stops_the_job_with_143_and_leaves_nothing(tmp_path, monkeypatch):
    """The pods of a converted IPUJob run poprun: SIGTERM to one pod's poprun stops its instances,
    that pod exits 143, the other pod (poprun and instance) is stopped and nothing is left."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    programs = str(Path(__file__).resolve().parent / "helpers" / "poprun_programs.py")
    manifest = write_manifest(tmp_path, pytorchjob("pr", 2, 1, [
        sys.executable, "-m", _poprun_module(), "--num-instances", "2", "--num-replicas", "2",
        sys.executable, programs, "sleep", "300"]))
    run = subprocess.Popen([sys.executable, "-m", "openpop.k8s", "run-local", str(manifest),
                            "--master-port", str(free_port())],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        instances = {}  # pod -> instance pid, from the instances' "pid N" lines
        while len(instances) < 2:
            line = run.stdout.readline()
            assert line, "run-local ended early: " + run.stderr.read()
            pod, _, text = line.partition(" | ")
            if "<stdout>:pid " in text:
                instances[pod.strip()] = int(text.rsplit(" ", 1)[1])
        poprun = {pod: int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
                  for pod, pid in instances.items()}  # an instance's parent is its pod's poprun
        os.kill(poprun["pr-worker-0"], signal.SIGTERM)
        _out, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 128 + signal.SIGTERM, err
    assert ("openpop-k8s: pod pr-worker-0 exited with code 143 after a SIGTERM (how Kubernetes stops a pod): "
            "every pod was stopped") in err.splitlines()
    assert wait_gone(list(instances.values()) + list(poprun.values()), 5.0) == []


SETUP_COMMANDS = [
    ("apt update ; apt upgrade -y", "installs system packages"),
    ("sudo apt-get -y install git", "installs system packages"),
    ("pip3 install -r requirements.txt", "installs Python packages"),
    ("python3 -m pip install openpop", "installs Python packages"),
    ("git clone https://github.com/graphcore/examples.git", "clones a repository"),
    ("curl -fsSL https://example.com/install.sh | sh", "pipes a download into a shell"),
]


@pytest.mark.parametrize(("line", "what"), SETUP_COMMANDS)
def test_a_pod_command_that_sets_up_the_machine_needs_command_or_allow_pod_commands(line, what, tmp_path,
                                                                                      capsys):
    """run-local runs on the user's machine, not in a container: a pod command that installs packages or
    clones repositories is refused (exit 2, nothing started) with the two ways on; each runs it."""
    marker = tmp_path / "ran"
    manifest = write_manifest(tmp_path, pytorchjob("setup", 1, 1, ["/bin/sh", "-c", f"{line}; touch {marker}"]))
    code, out, err = run_cli(capsys, "run-local", manifest, "--master-port", free_port())
    assert code == 2 and out == ""
    assert f"openpop-k8s: error: pod setup-master-0: its command {what}" in err
    assert "--command" in err and "--allow-pod-commands" in err and "--dry-run" in err
    assert not marker.exists()
    code, out, err = run_cli(capsys, "run-local", manifest, "--command", f"touch {marker}",
                             "--master-port", free_port())
    assert code == 0, err
    assert marker.exists()


def test_allow_pod_commands_runs_the_command_as_written(tmp_path, capsys):
    marker = tmp_path / "ran"
    manifest = write_manifest(tmp_path, pytorchjob("setup", 1, 1, [
        "/bin/sh", "-c", f"echo pip install is only printed here; touch {marker}"]))
    assert run_cli(capsys, "run-local", manifest, "--master-port", free_port())[0] == 2
    code, _out, err = run_cli(capsys, "run-local", manifest, "--allow-pod-commands", "--master-port", free_port())
    assert code == 0, err
    assert marker.exists()


def test_training_commands_are_not_mistaken_for_setup():
    from openpop.k8s.run_local import setup_steps
    assert setup_steps(["poprun", "--num-instances", "2", "openpop-bert", "--config", "cpu_tiny_128"]) == []
    assert setup_steps(["/bin/bash", "-c", "cd app; python train.py --pipeline-install-dir x"]) == []


def test_dry_run_prints_each_pods_command_and_environment_and_runs_nothing(tmp_path, capsys):
    code, out, err = run_cli(capsys, "convert", DATA / "seed_single_worker.ipujob.yaml")
    manifest = write_manifest(tmp_path, out)
    code, out, err = run_cli(capsys, "run-local", manifest, "--dry-run", "--master-port", 41234)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "# pod bert-training-multi-ipu-master-0"
    assert lines[1].startswith("env ") and "MASTER_ADDR=127.0.0.1 MASTER_PORT=41234" in lines[1]
    assert "git clone https://github.com/graphcore/examples.git" in out
    assert ("note: pod bert-training-multi-ipu-master-0: its command clones a repository, installs system "
            "packages and installs Python packages: running it needs --command or --allow-pod-commands") in err
    assert err.rstrip().endswith("openpop-k8s: dry run: nothing was started")
    marker = tmp_path / "ran"
    code, out, err = run_cli(capsys, "run-local", manifest, "--dry-run", "--command", f"touch {marker}")
    assert code == 0 and out.splitlines()[1].endswith(f"touch {marker}")
    assert not marker.exists()
