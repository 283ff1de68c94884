"""openpop-k8s bad input: exit code 2, the offending field's path on stderr, nothing on stdout."""

import pytest

from helpers.k8s_cli import DATA, run_cli, write_manifest

SEED = (DATA / "seed_single_worker.ipujob.yaml").read_text()
POPRUN = (DATA / "poprun_two_instances.ipujob.yaml").read_text()

PYTORCHJOB = """\
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: good}
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template:
        spec:
          containers: [{name: pytorch, image: img:1, command: [python, -c, pass]}]
"""

TRAINJOB = """\
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata: {name: good}
spec:
  runtimeRef: {name: torch-distributed}
  trainer: {image: img:1, command: [python, -c, pass], numNodes: 1}
"""

CONVERT_CASES = {
    "not yaml": ("apiVersion: [unclosed\n", "not valid YAML"),
    "not a mapping": ("- a\n- b\n", "must be a mapping"),
    "unknown kind": (SEED.replace("kind: IPUJob", "kind: MPIJob"), "kind: openpop-k8s convert reads IPUJob"),
    "unknown apiVersion": (SEED.replace("graphcore.ai/v1alpha1", "graphcore.ai/v2"),
                           "apiVersion: an IPUJob has apiVersion"),
    "missing workers": (SEED.split("  workers:")[0], "spec.workers: required field is missing"),
    "ipus not a string": (SEED.replace('ipusPerJobInstance: "4"', "ipusPerJobInstance: 4"),
                          "spec.ipusPerJobInstance: must be a string"),
    "jobInstances not an integer": (SEED.replace("jobInstances: 1", "jobInstances: one"),
                                    "spec.jobInstances: must be an integer"),
    "unknown spec field": (SEED.replace("  jobInstances: 1", "  jobInstance: 1\n  jobInstances: 1"),
                           "spec.jobInstance: unknown field"),
    "image-less container": (SEED.replace("          image: graphcore/pytorch:3.3.0\n", ""),
                             "spec.workers.template.spec.containers[0].image: required field is missing"),
    "container without a name": (SEED.replace("- name: bert-training-multi-ipu\n          image",
                                              "- image"),
                                 "spec.workers.template.spec.containers[0].name: required field is missing"),
    "pod template type error": (SEED.replace("hostIPC: true", "hostIPC: [yes]"),
                                "spec.workers.template.spec.hostIPC: must be a boolean"),
    "unknown pod field": (SEED.replace("hostIPC: true", "hostIpc: true"),
                          "spec.workers.template.spec.hostIpc: unknown field"),
    "poprun replicas not divisible": (POPRUN.replace('--num-replicas, "2"', '--num-replicas, "3"'),
                                      "poprun --num-replicas 3 is not divisible by --num-instances 2"),
    "modelReplicasPerWorker disagrees": (POPRUN.replace('modelReplicasPerWorker: "2"', 'modelReplicasPerWorker: "4"'),
                                         "spec.modelReplicasPerWorker: 4 replicas per worker x 1 worker = 4 replicas"),
    "more IPUs than the partition": (POPRUN.replace('ipusPerJobInstance: "2"', 'ipusPerJobInstance: "1"'),
                                     "spec.ipusPerJobInstance: 1 IPU, but poprun runs --num-replicas 2 x "
                                     "--ipus-per-replica 1 = 2 IPUs"),
    "bad restart type": (SEED.replace("  jobInstances: 1", "  restartPolicy: {type: Sometimes}\n  jobInstances: 1"),
                         "spec.restartPolicy.type: must be one of"),
    "bad exit codes": (SEED.replace("  jobInstances: 1",
                                    "  restartPolicy: {type: ExitCode, exitCodes: '1-'}\n  jobInstances: 1"),
                       "spec.restartPolicy.exitCodes"),
    "unknown poprun option": (POPRUN.replace("--ipus-per-replica,", "--ipus-per-repl,"),
                              "unknown poprun option '--ipus-per-repl'"),
    "name not DNS-1035": (SEED.replace("generateName: bert-training-multi-ipu-", "name: Bert_Training"),
                          "metadata.name: 'Bert_Training' is not a DNS-1035 label"),
    "mpirun launcher": (SEED.replace("  jobInstances: 1",
                                     "  launcher: {command: [mpirun, -np, '2', python3, t.py]}\n  jobInstances: 1"),
                        "spec.launcher.command: an mpirun launcher needs Kubeflow's MPIJob"),
}


