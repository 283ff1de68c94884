"""The texts of poprun's, popdist's and the horovod layer's errors (popdist's exact words where it had them)."""

# --- horovod_compat -------------------------------------------------------------
OP_AND_AVERAGE = "The op parameter supersedes average; pass only one of them."
NO_ADASUM = "Adasum is not part of openpop's horovod compatibility layer"

# --- poprun ---------------------------------------------------------------------
YES_NO_VALUE = "expected yes/no or 1/0, got {text!r}"
SECONDS_NOT_POSITIVE = "expected a positive number of seconds, got {text!r}"
SECONDS_NEGATIVE = "expected a finite number of seconds >= 0, got {text!r}"
HOST_NAMES_NO_HOST = "--host {spec!r} names no host"
HOSTFILE_EMPTY = "the hostfile {path} names no host"
CONFIGURATION_UNKNOWN_OPTIONS = "the configuration {path} has unknown options: {unknown}"
CONFIGURATION_EXISTS = "the configuration file {path} exists: pass --overwrite-config=yes to replace it"
SECONDS_VALUE = "expected a number of seconds, got {text!r}"
HOSTFILE_UNREADABLE = "cannot read the hostfile {path}: {strerror}"
HOST_UNRESOLVED = "host {host!r} is unreachable: its name does not resolve ({strerror}); check --host / the hostfile"
REPLICAS_NOT_DIVISIBLE = (
    "--num-replicas ({num_replicas}) must be divisible by --num-instances ({num_instances}): the replicas "
    "are divided evenly among the instances")
HOST_AND_HOSTFILE = "--host and --hostfile are mutually exclusive: give one of them"
NO_PROGRAM = "no program given: poprun [options] program [program args]"
INSTANCES_NOT_DIVISIBLE = (
    "--num-instances ({num_instances}) must be divisible by the number of hosts ({hosts_count}): the "
    "instances are divided evenly among the hosts")
POD_PROCESSES_MISMATCH = (
    "the pod runs {instances_per_host} instances (--num-instances {num_instances} over "
    "PET_NNODES={hosts_count} pods) but its PET_NPROC_PER_NODE is {declared}: make nprocPerNode match")
OUTPUT_INSTANCE_OUT_OF_RANGE = (
    "--only-output-from-instance {instance} is not an instance: instances are 0 to {last}")
PET_NNODES_VALUE = "PET_NNODES={value!r} is not a number of nodes"
CONFIGURATION_UNREADABLE = "cannot read the configuration {path}: {exc}"
ENV_VARIABLE_FORMAT = "{option}: -x needs NAME or NAME=VALUE"
LEFTOVER_PROCESSES_STOPPED = "stopped {count} process(es) the instances left running: {processes}"
INTERRUPTED_BEFORE_LAUNCH = "interrupted while checking that the hosts answer: nothing was started"
HOST_NOT_ANSWERING = (
    "host {host} does not answer: no reply from {address}:{port} (the rendezvous port) within {seconds:g} s "
    "({reason}). Check that {host} is up and reachable from this host (ping, ssh), that no firewall drops TCP "
    "port {port} between the hosts (--rendezvous-port), and that {where} names the right machine; "
    "--host-answer-timeout 0 skips this check")
NOT_AMONG_HOSTS = "this machine ({hostname}) is not among the hosts {hosts}: run poprun on each of them"
NO_MASTER_ADDRESS = (
    "PET_NNODES > 1 but no PET_MASTER_ADDR/PET_MASTER_PORT (or MASTER_ADDR/MASTER_PORT) in the "
    "environment: the pods cannot meet")
OPTION_HAS_NO_EFFECT = "--{option} has no effect: {reason}"
# Options of Graphcore's poprun that have no counterpart here (accepted, reported once), and why.
NO_EFFECT_REASONS = {
    "num_ilds": "openpop has no IPU-Link domains",
    "vipu_server_host": "openpop has no V-IPU server",
    "vipu_server_port": "openpop has no V-IPU server",
    "vipu_server_timeout": "openpop has no V-IPU server",
    "vipu_partition": "openpop has no V-IPU partitions",
    "vipu_partition_attempts": "openpop has no V-IPU partitions",
    "update_partition": "openpop has no V-IPU partitions",
    "reset_partition": "openpop has no V-IPU partitions",
    "remove_partition": "openpop has no V-IPU partitions",
    "vipu_cluster": "openpop has no V-IPU clusters",
    "vipu_allocation": "openpop has no V-IPU allocations",
    "numa_aware": "instances are not bound to NUMA nodes; the host's cores are split between them",
    "offline_mode": "there are no IPUs to attach to",
    "sync_type": "openpop has no IPU sync types",
    "host_subnet": "the rendezvous uses the --host names",
    "allow_run_as_root": "there is no mpirun root check",
}
MPIRUN_ARGUMENTS_IGNORED = (
    "mpirun arguments ignored (instances are started by torchrun's agent and talk through torch.distributed, "
    "not MPI): {arguments}")
HOST_RANGE_NOT_NUMBERS = "--host {spec!r}: the range {item!r} is not FIRST-LAST in whole numbers (e.g. node[0-3])"
HOST_RANGE_BACKWARDS = "--host {spec!r}: the range {item!r} counts down: write the lower number first"
TOO_MANY_HOSTS = "--host {spec!r} names more than {limit} hosts"
SECONDS_NOT_FINITE = "expected a finite number of seconds, got {text!r}"
OPTION_VALUE_ENDS_OPTIONS = "argument {option}: expected one argument, got '--' (which ends poprun's options)"
PORT_VALUE = "expected a port number from 1 to 65535, got {text!r}"
CONFIGURATION_NOT_OBJECT = (
    "the configuration {path} must be a JSON object of options (as --export-config writes it), not a {type}")
CONFIGURATION_BAD_VALUE = "the configuration {path}: {option} {value!r}: {problem}"
CONFIGURATION_NOT_BOOLEAN = "expected true or false"
CONFIGURATION_NOT_STRINGS = "expected a list of strings"
CONFIGURATION_NOT_SCALAR = "expected a single value"
CONFIGURATION_NOT_A_CHOICE = "expected one of {choices}"

# --- popdist --------------------------------------------------------------------
NON_UNIFORM_REPLICAS = "popdist.{function}() can only be used with a uniform number of replicas per instance"
IPUS_PER_REPLICA_MISMATCH = (
    "{where} asks for {asked} per replica but poprun was started with --ipus-per-replica {started}: "
    "pass the same number to both")
FORBIDDEN_WITH_POPDIST_OPTIONS = "Cannot call `{name}` with popdist.poptorch.Options"
REPLICAS_DO_NOT_ADD_UP = (
    "poprun was started with --num-replicas {total} over {instances} instance(s), {local} replica(s) each, but "
    "this model's options give replicationFactor({replicas}) in each of Options.Distributed.numProcesses="
    "{processes} process(es): {asked} replicas. Use popdist.poptorch.Options(), which takes the replication "
    "factor from poprun (with Lightning: Trainer(devices={local})), set replicationFactor({local}), or start "
    "poprun with --num-replicas {asked}.")
