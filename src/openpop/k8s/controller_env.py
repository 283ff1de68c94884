"""The pods a Kubeflow job creates and the environment its controller injects into them.

PyTorchJob (training-operator v1.9, ``envvar.go``/``master.go``/``elastic.go``), into every
container of every replica pod: ``PYTHONUNBUFFERED=1``; with a Master spec ``MASTER_ADDR`` and
``PET_MASTER_ADDR`` (``<job>-master-0``), ``MASTER_PORT`` and ``PET_MASTER_PORT`` (the
``pytorch`` container's ``pytorchjob-port``, default 23456), ``WORLD_SIZE`` (all replicas x
nprocPerNode, a non-numeric nprocPerNode counting 1), ``RANK`` and ``PET_NODE_RANK`` (Master 0,
Worker i -> i + 1); ``PET_NPROC_PER_NODE`` (``spec.nprocPerNode``, defaulted to ``auto``);
``PET_NNODES`` (all replicas) or, with an ``elasticPolicy``, the ``PET_RDZV_*`` set.

TrainJob (Trainer v2 torch plugin), into the trainer container of node pod i:
``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK`` (= i), ``PET_MASTER_ADDR``
(``<job>-node-0-0.<job>``), ``PET_MASTER_PORT`` (29400).

Container ``env`` entries come first and the controller's after them (Kubernetes keeps the
last of two same-named variables, so the controller's win).
"""

from dataclasses import dataclass, field

from openpop.k8s import pytorchjob, trainjob
from openpop.k8s.webhook import replica_type


@dataclass
class JobPod:
    name: str
    container: dict
    controller_env: dict          # name -> value, in the controller's order
    master_host: str = ""         # the service name MASTER_ADDR / PET_MASTER_ADDR carry
    restart_policy: str = "Never"
    working_dir: str = ""
    notes: list = field(default_factory=list)


def _world_nproc(nproc):
    text = str(nproc)
    return int(text) if text.isdigit() else 1


def _pytorch_port(containers):
    for container in containers:
        if container.get("name") == pytorchjob.CONTAINER_NAME:
            for port in container.get("ports") or []:
                if port.get("name") == pytorchjob.PORT_NAME:
                    return port["containerPort"]
    return pytorchjob.DEFAULT_PORT


def pytorchjob_pods(job):
    name = job["metadata"]["name"]
    spec = job["spec"]
    replica_specs = {replica_type(key): value for key, value in spec["pytorchReplicaSpecs"].items()}
    ordered = [(kind, replica_specs[kind]) for kind in ("Master", "Worker") if kind in replica_specs]
    total = sum(replica.get("replicas", 1) for _, replica in ordered)
    elastic = spec.get("elasticPolicy")
    nproc = spec.get("nprocPerNode")
    if nproc is None:
        nproc = None if elastic and elastic.get("nProcPerNode") is not None else "auto"
    master_host = f"{name}-master-0"
    port = _pytorch_port(replica_specs["Master"]["template"]["spec"]["containers"]) \
        if "Master" in replica_specs else None
    pods = []
    for kind, replica in ordered:
        containers = replica["template"]["spec"]["containers"]
        for index in range(replica.get("replicas", 1)):
            env = {"PYTHONUNBUFFERED": "1"}
            if "Master" in replica_specs:
                rank = index if kind == "Master" else index + 1
                env.update({"MASTER_PORT": str(port), "PET_MASTER_PORT": str(port),
                            "MASTER_ADDR": master_host, "PET_MASTER_ADDR": master_host,
                            "WORLD_SIZE": str(total * _world_nproc(nproc or "auto")),
                            "RANK": str(rank), "PET_NODE_RANK": str(rank)})
            if nproc is not None:
                env["PET_NPROC_PER_NODE"] = str(nproc)
            if elastic is None:
                env["PET_NNODES"] = str(total)
            else:
                env.update(_elastic_env(name, elastic, replica_specs))
            main = next((c for c in containers if c.get("name") == pytorchjob.CONTAINER_NAME),
                        containers[0])
            pods.append(JobPod(name=f"{name}-{kind.lower()}-{index}", container=main,
                               controller_env=env, master_host=master_host,
                               restart_policy=replica.get("restartPolicy", "OnFailure"),
                               working_dir=main.get("workingDir", "")))
    return pods