@pytest.mark.parametrize("case", sorted(CONVERT_CASES))
def test_convert_rejects_bad_input(case, tmp_path, capsys):
    text, expected = CONVERT_CASES[case]
    code, out, err = run_cli(capsys, "convert", write_manifest(tmp_path, text))
    assert code == 2
    assert out == ""
    assert expected in err, err
    assert err.startswith("openpop-k8s: error: ")


def test_pods_must_divide_the_instances(capsys):
    code, out, err = run_cli(capsys, "convert", DATA / "poprun_two_instances.ipujob.yaml", "--pods", 3)
    assert (code, out) == (2, "")
    assert "--pods: poprun --num-instances 2 cannot be divided evenly among 3 pods" in err


def test_error_in_second_document_names_the_document(tmp_path, capsys):
    text = SEED + "---\n" + SEED.replace('"4"', "4")
    code, out, err = run_cli(capsys, "convert", write_manifest(tmp_path, text))
    assert (code, out) == (2, "")
    assert "document 1: spec.ipusPerJobInstance: must be a string" in err


def test_missing_file(capsys):
    code, out, err = run_cli(capsys, "convert", "/nonexistent/job.yaml")
    assert (code, out) == (2, "") and "cannot read the file" in err


KUBEFLOW_CASES = {
    "master replicas": (PYTORCHJOB.replace("replicas: 1", "replicas: 2"),
                        "spec.pytorchReplicaSpecs.Master.replicas: must be 1"),
    "no pytorch container": (PYTORCHJOB.replace("name: pytorch", "name: trainer"),
                             "spec.pytorchReplicaSpecs.Master.template.spec.containers: "
                             "there must be a container named pytorch"),
    "replica type": (PYTORCHJOB.replace("Master:", "Chief:"), "replica type 'Chief' is not supported"),
    "replicas type": (PYTORCHJOB.replace("replicas: 1", "replicas: three"),
                      "spec.pytorchReplicaSpecs.Master.replicas: must be an integer"),
    "missing replica specs": (PYTORCHJOB.split("  pytorchReplicaSpecs")[0] + "  nprocPerNode: '1'\n",
                              "spec.pytorchReplicaSpecs: required field is missing"),
    "bad nproc": (PYTORCHJOB.replace("spec:\n  pytorch", "spec:\n  nprocPerNode: many\n  pytorch", 1),
                  "spec.nprocPerNode: must be a whole number"),
    "image-less pytorch": (PYTORCHJOB.replace(" image: img:1,", ""),
                           "containers[0].image: required field is missing"),
    "bad job name": (PYTORCHJOB.replace("name: good", "name: 9good"), "metadata.name: '9good' is not a DNS-1035 label"),
    "unknown kind": (PYTORCHJOB.replace("PyTorchJob", "TFJob"), "kind: unknown apiVersion/kind"),
    "unknown apiVersion": (PYTORCHJOB.replace("kubeflow.org/v1", "kubeflow.org/v2"),
                           "apiVersion: unknown apiVersion/kind"),
    "trainjob reserved env": (TRAINJOB.replace("numNodes: 1}", "numNodes: 1, env: [{name: PET_NNODES, value: '3'}]}"),
                              "spec.trainer.env[0].name: PET_NNODES is reserved"),
    "trainjob type": (TRAINJOB.replace("numNodes: 1", "numNodes: '1'"),
                      "spec.trainer.numNodes: input should be a valid integer"),
    "trainjob unknown field": (TRAINJOB.replace("numNodes: 1", "nodes: 1"), "spec.trainer.nodes: unknown field"),
    "trainjob runtimeRef": (TRAINJOB.replace("runtimeRef: {name: torch-distributed}",
                                             "runtimeRef: {kind: ClusterTrainingRuntime}"),
                            "spec.runtimeRef.name: required field is missing"),
}


@pytest.mark.parametrize("case", sorted(KUBEFLOW_CASES))
def test_validate_and_run_local_reject_bad_kubeflow_jobs(case, tmp_path, capsys):
    text, expected = KUBEFLOW_CASES[case]
    path = write_manifest(tmp_path, text)
    for command in ("validate", "run-local"):
        code, out, err = run_cli(capsys, command, path)
        assert (code, out) == (2, ""), (command, err)
        assert expected in err, (command, err)


def test_good_kubeflow_jobs_validate(tmp_path, capsys):
    for text in (PYTORCHJOB, TRAINJOB):
        assert run_cli(capsys, "validate", write_manifest(tmp_path, text))[0] == 0
