"""The target-independent description of a Kubeflow training job.

The converter (from an IPUJob) and the renderer (from a command line) both produce a
:class:`JobPlan`; the PyTorchJob and TrainJob writers turn one into a manifest.
"""

from dataclasses import dataclass, field
from typing import Optional

from openpop.k8s import messages
from openpop.k8s.errors import ManifestError

# A node with more than this many GPUs is rare: a pod asking for more is never scheduled.
MAX_GPUS_PER_POD = 8


@dataclass(frozen=True)
class PodLayout:
    """``pods`` pods (Kubeflow replicas / nodes), each running ``procs_per_pod`` processes."""
    pods: int
    procs_per_pod: int

    @property
    def processes(self):
        return self.pods * self.procs_per_pod


@dataclass(frozen=True)
class JobPlan:
    name: str
    layout: PodLayout
    pod_template: dict        # core/v1 PodTemplateSpec; containers[0] is the training container
    source_path: str          # where the pod template came from, for report lines
    namespace: Optional[str] = None
    labels: dict = field(default_factory=dict)
    annotations: dict = field(default_factory=dict)
    restart_policy: str = "Never"
    backoff_limit: Optional[int] = None
    clean_pod_policy: Optional[str] = None
    active_deadline_seconds: Optional[int] = None

    @property
    def container(self):
        return self.pod_template["spec"]["containers"][0]


def split_instances(instances, pods, path):
    """``instances`` poprun instances spread evenly over ``pods`` pods."""
    if pods < 1:
        raise ManifestError(path, messages.PODS_TOO_FEW.format(pods=pods))
    if instances % pods:
        raise ManifestError(path, messages.INSTANCES_NOT_DIVISIBLE_BY_PODS.format(instances=instances, pods=pods))
    return PodLayout(pods, instances // pods)


def device_resources(container, device, ipus_per_pod, gpus_per_pod, report, path):
    """Put the pod's share of IPUs into the container's resources.

    ``--device gpu``: ``nvidia.com/gpu`` limit (``gpus_per_pod``, by default one GPU per IPU
    capped at :data:`MAX_GPUS_PER_POD`; openpop maps the virtual IPUs onto the GPUs the pod
    gets). ``--device cpu``: a CPU request of one core per IPU, never above the container's
    own CPU limit; a CPU request the container already states is kept.
    """
    resources = container.setdefault("resources", {})
    if device == "gpu":
        count = gpus_per_pod if gpus_per_pod is not None else min(ipus_per_pod, MAX_GPUS_PER_POD)
        resources.setdefault("limits", {})["nvidia.com/gpu"] = str(count)
        capped = "" if gpus_per_pod is not None or count == ipus_per_pod else \
            f" (capped at {MAX_GPUS_PER_POD}: the {ipus_per_pod} virtual IPUs share them; --gpus-per-pod N to choose)"
        report.mapped(path, f"{messages.counted(ipus_per_pod, 'IPU')} per pod -> resources.limits nvidia.com/gpu: "
                            f"{count}{capped}")
        return
    requests = resources.setdefault("requests", {})
    if "cpu" in requests:
        report.mapped(path, f"{messages.counted(ipus_per_pod, 'IPU')} per pod -> the container's own "
                            f"resources.requests cpu: {requests['cpu']} (kept)")
        return
    count = ipus_per_pod
    limit = (resources.get("limits") or {}).get("cpu")
    note = ""
    if limit is not None and _cpu_cores(limit) < count:
        count, note = limit, " (the container's CPU limit)"
    requests["cpu"] = str(count)
    report.mapped(path, f"{messages.counted(ipus_per_pod, 'IPU')} per pod -> resources.requests cpu: {count}{note}")


def _cpu_cores(quantity):
    text = str(quantity)
    if text.endswith("m"):
        return float(text[:-1]) / 1000
    return float(text)
