"""The texts of openpop-k8s's errors: each completes a ManifestError raised at the offending field's path."""

# --- cli ------------------------------------------------------------------------
def counted(number, word):
    """``1 IPU``, ``2 IPUs``: a count and its noun (plural with an s)."""
    return f"{number} {word}" if number == 1 else f"{number} {word}s"


AT_LEAST_ONE = "must be at least 1, got {value}"
WHOLE_NUMBER = "must be a whole number, got {text!r}"

# --- convert --------------------------------------------------------------------
MPIRUN_LAUNCHER = (
    "an mpirun launcher needs Kubeflow's MPIJob (mpi-operator); openpop-k8s converts launchers that run "
    "poprun")
IPUS_PER_INSTANCE_MISMATCH = (
    "{job_ipus}, but poprun runs --num-replicas {num_replicas} x --ipus-per-replica "
    "{ipus_per_replica} = {ipus}: make them agree")
PODS_WITHOUT_POPRUN = (
    "without poprun in the command each worker pod runs it once: the job has {worker_replicas} worker pods")
WORKERS_PER_INSTANCE_MISMATCH = (
    "{workers_per_job_instance}, but spec.workers.replicas is {worker_replicas}: make them agree")
REPLICAS_PER_WORKER_MISMATCH = (
    "{per_worker} per worker x {workers} = {expected}, "
    "but poprun runs --num-replicas {num_replicas}: make them agree")
CONVERT_TARGET = "must be one of {targets}, got {to!r}"
CONVERT_KIND = "openpop-k8s convert reads IPUJob (graphcore.ai/v1alpha1) documents, got kind {got!r}"

# --- documents ------------------------------------------------------------------
NO_YAML_DOCUMENT = "contains no YAML document"
INVALID_YAML = "not valid YAML{where}: {problem}"
DOCUMENT_NOT_MAPPING = "must be a mapping (apiVersion, kind, metadata, spec), got {doc_type}"
FILE_UNREADABLE = "cannot read the file: {strerror}"
NOT_UTF8 = "not UTF-8 text (byte {offset} of line {line}): save the manifest as UTF-8 YAML"

# --- ipujob ---------------------------------------------------------------------
NOT_INTEGER = "must be an integer, got {value!r}"
TOO_SMALL = "must be at least {minimum}, got {value}"
IPUJOB_STRING = "must be a string (the IPUJob CRD types it so: write \"{value}\"), got {value_type} {value!r}"
NOT_POSITIVE_WHOLE_NUMBER = "must be a positive whole number, got {value!r}"
NOT_OBJECT = "must be an object, got {value_type}"
IPUJOB_API_VERSION = "an IPUJob has apiVersion {api_version}, got {got!r}"
IPUJOB_NAME_MISSING = "required field is missing (an IPUJob needs metadata.name or metadata.generateName)"
REQUIRED_FIELD_MISSING = "required field is missing"
WORKER_POD_WITHOUT_CONTAINER = "a worker pod needs at least one container"
CLEAN_POD_POLICY = "must be one of {clean_pod_policies}, got {clean!r}"
UNKNOWN_IPUJOB_FIELD = "unknown field (allowed here: {allowed})"
CONTAINER_IMAGE_MISSING = "required field is missing: every container needs an image"
WORKER_STRATEGY = "must be Recreate or RollingUpdate, got {kind!r}"
NOT_STRING_ARRAY = "must be an array of strings"
NOT_ENV_VAR_ARRAY = "must be an array of EnvVar"
RESTART_POLICY_TYPE = "must be one of {restart_types}, got {policy!r}"
EXIT_CODES = "must be a list of exit codes or ranges like \"1,3-5\", got {codes!r}"

# --- job_plan -------------------------------------------------------------------
PODS_TOO_FEW = "the number of pods must be at least 1, got {pods}"
INSTANCES_NOT_DIVISIBLE_BY_PODS = (
    "poprun --num-instances {instances} cannot be divided evenly among {pods} pods: choose --pods dividing "
    "{instances}")

# --- poprun_command -------------------------------------------------------------
POPRUN_OPTION_NOT_POSITIVE = "poprun {option} must be a positive whole number, got {value!r}"
POPRUN_WITHOUT_PROGRAM = "poprun is given no program to run (poprun [options] program [args])"
POPRUN_REPLICAS_NOT_DIVISIBLE = (
    "poprun --num-replicas {replicas} is not divisible by --num-instances {instances}: the replicas are "
    "divided evenly among the instances")
POPRUN_MORE_THAN_ONCE_MAPPED = (
    "the command runs poprun more than once; openpop-k8s maps one poprun launch onto the job's pods")
