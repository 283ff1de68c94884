"""IPUJob -> Kubeflow job: where each field of Graphcore's ``IPUJob`` goes.

=============================  ==========================================================
IPUJob                         PyTorchJob (``--to pytorchjob``) / TrainJob (``--to trainjob``)
=============================  ==========================================================
metadata.name / generateName   metadata.name (generateName without its trailing ``-``)
spec.jobInstances N            N jobs ``<name>-0`` ... (independent runs, as on IPUs); 1: one job
spec.ipusPerJobInstance        resources of the training container (``--device``)
spec.workers.replicas          the number of pods, unless ``--pods`` spreads poprun instances
spec.workers.template          each replica's pod template / ``spec.trainer`` + runtimePatches
poprun --num-instances I       pods x processes per pod = I (``nprocPerNode`` /
                               ``numProcPerNode``); the command keeps ``poprun`` as written
spec.modelReplicasPerWorker    checked against ``poprun --num-replicas``; carried by it
spec.launcher.command          a poprun launcher becomes the pods' command
spec.restartPolicy.type        replica ``restartPolicy`` (TrainJob: the runtime's; reported)
spec.restartPolicy.backOffLimit  ``runPolicy.backoffLimit`` (TrainJob: reported)
spec.cleanPodPolicy            ``runPolicy.cleanPodPolicy`` (Workers -> All; TrainJob: reported)
spec.interactive.ttl           ``activeDeadlineSeconds``
=============================  ==========================================================

Every line of that mapping that applies to the input is also written to stderr, and every
field without a counterpart is named there (``dropped``), as is every privilege removed
(``warning``).
"""

from dataclasses import dataclass
from typing import Optional

from openpop.k8s import messages
from openpop.k8s.errors import ManifestError
from openpop.k8s.ipujob import is_ipujob, parse_ipujob
from openpop.k8s.job_plan import JobPlan, device_resources, split_instances
from openpop.k8s.pod_template import quantities_as_strings, secure_pod_template
from openpop.k8s.poprun_command import find_poprun
from openpop.k8s.pytorchjob import write_pytorchjob
from openpop.k8s.report import ConversionReport
from openpop.k8s.trainjob import DEFAULT_RUNTIME, write_trainjob
from openpop.k8s.validation import validate_kubeflow_job
from openpop.k8s.webhook import check_dns1035_name

TARGETS = ("pytorchjob", "trainjob")


@dataclass(frozen=True)
class ConvertOptions:
    to: str = "pytorchjob"
    image: Optional[str] = None
    device: str = "cpu"
    pods: Optional[int] = None
    gpus_per_pod: Optional[int] = None
    keep_ipc_lock: bool = False
    name: Optional[str] = None
    runtime: str = DEFAULT_RUNTIME


def _job_name(job, options, report):
    if options.name:
        return options.name
    if job.metadata.get("name"):
        return job.metadata["name"]
    name = job.metadata["generateName"].rstrip("-")
    report.mapped("metadata.generateName", f"{job.metadata['generateName']!r} -> metadata.name "
                                           f"{name!r} (pods reach the master by the job's name; "
                                           f"--name sets another)")
    return name


def _pod_command_source(job, template, report):
    """Put a poprun launcher's command into the pod; return the launch found, if any."""
    container = template["spec"]["containers"][0]
    if job.launcher_command is None:
        return find_poprun(container.get("command"), container.get("args"),
                           "spec.workers.template.spec.containers[0].command")
    launch = find_poprun(job.launcher_command, None, "spec.launcher.command")
    if launch is None:
        raise ManifestError("spec.launcher.command", messages.MPIRUN_LAUNCHER)
    report.mapped("spec.launcher.command", "-> the command of every pod (the worker "
                                           "container's own command is replaced)")
    container["command"] = list(job.launcher_command)
    container.pop("args", None)
    if job.launcher_env:
        names = {env["name"] for env in job.launcher_env}
        kept = [env for env in container.get("env") or [] if env.get("name") not in names]
        container["env"] = kept + list(job.launcher_env)
        report.mapped("spec.launcher.env", "-> the env of every pod's training container "
                                            "(replacing worker variables of the same name)")
    return launch


