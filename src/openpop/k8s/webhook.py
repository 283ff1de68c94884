"""The admission rules of Kubeflow's validating webhooks, checked offline.

PyTorchJob (training-operator v1.9 ``pytorchjob_webhook.go``): the name is a DNS-1035 label;
replica types are only Master and Worker; every replica template has a container, every
container an image, one container named ``pytorch``; Master ``replicas`` is set and is 1;
Worker ``replicas`` is at least 1; an ``elasticPolicy`` needs a Worker spec and its
deprecated ``nProcPerNode`` cannot be combined with ``spec.nprocPerNode``.
openpop adds the checks the controller relies on: ``nprocPerNode`` is ``auto``, ``cpu``,
``gpu`` or a whole number, and ``restartPolicy`` is one of the four policies.

TrainJob (Trainer v2 webhooks): the name is a DNS-1035 label; ``numNodes`` is at least 1;
``numProcPerNode`` is a whole number or ``auto``/``cpu``/``gpu``; the trainer's env does not
set the variables the torch plugin reserves for torchrun.
"""

import re

from openpop.k8s import messages
from openpop.k8s.errors import ManifestError

_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")
_NPROC_WORDS = ("auto", "cpu", "gpu")
TORCHRUN_RESERVED_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK",
                         "PET_MASTER_ADDR", "PET_MASTER_PORT")


def check_dns1035_name(name, path="metadata.name"):
    if not name:
        raise ManifestError(path, messages.REQUIRED_FIELD_MISSING)
    if not isinstance(name, str) or len(name) > 63 or not _DNS_1035.match(name):
        raise ManifestError(path, messages.NOT_DNS_LABEL.format(name=name))


def replica_type(key):
    """The training operator's defaulting camel-cases replica keys (``master`` -> ``Master``)."""
    return key[:1].upper() + key[1:].lower() if isinstance(key, str) else key


def check_nproc(value, path):
    text = str(value)
    if isinstance(value, bool) or not (text in _NPROC_WORDS or re.fullmatch(r"[1-9][0-9]*", text)):
        raise ManifestError(path, messages.NPROC_PER_NODE.format(nproc_words=', '.join(_NPROC_WORDS), value=value))


def check_pytorchjob_rules(job):
    check_dns1035_name((job.get("metadata") or {}).get("name"))
    spec = job.get("spec") or {}
    replica_specs = spec.get("pytorchReplicaSpecs")
    if not replica_specs:
        raise ManifestError("spec.pytorchReplicaSpecs", messages.REQUIRED_FIELD_MISSING)
    for key, replica in replica_specs.items():
        path = f"spec.pytorchReplicaSpecs.{key}"
        if replica_type(key) not in ("Master", "Worker"):
            raise ManifestError(path, messages.REPLICA_TYPE.format(key=key))
        containers = ((replica.get("template") or {}).get("spec") or {}).get("containers") or []
        if not containers:
            raise ManifestError(f"{path}.template.spec.containers", messages.POD_TEMPLATE_WITHOUT_CONTAINER)
        for index, container in enumerate(containers):
            if not container.get("image"):
                raise ManifestError(f"{path}.template.spec.containers[{index}].image", messages.CONTAINER_IMAGE_MISSING)
        if not any(container.get("name") == "pytorch" for container in containers):
            raise ManifestError(f"{path}.template.spec.containers", messages.NO_PYTORCH_CONTAINER)
        replicas = replica.get("replicas")
        if replica_type(key) == "Master" and replicas != 1:
            raise ManifestError(f"{path}.replicas", messages.MASTER_REPLICAS.format(replicas=replicas))
        if replica_type(key) == "Worker" and replicas is not None and replicas < 1:
            raise ManifestError(f"{path}.replicas", messages.AT_LEAST_ONE.format(value=replicas))
        policy = replica.get("restartPolicy")
        if policy is not None and policy not in _RESTART_POLICIES:
            raise ManifestError(f"{path}.restartPolicy",
                                messages.RESTART_POLICY.format(restart_policies=', '.join(_RESTART_POLICIES),
                                                               policy=policy))
    if "nprocPerNode" in spec:
        check_nproc(spec["nprocPerNode"], "spec.nprocPerNode")
    elastic = spec.get("elasticPolicy")
    if elastic is not None:
        if not any(replica_type(key) == "Worker" for key in replica_specs):
            raise ManifestError("spec.elasticPolicy", messages.ELASTIC_POLICY_WITHOUT_WORKER)
        if elastic.get("nProcPerNode") is not None and spec.get("nprocPerNode") is not None:
            raise ManifestError("spec.elasticPolicy.nProcPerNode", messages.NPROC_PER_NODE_DEPRECATED)


def check_trainjob_rules(job):
    check_dns1035_name((job.get("metadata") or {}).get("name"))
    trainer = (job.get("spec") or {}).get("trainer") or {}
    nodes = trainer.get("numNodes")
    if nodes is not None and nodes < 1:
        raise ManifestError("spec.trainer.numNodes", messages.AT_LEAST_ONE.format(value=nodes))
    if "numProcPerNode" in trainer:
        check_nproc(trainer["numProcPerNode"], "spec.trainer.numProcPerNode")
    for index, env in enumerate(trainer.get("env") or []):
        if env.get("name") in TORCHRUN_RESERVED_ENV:
            raise ManifestError(f"spec.trainer.env[{index}].name",
                                messages.RESERVED_ENV_VAR.format(env=env['name']))
