"""Graphcore's ``IPUJob`` (``graphcore.ai/v1alpha1``): the model and its CRD's validation.

The rules are those of the CRD shipped with IPU Operator 1.2.0 (types, required fields,
enums, defaults); the worker pod template is checked with the ``kubernetes`` client's
models. Unknown fields are errors (the API server would prune them silently; here a typo
should not vanish). The status is written by the operator and is ignored on input.
"""

import re
from dataclasses import dataclass
from typing import Optional

from openpop.k8s import messages
from openpop.k8s.errors import ManifestError, join_path
from openpop.k8s.sdk_models import check_object_meta, check_pod_template

API_VERSION = "graphcore.ai/v1alpha1"
KIND = "IPUJob"

_SPEC_FIELDS = ("jobInstances", "ipusPerJobInstance", "workers", "launcher",
                "modelReplicasPerWorker", "workersPerJobInstance", "interactive",
                "cleanPodPolicy", "restartPolicy")
_CLEAN_POD_POLICIES = ("None", "All", "Workers")
_RESTART_TYPES = ("Always", "OnFailure", "Never", "ExitCode")
_EXIT_CODES = re.compile(r"^([0-9]+(-[0-9]+)?)(,([0-9]+(-[0-9]+)?))*$")


@dataclass(frozen=True)
class RestartPolicy:
    type: str
    back_off_limit: int = 3
    exit_codes: Optional[str] = None


@dataclass(frozen=True)
class IPUJob:
    metadata: dict
    job_instances: int
    ipus_per_job_instance: int
    worker_replicas: int
    worker_template: dict
    worker_strategy: Optional[dict] = None
    launcher_command: Optional[list] = None
    launcher_env: Optional[list] = None
    model_replicas_per_worker: Optional[int] = None
    workers_per_job_instance: Optional[int] = None
    interactive_ttl: Optional[int] = None
    clean_pod_policy: Optional[str] = None
    restart_policy: Optional[RestartPolicy] = None
    has_status: bool = False  # written by the operator; ignored on input

    @property
    def name_prefix(self):
        return self.metadata.get("name") or self.metadata.get("generateName")


def is_ipujob(document):
    return document.get("kind") == KIND


def _integer(value, path, minimum=None):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ManifestError(path, messages.NOT_INTEGER.format(value=value))
    if minimum is not None and value < minimum:
        raise ManifestError(path, messages.TOO_SMALL.format(minimum=minimum, value=value))
    return value


def _numeric_string(value, path):
    """The CRD types these counts as strings (``ipusPerJobInstance: "4"``)."""
    if not isinstance(value, str):
        raise ManifestError(path, messages.IPUJOB_STRING.format(value=value, value_type=type(value).__name__))
    if not re.fullmatch(r"[0-9]+", value.strip()) or int(value) < 1:
        raise ManifestError(path, messages.NOT_POSITIVE_WHOLE_NUMBER.format(value=value))
    return int(value)


def _object(value, path):
    if not isinstance(value, dict):
        raise ManifestError(path, messages.NOT_OBJECT.format(value_type=type(value).__name__))
    return value


def _known_fields(mapping, allowed, path):
    for key in mapping:
        if key not in allowed:
            raise ManifestError(join_path(path, key),
                                messages.UNKNOWN_IPUJOB_FIELD.format(allowed=', '.join(allowed)))