def _check_replica_counts(job, launch, report):
    if launch is None:
        if job.model_replicas_per_worker is not None:
            report.dropped("spec.modelReplicasPerWorker",
                           "no poprun in the command to carry it: the program decides its replicas")
        return
    if job.model_replicas_per_worker is not None:
        expected = job.model_replicas_per_worker * job.worker_replicas
        if expected != launch.num_replicas:
            raise ManifestError("spec.modelReplicasPerWorker",
                                messages.REPLICAS_PER_WORKER_MISMATCH.format(
                                    per_worker=messages.counted(job.model_replicas_per_worker, "replica"),
                                    workers=messages.counted(job.worker_replicas, "worker"),
                                    expected=messages.counted(expected, "replica"),
                                    num_replicas=launch.num_replicas))
        report.mapped("spec.modelReplicasPerWorker",
                      f"carried by poprun --num-replicas {launch.num_replicas} in the pods' command")
    if launch.ipus > job.ipus_per_job_instance:
        raise ManifestError("spec.ipusPerJobInstance",
                            messages.IPUS_PER_INSTANCE_MISMATCH.format(
                                job_ipus=messages.counted(job.ipus_per_job_instance, "IPU"),
                                num_replicas=launch.num_replicas, ipus_per_replica=launch.ipus_per_replica,
                                ipus=messages.counted(launch.ipus, "IPU")))


def _restart(job, pod_restart, target, report):
    if job.restart_policy is not None:
        policy = job.restart_policy.type
        if pod_restart is not None and pod_restart != policy:
            report.dropped("spec.workers.template.spec.restartPolicy",
                           f"{pod_restart!r} gives way to spec.restartPolicy.type {policy!r}")
    else:
        policy = pod_restart or "Never"
    if target == "pytorchjob":
        source = "spec.restartPolicy.type" if job.restart_policy else \
            "spec.workers.template.spec.restartPolicy"
        report.mapped(source, f"{policy!r} -> pytorchReplicaSpecs.*.restartPolicy")
        if job.restart_policy is not None:
            report.mapped("spec.restartPolicy.backOffLimit",
                          f"{job.restart_policy.back_off_limit} -> runPolicy.backoffLimit")
    else:
        if job.restart_policy is not None or pod_restart is not None:
            report.dropped("spec.restartPolicy" if job.restart_policy else
                           "spec.workers.template.spec.restartPolicy",
                           f"{policy!r}: a TrainJob's restarts are its runtime's policy")
    if job.restart_policy is not None and job.restart_policy.exit_codes is not None:
        report.dropped("spec.restartPolicy.exitCodes",
                       "no counterpart: Kubeflow's ExitCode policy retries exit codes >= 128 only")
    return policy


def _clean_pod_policy(job, target, report):
    if job.clean_pod_policy is None:
        return None
    if target == "trainjob":
        report.dropped("spec.cleanPodPolicy", "a TrainJob has no pod clean-up policy")
        return None
    policy = "All" if job.clean_pod_policy == "Workers" else job.clean_pod_policy
    note = " (a PyTorchJob has no launcher: all its pods are workers)" \
        if job.clean_pod_policy == "Workers" else ""
    report.mapped("spec.cleanPodPolicy", f"{job.clean_pod_policy!r} -> runPolicy.cleanPodPolicy "
                                         f"{policy!r}{note}")
    return policy


