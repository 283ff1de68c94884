"""Writing a :class:`JobPlan` as a Kubeflow training-operator ``PyTorchJob`` (``kubeflow.org/v1``).

Pods: a ``Master`` replica (exactly one, as the validating webhook requires; its presence
makes the controller inject ``MASTER_ADDR``/``WORLD_SIZE``/``RANK``) and ``pods - 1``
``Worker`` replicas, all from the same pod template. ``spec.nprocPerNode`` is the number of
processes each pod's command starts (poprun instances per pod), so the controller's
``WORLD_SIZE`` is the total number of instances and ``PET_NPROC_PER_NODE`` is set.
The training container is named ``pytorch`` (the webhook requires one of that name; the
controller reads its ``pytorchjob-port``, 23456 when absent).
"""

import copy

API_VERSION = "kubeflow.org/v1"
KIND = "PyTorchJob"
CONTAINER_NAME = "pytorch"
DEFAULT_PORT = 23456
PORT_NAME = "pytorchjob-port"


def _metadata(plan):
    metadata = {"name": plan.name}
    if plan.namespace:
        metadata["namespace"] = plan.namespace
    if plan.labels:
        metadata["labels"] = dict(plan.labels)
    if plan.annotations:
        metadata["annotations"] = dict(plan.annotations)
    return metadata


def _replica(plan, replicas, template):
    return {"replicas": replicas, "restartPolicy": plan.restart_policy,
            "template": copy.deepcopy(template)}


def write_pytorchjob(plan, report):
    template = copy.deepcopy(plan.pod_template)
    container = template["spec"]["containers"][0]
    if container.get("name") != CONTAINER_NAME:
        report.mapped(f"{plan.source_path}.spec.containers[0].name",
                      f"{container.get('name')!r} -> {CONTAINER_NAME!r} (the training "
                      f"operator's container name)")
        container["name"] = CONTAINER_NAME
    run_policy = {"cleanPodPolicy": plan.clean_pod_policy or "None"}
    if plan.backoff_limit is not None:
        run_policy["backoffLimit"] = plan.backoff_limit
    if plan.active_deadline_seconds is not None:
        run_policy["activeDeadlineSeconds"] = plan.active_deadline_seconds
    replica_specs = {"Master": _replica(plan, 1, template)}
    if plan.layout.pods > 1:
        replica_specs["Worker"] = _replica(plan, plan.layout.pods - 1, template)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": _metadata(plan),
        "spec": {
            "nprocPerNode": str(plan.layout.procs_per_pod),
            "runPolicy": run_policy,
            "pytorchReplicaSpecs": replica_specs,
        },
    }