def parse_ipujob(document):
    """Validate one IPUJob document against the CRD and return its :class:`IPUJob`."""

    if document.get("apiVersion") != API_VERSION:
        raise ManifestError("apiVersion", messages.IPUJOB_API_VERSION.format(api_version=API_VERSION,
                                                                             got=document.get('apiVersion')))
    _known_fields(document, ("apiVersion", "kind", "metadata", "spec", "status"), "")
    metadata = _object(document.get("metadata") or {}, "metadata")
    check_object_meta(metadata, "metadata")
    if not metadata.get("name") and not metadata.get("generateName"):
        raise ManifestError("metadata.name", messages.IPUJOB_NAME_MISSING)
    if "spec" not in document:
        raise ManifestError("spec", messages.REQUIRED_FIELD_MISSING)
    spec = _object(document["spec"], "spec")
    _known_fields(spec, _SPEC_FIELDS, "spec")
    for required in ("jobInstances", "ipusPerJobInstance", "workers"):
        if required not in spec:
            raise ManifestError(f"spec.{required}", messages.REQUIRED_FIELD_MISSING)
    job_instances = _integer(spec["jobInstances"], "spec.jobInstances", minimum=1)
    ipus = _numeric_string(spec["ipusPerJobInstance"], "spec.ipusPerJobInstance")

    workers = _object(spec["workers"], "spec.workers")
    _known_fields(workers, ("replicas", "template", "strategy"), "spec.workers")
    replicas = _integer(workers.get("replicas", 1), "spec.workers.replicas", minimum=1)
    if "template" not in workers:
        raise ManifestError("spec.workers.template", messages.REQUIRED_FIELD_MISSING)
    template = _object(workers["template"], "spec.workers.template")
    check_pod_template(template, "spec.workers.template")
    containers = (template.get("spec") or {}).get("containers")
    if not containers:
        raise ManifestError("spec.workers.template.spec.containers", messages.WORKER_POD_WITHOUT_CONTAINER)
    for index, container in enumerate(containers):
        if not container.get("image"):
            raise ManifestError(f"spec.workers.template.spec.containers[{index}].image",
                                messages.CONTAINER_IMAGE_MISSING)
    strategy = workers.get("strategy")
    if strategy is not None:
        _object(strategy, "spec.workers.strategy")
        kind = strategy.get("type", "RollingUpdate")
        if kind not in ("Recreate", "RollingUpdate"):
            raise ManifestError("spec.workers.strategy.type",
                                messages.WORKER_STRATEGY.format(kind=kind))

    launcher_command = launcher_env = None
    if "launcher" in spec:
        launcher = _object(spec["launcher"], "spec.launcher")
        _known_fields(launcher, ("command", "env"), "spec.launcher")
        if "command" not in launcher:
            raise ManifestError("spec.launcher.command", messages.REQUIRED_FIELD_MISSING)
        launcher_command = launcher["command"]
        if not isinstance(launcher_command, list) or not all(isinstance(a, str) for a in launcher_command):
            raise ManifestError("spec.launcher.command", messages.NOT_STRING_ARRAY)
        launcher_env = launcher.get("env") or []
        if not isinstance(launcher_env, list):
            raise ManifestError("spec.launcher.env", messages.NOT_ENV_VAR_ARRAY)
        for index, env in enumerate(launcher_env):
            if not isinstance(env, dict) or not env.get("name"):
                raise ManifestError(f"spec.launcher.env[{index}].name", messages.REQUIRED_FIELD_MISSING)

    model_replicas = workers_per_instance = None
    if "modelReplicasPerWorker" in spec:
        model_replicas = _numeric_string(spec["modelReplicasPerWorker"], "spec.modelReplicasPerWorker")
    if "workersPerJobInstance" in spec:
        workers_per_instance = _numeric_string(spec["workersPerJobInstance"], "spec.workersPerJobInstance")

    ttl = None
    if "interactive" in spec:
        interactive = _object(spec["interactive"], "spec.interactive")
        _known_fields(interactive, ("ttl",), "spec.interactive")
        if "ttl" not in interactive:
            raise ManifestError("spec.interactive.ttl", messages.REQUIRED_FIELD_MISSING)
        ttl = _integer(interactive["ttl"], "spec.interactive.ttl", minimum=0)

    clean = spec.get("cleanPodPolicy")
    if clean is not None and clean not in _CLEAN_POD_POLICIES:
        raise ManifestError("spec.cleanPodPolicy",
                            messages.CLEAN_POD_POLICY.format(clean_pod_policies=', '.join(_CLEAN_POD_POLICIES),
                                                             clean=clean))

    restart = None
    if "restartPolicy" in spec:
        policy = _object(spec["restartPolicy"], "spec.restartPolicy")
        _known_fields(policy, ("type", "backOffLimit", "exitCodes"), "spec.restartPolicy")
        if "type" not in policy:
            raise ManifestError("spec.restartPolicy.type", messages.REQUIRED_FIELD_MISSING)
        if policy["type"] not in _RESTART_TYPES:
            raise ManifestError("spec.restartPolicy.type",
                                messages.RESTART_POLICY_TYPE.format(restart_types=', '.join(_RESTART_TYPES),
                                                                    policy=policy['type']))
        limit = _integer(policy.get("backOffLimit", 3), "spec.restartPolicy.backOffLimit", minimum=0)
        codes = policy.get("exitCodes")
        if codes is not None and (not isinstance(codes, str) or not _EXIT_CODES.match(codes)):
            raise ManifestError("spec.restartPolicy.exitCodes",
                                messages.EXIT_CODES.format(codes=codes))
        restart = RestartPolicy(policy["type"], limit, codes)

    return IPUJob(metadata=metadata, job_instances=job_instances, ipus_per_job_instance=ipus,
                  worker_replicas=replicas, worker_template=template, worker_strategy=strategy,
                  launcher_command=launcher_command, launcher_env=launcher_env,
                  model_replicas_per_worker=model_replicas,
                  workers_per_job_instance=workers_per_instance, interactive_ttl=ttl,
                  clean_pod_policy=clean, restart_policy=restart,
                  has_status="status" in document)