UNKNOWN_POPRUN_OPTION = "unknown poprun option {name!r}"
POPRUN_MORE_THAN_ONCE = "the command runs poprun more than once"
SHELL_LINE_UNREADABLE = "cannot read the shell command line {line!r}: {exc}"
POPRUN_OPTION_WITHOUT_VALUE = "poprun {name} needs a value"

# --- render ---------------------------------------------------------------------
RENDER_POPRUN_TOPOLOGY = "the command already runs poprun: give its topology in the poprun command only"
RENDER_NO_COMMAND = (
    "give the command to run after --, e.g. openpop-k8s render --image IMAGE -- openpop-bert --config "
    "demo_tiny_128")
RENDER_NO_IMAGE = "required: the container image the pods run (it must contain openpop)"
RENDER_NO_NAME = "required: the job's name (a DNS-1035 label)"

# --- run_local ------------------------------------------------------------------
CONTAINER_WITHOUT_COMMAND = (
    "the container has no command: locally there is no image entrypoint to run; give --command")
POD_COMMAND_SETS_UP = (
    "its command {what} ({snippet!r}): run-local would do that on this machine, not in a container. "
    "Give --command with the line to run instead (e.g. --command 'openpop-bert --config ...'), or "
    "--allow-pod-commands to run the pod's command as written; --dry-run shows what would run")
DRY_RUN_SETUP_NOTE = "pod {pod}: its command {what}: running it needs --command or --allow-pod-commands"
RUN_LOCAL_TERMINATED = "openpop-k8s: received SIGTERM: all pods stopped"
POD_STOPPED_BY_SIGTERM = "pod {pod} {how} (how Kubernetes stops a pod): every pod was stopped"
POD_KILLED_BY_SIGTERM = "was killed by SIGTERM"
POD_EXITED_AFTER_SIGTERM = "exited with code 143 after a SIGTERM"

# --- sdk_models -----------------------------------------------------------------
NO_MODEL_CLASS = "no model class {name}"
NOT_MODEL_OBJECT = "must be an object ({class_name}), got {type_name}"
NOT_MODEL_OBJECT_PYDANTIC = "must be an object ({model_name}), got {type_name}"
NOT_ARRAY = "must be an array, got {type_name}"
NOT_TIMESTAMP = "must be a timestamp, got {type_name}"
NOT_SCALAR = "must be {word}, got {type_name} {value!r}"
UNKNOWN_MODEL_FIELD = "unknown field (a {class_name} has: {known})"
UNKNOWN_MODEL_FIELD_PYDANTIC = "unknown field (a {model_name} has: {known})"
TRAINJOB_REJECTED = "kubeflow-trainer-api rejects the TrainJob: {exc}"
SDK_PACKAGE_MISSING = "validating this manifest needs the `{package}` package: pip install 'openpop[k8s]'"
NOT_ONE_OF_SCHEMAS = "must be one of {choices}, got {type_name} {value!r}"

# --- validation -----------------------------------------------------------------
UNKNOWN_API_VERSION_KIND = "unknown apiVersion/kind {key!r}/{key2!r}: expected {known}"

# --- webhook --------------------------------------------------------------------
NOT_DNS_LABEL = (
    "{name!r} is not a DNS-1035 label: at most 63 characters, lower-case letters, digits and '-', starting "
    "with a letter and not ending with '-'")
NPROC_PER_NODE = "must be a whole number of processes or one of {nproc_words}, got {value!r}"
REPLICA_TYPE = "replica type {key!r} is not supported: only Master and Worker"
POD_TEMPLATE_WITHOUT_CONTAINER = "the pod template needs at least one container"
NO_PYTORCH_CONTAINER = "there must be a container named pytorch"
MASTER_REPLICAS = "must be 1, got {replicas!r}"
RESTART_POLICY = "must be one of {restart_policies}, got {policy!r}"
ELASTIC_POLICY_WITHOUT_WORKER = "an elasticPolicy needs a Worker replica spec"
NPROC_PER_NODE_DEPRECATED = "is deprecated and must not be set together with spec.nprocPerNode"
RESERVED_ENV_VAR = "{env} is reserved: the Trainer sets it for torchrun"

# --- pod_template ---------------------------------------------------------------
PRIVILEGED_REMOVED = "removed: Kubeflow training pods do not run privileged"
IPC_LOCK_REMOVED = "removed IPC_LOCK: it locked IPU host buffers in memory; --keep-ipc-lock keeps it"
HOST_NAMESPACE_REMOVED = "removed: pods of the Kubeflow job do not share the node's {namespace} namespace"
HOST_NET_DNS_POLICY_REMOVED = "removed ClusterFirstWithHostNet: it only served hostNetwork"
GRAPHCORE_IMAGE = ("{image!r} is Graphcore's image for IPUs: it has no openpop, and its SDK expects IPUs. Build an "
                   "image with openpop and torch 2.13 installed and give it with --image IMAGE")
