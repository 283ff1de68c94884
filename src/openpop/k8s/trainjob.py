"""Writing a :class:`JobPlan` as a Kubeflow Trainer v2 ``TrainJob`` (``trainer.kubeflow.org/v1alpha1``).

The job runs on the ``torch-distributed`` ClusterTrainingRuntime that Kubeflow Trainer
installs (``--runtime`` names another). The training container becomes ``spec.trainer``
(image, command, args, env, ``resourcesPerNode``; ``numNodes`` = pods, ``numProcPerNode`` =
processes per pod). Pod-level settings the trainer cannot hold (volumes, the container's
volume mounts and security context, node selector, tolerations, ...) go into a
``runtimePatches`` entry (manager ``openpop-k8s``) on the runtime's ``node`` job and
container. Everything else is named on stderr: a TrainJob has no per-job restart policy,
pod clean-up policy or backoff limit (those belong to the runtime), and no sidecars.
"""

import copy

API_VERSION = "trainer.kubeflow.org/v1alpha1"
KIND = "TrainJob"
DEFAULT_RUNTIME = "torch-distributed"
NODE = "node"               # the runtime's replicated job and container name
PATCH_MANAGER = "openpop-k8s"
MASTER_PORT = 29400         # the port the Trainer's torch plugin gives PET_MASTER_PORT

_TRAINER_FIELDS = {"image": "image", "command": "command", "args": "args", "env": "env",
                   "resources": "resourcesPerNode"}
_CONTAINER_PATCH_FIELDS = ("volumeMounts", "securityContext")
_POD_PATCH_FIELDS = ("affinity", "imagePullSecrets", "nodeSelector", "schedulingGates",
                     "securityContext", "serviceAccountName", "terminationGracePeriodSeconds",
                     "tolerations", "volumes")


def write_trainjob(plan, report, runtime=DEFAULT_RUNTIME):
    template = copy.deepcopy(plan.pod_template)
    spec = template.get("spec") or {}
    container = spec["containers"][0]
    container_path = f"{plan.source_path}.spec.containers[0]"

    trainer = {}
    for key, target in _TRAINER_FIELDS.items():
        if container.get(key):
            trainer[target] = container[key]
    trainer["numNodes"] = plan.layout.pods
    trainer["numProcPerNode"] = plan.layout.procs_per_pod

    container_patch = {"name": NODE}
    for key in _CONTAINER_PATCH_FIELDS:
        if container.get(key):
            container_patch[key] = container[key]
    handled = set(_TRAINER_FIELDS) | set(_CONTAINER_PATCH_FIELDS) | {"name"}
    for key in container:
        if key not in handled:
            report.dropped(f"{container_path}.{key}",
                           "a TrainJob's trainer has no such field (the runtime's container sets it)")

    pod_patch = {}
    for key in _POD_PATCH_FIELDS:
        if spec.get(key):
            pod_patch[key] = spec[key]
    if len(container_patch) > 1:
        pod_patch["containers"] = [container_patch]
    for index in range(1, len(spec["containers"])):
        report.dropped(f"{plan.source_path}.spec.containers[{index}]",
                       "a TrainJob runs one trainer container per node: this container is not carried over")
    for key in spec:
        if key not in _POD_PATCH_FIELDS and key != "containers":
            report.dropped(f"{plan.source_path}.spec.{key}",
                           "a TrainJob cannot patch this pod field of its runtime")

    pod_template_patch = {}
    template_metadata = template.get("metadata") or {}
    for key in template_metadata:
        if key in ("labels", "annotations"):
            pod_template_patch.setdefault("metadata", {})[key] = template_metadata[key]
        else:
            report.dropped(f"{plan.source_path}.metadata.{key}",
                           "only labels and annotations of a TrainJob's pods can be patched")
    if pod_patch:
        pod_template_patch["spec"] = pod_patch

    job_spec = {"runtimeRef": {"name": runtime}, "trainer": trainer}
    if plan.active_deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = plan.active_deadline_seconds
    if pod_template_patch:
        job_spec["runtimePatches"] = [{
            "manager": PATCH_MANAGER,
            "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [{
                "name": NODE,
                "template": {"spec": {"template": pod_template_patch}},
            }]}}},
        }]
    metadata = {"name": plan.name}
    if plan.namespace:
        metadata["namespace"] = plan.namespace
    if plan.labels:
        metadata["labels"] = dict(plan.labels)
    if plan.annotations:
        metadata["annotations"] = dict(plan.annotations)
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": job_spec}
