"""``openpop-k8s render``: a Kubeflow job for the command line a user runs locally.

``render -- poprun --num-instances 2 --num-replicas 4 openpop-bert ...`` keeps the poprun
launch as the pods' command and spreads its instances over ``--pods`` pods;
``render --num-instances 2 --num-replicas 4 -- openpop-bert ...`` (poprun's own topology
flags) writes the same job, the pods' command being that poprun launch; a command without
poprun runs once per pod. The pod gets the image (``--image``, required), the device's
resources (one GPU or one CPU per IPU the pod's instances use) and a memory-backed
``/dev/shm`` (PyTorch's data-loader workers share tensors through it; a container's default
is 64 MiB).
"""

from openpop.k8s import messages
from openpop.k8s.errors import ManifestError
from openpop.k8s.job_plan import JobPlan, PodLayout, device_resources, split_instances
from openpop.k8s.poprun_command import find_poprun
from openpop.k8s.webhook import check_dns1035_name

SHM_VOLUME = "dshm"


def render_command(argv, topology):
    """``argv``, wrapped in ``poprun <topology flags>`` when flags are given."""
    flags = [word for option, value in topology.items() if value is not None
             for word in (option, str(value))]
    if not flags:
        return list(argv)
    if argv and argv[0].rsplit("/", 1)[-1] == "poprun":
        raise ManifestError("--num-instances", messages.RENDER_POPRUN_TOPOLOGY)
    return ["poprun", *flags, *argv]


def plan_from_command(argv, options, report, topology=None):
    if not argv:
        raise ManifestError("command", messages.RENDER_NO_COMMAND)
    if not options.image:
        raise ManifestError("--image", messages.RENDER_NO_IMAGE)
    if not options.name:
        raise ManifestError("--name", messages.RENDER_NO_NAME)
    check_dns1035_name(options.name, "--name")
    command = render_command(argv, topology or {})
    launch = find_poprun(command, None, "command")
    if launch is not None:
        layout = split_instances(launch.num_instances, options.pods or 1, "--pods")
        ipus_per_pod = -(-launch.ipus // layout.pods)
        report.mapped("command", f"poprun --num-instances {launch.num_instances} -> "
                                 f"{layout.pods} pods x {layout.procs_per_pod} processes per pod")
    else:
        layout = PodLayout(options.pods or 1, 1)
        ipus_per_pod = 1
    container = {"name": "pytorch", "image": options.image, "command": command,
                 "volumeMounts": [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]}
    device_resources(container, options.device, ipus_per_pod, options.gpus_per_pod, report,
                     "resources")
    template = {"spec": {"containers": [container],
                         "volumes": [{"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}}]}}
    return JobPlan(name=options.name, layout=layout, pod_template=template,
                   source_path="pod", restart_policy="Never")