def plan_from_ipujob(job, options, report):
    """The :class:`JobPlan`s (one per job instance) of a parsed IPUJob."""
    template, pod_restart = secure_pod_template(job.worker_template, "spec.workers.template",
                                                report, keep_ipc_lock=options.keep_ipc_lock)
    container = template["spec"]["containers"][0]
    launch = _pod_command_source(job, template, report)
    _check_replica_counts(job, launch, report)
    instances = launch.num_instances if launch else job.worker_replicas
    pods = options.pods if options.pods is not None else job.worker_replicas
    if launch is None and pods != job.worker_replicas:
        raise ManifestError("--pods", messages.PODS_WITHOUT_POPRUN.format(worker_replicas=job.worker_replicas))
    layout = split_instances(instances, pods, "--pods")
    if launch is not None:
        report.mapped("spec.workers.template.spec.containers[0].command",
                      f"poprun --num-instances {launch.num_instances} -> {layout.pods} pods x "
                      f"{layout.procs_per_pod} processes per pod; --num-replicas "
                      f"{launch.num_replicas} --ipus-per-replica {launch.ipus_per_replica} "
                      f"kept in the command")
    if job.workers_per_job_instance is not None and job.workers_per_job_instance != job.worker_replicas:
        raise ManifestError("spec.workersPerJobInstance",
                            messages.WORKERS_PER_INSTANCE_MISMATCH.format(
                                workers_per_job_instance=job.workers_per_job_instance,
                                worker_replicas=job.worker_replicas))
    if job.workers_per_job_instance is not None:
        report.mapped("spec.workersPerJobInstance", f"-> {layout.pods} pods")
    report.mapped("spec.workers.replicas", f"{job.worker_replicas} -> {layout.pods} pods")
    if options.image:
        report.mapped("spec.workers.template.spec.containers[0].image",
                      f"{container.get('image')!r} -> {options.image!r} (--image)")
        container["image"] = options.image
    elif is_graphcore_image(container.get("image")):
        report.warning("spec.workers.template.spec.containers[0].image",
                       messages.GRAPHCORE_IMAGE.format(image=container.get("image")))
    ipus_per_pod = -(-job.ipus_per_job_instance // layout.pods)
    device_resources(container, options.device, ipus_per_pod, options.gpus_per_pod, report,
                     "spec.ipusPerJobInstance")
    quantities_as_strings(container)
    restart = _restart(job, pod_restart, options.to, report)
    clean = _clean_pod_policy(job, options.to, report)
    if job.worker_strategy is not None:
        report.dropped("spec.workers.strategy", "no counterpart: training pods are not rolled")
    if job.interactive_ttl is not None:
        report.mapped("spec.interactive.ttl", f"{job.interactive_ttl} -> activeDeadlineSeconds "
                                              f"(the job ends after that many seconds)")
    if job.has_status:
        report.dropped("status", "written by the operator, not carried over")
    name = _job_name(job, options, report)
    check_dns1035_name(name, "--name" if options.name else
                       "metadata.name" if job.metadata.get("name") else "metadata.generateName")
    for key in job.metadata:
        if key not in ("name", "generateName", "namespace", "labels", "annotations"):
            report.dropped(f"metadata.{key}", "set by the API server, not carried over")
    if job.job_instances > 1:
        report.mapped("spec.jobInstances", f"{job.job_instances} -> {job.job_instances} "
                                           f"independent jobs {name}-0 ... {name}-{job.job_instances - 1}")
    else:
        report.mapped("spec.jobInstances", "1 -> one job")
    names = [name] if job.job_instances == 1 else \
        [f"{name}-{index}" for index in range(job.job_instances)]
    return [JobPlan(name=job_name, layout=layout, pod_template=template,
                    source_path="spec.workers.template",
                    namespace=job.metadata.get("namespace"),
                    labels=job.metadata.get("labels") or {},
                    annotations=job.metadata.get("annotations") or {},
                    restart_policy=restart,
                    backoff_limit=job.restart_policy.back_off_limit if job.restart_policy else None,
                    clean_pod_policy=clean, active_deadline_seconds=job.interactive_ttl)
            for job_name in names]


def write_job(plan, options, report):
    if options.to == "pytorchjob":
        manifest = write_pytorchjob(plan, report)
    elif options.to == "trainjob":
        manifest = write_trainjob(plan, report, runtime=options.runtime)
    else:
        raise ManifestError("--to", messages.CONVERT_TARGET.format(targets=', '.join(TARGETS), to=options.to))
    validate_kubeflow_job(manifest)
    return manifest


def convert_documents(documents, options):
    """All IPUJob documents -> (Kubeflow manifests, report). Nothing is written on error."""
    report = ConversionReport()
    manifests = []
    for index, document in enumerate(documents):
        try:
            if not is_ipujob(document):
                raise ManifestError("kind", messages.CONVERT_KIND.format(got=document.get('kind')))
            job = parse_ipujob(document)
            document_report = ConversionReport()
            for plan in plan_from_ipujob(job, options, document_report):
                manifests.append(write_job(plan, options, document_report))
        except ManifestError as exc:
            if len(documents) > 1:
                raise ManifestError(f"document {index}: {exc.path}", exc.reason) from None
            raise
        for line in document_report.lines:
            path = f"document {index}: {line.path}" if len(documents) > 1 else line.path
            report.add(type(line)(line.kind, path, line.message))
    return manifests, report


def is_graphcore_image(image) -> bool:
    """Whether ``image`` is one of Graphcore's (``graphcore/...`` on Docker Hub): built for IPUs,
    without openpop."""
    if not isinstance(image, str):
        return False
    name = image.split("/", 1)[1] if image.startswith("docker.io/") else image
    return name.startswith("graphcore/")