def _elastic_env(name, elastic, replica_specs):
    worker = replica_specs.get("Worker", {})
    worker_port = _pytorch_port(worker.get("template", {}).get("spec", {}).get("containers", []))
    host = elastic.get("rdzvHost") or f"{name}-worker-0"
    env = {"PET_RDZV_ENDPOINT": f"{host}:{elastic.get('rdzvPort') or worker_port}",
           "PET_RDZV_BACKEND": elastic.get("rdzvBackend") or "c10d"}
    low, high = elastic.get("minReplicas"), elastic.get("maxReplicas")
    replicas = worker.get("replicas", 1)
    env["PET_NNODES"] = f"{low or high or replicas}:{high or low or replicas}"
    if elastic.get("maxRestarts") is not None:
        env["PET_MAX_RESTARTS"] = str(elastic["maxRestarts"])
    if elastic.get("nProcPerNode") is not None:
        env["PET_NPROC_PER_NODE"] = str(elastic["nProcPerNode"])
    if elastic.get("rdzvId"):
        env["PET_RDZV_ID"] = elastic["rdzvId"]
    if elastic.get("rdzvConf"):
        env["PET_RDZV_CONF"] = ",".join(f"{kv['key']}={kv['value']}" for kv in elastic["rdzvConf"])
    if elastic.get("standalone"):
        env["PET_STANDALONE"] = ""
    return env


def _cpu_count(quantity):
    """A CPU quantity rounded up to whole CPUs, as Kubernetes' ``Quantity.Value()``."""
    text = str(quantity)
    cores = float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    return max(1, -int(-cores // 1))


def _trainjob_nproc(trainer):
    """``numProcPerNode`` as the torch plugin resolves it from ``resourcesPerNode``."""
    nproc = str(trainer.get("numProcPerNode", "auto"))
    resources = trainer.get("resourcesPerNode")
    if resources is None:
        return nproc
    if nproc == "auto":
        def use_cpu(values):
            return not any("gpu" in key.lower() for key in values)
        fallback = "auto"
    elif nproc == "cpu":
        def use_cpu(values):
            return "cpu" in values
        fallback = "1"
    else:
        def use_cpu(values):
            return False
        fallback = nproc

    def from_resources(values):
        if values is None:
            return "1", False
        if use_cpu(values):
            return str(_cpu_count(values.get("cpu", 1))), True
        return fallback, False

    result, used_cpu = from_resources(resources.get("limits"))
    if not used_cpu:
        result, _ = from_resources(resources.get("requests"))
    return result


def trainjob_pods(job):
    name = job["metadata"]["name"]
    trainer = job["spec"].get("trainer") or {}
    nodes = trainer.get("numNodes", 1)
    nproc = _trainjob_nproc(trainer)
    master_host = f"{name}-{trainjob.NODE}-0-0.{name}"
    container = {key: trainer[key] for key in ("image", "command", "args", "env") if key in trainer}
    patches = job["spec"].get("runtimePatches") or []
    for patch in patches:
        for replicated in (((patch.get("trainingRuntimeSpec") or {}).get("template") or {})
                           .get("spec") or {}).get("replicatedJobs") or []:
            pod_spec = ((((replicated.get("template") or {}).get("spec") or {})
                         .get("template") or {}).get("spec") or {})
            for patched in pod_spec.get("containers") or []:
                if patched.get("name") == trainjob.NODE and patched.get("env"):
                    container["env"] = list(container.get("env") or []) + patched["env"]
    pods = []
    for index in range(nodes):
        env = {"PET_NNODES": str(nodes), "PET_NPROC_PER_NODE": nproc,
               "PET_NODE_RANK": str(index), "PET_MASTER_ADDR": master_host,
               "PET_MASTER_PORT": str(trainjob.MASTER_PORT)}
        pods.append(JobPod(name=f"{name}-{trainjob.NODE}-0-{index}", container=container,
                           controller_env=env, master_host=master_host))
    return pods


def job_pods(job, kind):
    return pytorchjob_pods(job) if kind == "PyTorchJob" else trainjob_pods(job)
