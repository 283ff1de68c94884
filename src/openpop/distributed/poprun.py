"""``poprun``: Graphcore's launcher, on torchrun's elastic agent.

``poprun [options] PROGRAM [ARGS...]`` starts ``--num-instances`` copies of PROGRAM that together
hold ``--num-replicas`` replicas. Instances are started and supervised by
``torch.distributed.launcher.api.elastic_launch`` (the agent behind ``torchrun``); hosts meet
through its c10d rendezvous. Each instance runs ``instance.py``, which sets its ``POPDIST_*``
environment and then execs PROGRAM. Every output line is tagged with its instance as mpirun's
``--tag-output`` did (``[1,<instance>]<stdout>:``).

What differs from Graphcore's poprun (also in docs/guides/scale-out.md):

* no V-IPU server, partitions or IPU-Link domains: those flags are accepted and reported as
  having no effect; the virtual IPUs of each instance are its share of the host's GPUs (or CPU);
* no mpirun: ``--mpi-global-args`` / ``--mpi-local-args`` honour ``-x NAME[=VALUE]`` and report
  every other mpirun argument as ignored;
* multi-host: run the same poprun command on every host of ``--host`` (there is no ssh launch);
  the instances of node ``k`` of the rendezvous are ``k * instances_per_host ...``; c10d orders
  the nodes by address, which need not be the order of ``--host``.
* inside a Kubeflow PyTorchJob pod (no ``--host``; ``PET_NNODES`` > 1 in the environment) the
  pods meet at ``PET_MASTER_ADDR:PET_MASTER_PORT`` (or ``MASTER_ADDR:MASTER_PORT``) and each pod
  runs ``--num-instances / PET_NNODES`` instances.

openpop options: ``--collective-timeout SECONDS`` (default 600; also ``OPENPOP_COLLECTIVE_TIMEOUT``),
``--rendezvous-port`` (multi-host, default 29400), ``--rendezvous-timeout`` (seconds, default 300),
``--host-answer-timeout`` (seconds, default 15: a host of ``--host`` that does not answer at all by
then stops the launch instead of the rendezvous waiting for it; see ``reachability.py``).
"""
import argparse
import datetime
import json
import math
import os
import re
import shlex
import socket
import sys

from . import instance as instance_env
from . import messages, reachability
from .topology import topology_table

USAGE_ERROR = 2
MAX_HOSTS = 4096  # a --host range longer than this is a typo (Graphcore's largest systems had 256 hosts)
HOST_ANSWER_SECONDS = 15.0


# mpirun arguments that poprun itself passes or that change nothing here.
_MPI_ACCEPTED = {"--tag-output", "--allow-run-as-root"}
_MPI_ACCEPTED_WITH_VALUE = {"--bind-to": "none"}


class UsageError(Exception):
    """A bad command line: reported as ``poprun: error: ...``, exit status 2."""


def _bool(text: str) -> bool:
    value = str(text).strip().lower()
    if value in ("1", "yes", "true", "on"):
        return True
    if value in ("0", "no", "false", "off"):
        return False
    raise argparse.ArgumentTypeError(messages.YES_NO_VALUE.format(text=text))


def _int_at_least(minimum: int, expected: str):
    """An argparse type: an integer >= ``minimum``, else ``expected a/an <expected>``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value
    return parse


_positive = _int_at_least(1, "a positive integer")
_non_negative = _int_at_least(0, "an integer >= 0")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(messages.SECONDS_VALUE.format(text=text)) from None
    if not math.isfinite(value):  # nan would pass any comparison; inf overflows torch's timedelta
        raise argparse.ArgumentTypeError(messages.SECONDS_NOT_FINITE.format(text=text))
    if value <= 0:
        raise argparse.ArgumentTypeError(messages.SECONDS_NOT_POSITIVE.format(text=text))
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(messages.PORT_VALUE.format(text=text))
    return value


def _seconds_or_zero(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(messages.SECONDS_VALUE.format(text=text)) from None
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(messages.SECONDS_NEGATIVE.format(text=text))
    return value


class _ErrorRaisingParser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    from ..cli_help import NO_EFFECT, HelpFormatter, examples
    parser = _ErrorRaisingParser(
        prog="poprun", allow_abbrev=False, formatter_class=HelpFormatter,
        usage="poprun [options] program [program args]",
        description="Launch a program as several instances holding data-parallel replicas "
                    "(openpop: on torchrun's elastic agent and torch.distributed).",
        epilog=examples("poprun --num-instances 2 --num-replicas 4 python train.py",
                        "poprun --host node0,node1 --num-instances 4 --num-replicas 8 openpop-bert "
                        "--config cpu_tiny_128"))
    add = parser.add_argument

    def ipu_only(*names, **kwargs):
        """A Graphcore flag accepted so that launch scripts run unchanged; it changes nothing here."""
        dest = names[-1].lstrip("-").replace("-", "_")
        reason = messages.NO_EFFECT_REASONS[dest].replace("openpop has no ", "no ")
        add(*names, help=NO_EFFECT.format(reason=reason), **kwargs)

    add("--version", action="store_true", help="print the version and exit")
    add("--version-format", choices=["text", "full-json", "full-text"], default="text",
        help="how --version prints")
    add("--import-config", metavar="FILE", help="read options from FILE (JSON); the command line wins")
    add("--export-config", metavar="FILE", help="write the options to FILE (JSON)")
    add("--overwrite-config", type=_bool, default=False, metavar="yes|no", help="let --export-config replace FILE")
    add("-H", "--host", help="hosts to run instances on: host0,host1 or host[0-2,4]")
    add("--hostfile", "--host-file", dest="hostfile", metavar="FILE",
        help="file with one host per line (excludes --host)")
    add("--num-replicas", type=_positive, default=1, metavar="N", help="total number of replicas")
    add("--ipus-per-replica", type=_positive, default=1, metavar="N",
        help="virtual IPUs per replica (the stages of a pipelined or sharded model)")
    add("--num-instances", type=_positive, default=1, metavar="N",
        help="number of instances (processes); the replicas are divided evenly among them")
    ipu_only("--num-ilds", type=_positive, metavar="N")
    ipu_only("--vipu-server-host", metavar="HOST")
    ipu_only("--vipu-server-port", type=int, metavar="PORT")
    ipu_only("--vipu-server-timeout", type=int, metavar="SECONDS")
    ipu_only("--vipu-partition", metavar="NAME")
    ipu_only("--vipu-partition-attempts", type=int, metavar="N")
    ipu_only("--update-partition", type=_bool, metavar="yes|no")
    ipu_only("--reset-partition", type=_bool, metavar="yes|no")
    ipu_only("--remove-partition", type=_bool, metavar="yes|no")
    ipu_only("--vipu-cluster", metavar="NAME")
    ipu_only("--vipu-allocation", metavar="NAME")
    add("--executable-cache-path", metavar="DIR", help="cache directory of every instance (POPTORCH_CACHE_DIR)")
    add("--mpi-global-args", default="", metavar="ARGS",
        help="mpirun arguments: -x NAME[=VALUE] sets the instances' environment; others have no effect on openpop")
    add("--mpi-local-args", default="", metavar="ARGS", help="per-instance mpirun arguments: -x NAME[=VALUE] as above")
    ipu_only("--numa-aware", type=_bool, metavar="yes|no")
    add("--print-topology", type=_bool, default=False, metavar="yes|no", help="print the topology table")
    add("--only-output-from-instance", type=_non_negative, metavar="N",
        help="suppress the output of every other instance")
    ipu_only("--offline-mode", type=_bool, metavar="yes|no")
    ipu_only("--sync-type", metavar="TYPE")
    ipu_only("--host-subnet", metavar="SUBNET")
    ipu_only("--allow-run-as-root", type=_bool, metavar="yes|no")
    add("-v", "--verbose", action="store_true", help="verbose")
    add("--vv", action="store_true", help="very verbose (prints the topology too)")
    add("--collective-timeout", type=_seconds, default=None, metavar="SECONDS",
        help="openpop: seconds before a collective that some instance never joins fails "
             f"(default: ${instance_env.COLLECTIVE_TIMEOUT}, else {instance_env.DEFAULT_COLLECTIVE_TIMEOUT:g})")
    add("--rendezvous-port", type=_port, default=29400, metavar="PORT",
        help="openpop: port of the c10d rendezvous on the first host (multi-host)")
    add("--rendezvous-timeout", type=_seconds, default=300.0, metavar="SECONDS",
        help="openpop: seconds to wait for every host to join")
    add("--host-answer-timeout", type=_seconds_or_zero, default=HOST_ANSWER_SECONDS, metavar="SECONDS",
        help="openpop: seconds for every other host to answer at the rendezvous port before the launch "
             "stops (multi-host; 0: no check)")
    add("program", nargs="?", help="the program to run, then its arguments")
    add("program_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def _value_options(parser) -> set:
    """Option strings that take a value."""
    names = set()
    for action in parser._actions:
        if action.option_strings and action.nargs != 0:
            names.update(action.option_strings)
    return names


def normalise_argv(argv, parser) -> list:
    """``--opt VALUE`` becomes ``--opt=VALUE`` so that a value may start with ``--``
    (``--mpi-global-args --tag-output``); everything from the program on is left as it is."""
    takes_value = _value_options(parser)
    out, i = [], 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            out.extend(argv[i:])
            break
        if not token.startswith("-") or token == "-":
            out.append("--")
            out.extend(argv[i:])
            break
        if "=" not in token and token in takes_value and i + 1 < len(argv):
            token, i = f"{token}={argv[i + 1]}", i + 1
        name, _, value = token.partition("=")
        if value == "--" and name in takes_value:  # argparse would read it as no value at all, not as "--"
            raise UsageError(messages.OPTION_VALUE_ENDS_OPTIONS.format(option=name))
        out.append(token)
        i += 1
    return out


def expand_hosts(spec: str) -> list:
    """``host0,host1`` or ``host[0-2,4]`` (zero padding kept: ``node[01-02]``)."""
    hosts = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", spec):
        match = re.fullmatch(r"(.*)\[([^\]]*)\](.*)", part)
        if not match:
            hosts.append(part.strip())
            continue
        prefix, ranges, suffix = match.groups()
        for item in ranges.split(","):
            if "-" in item:
                first, last = item.split("-", 1)
                if not (re.fullmatch(r"[0-9]+", first) and re.fullmatch(r"[0-9]+", last)):
                    raise UsageError(messages.HOST_RANGE_NOT_NUMBERS.format(spec=spec, item=item))
                if int(last) < int(first):
                    raise UsageError(messages.HOST_RANGE_BACKWARDS.format(spec=spec, item=item))
                if len(hosts) + int(last) - int(first) >= MAX_HOSTS:
                    raise UsageError(messages.TOO_MANY_HOSTS.format(spec=spec, limit=MAX_HOSTS))
                width = len(first)
                for n in range(int(first), int(last) + 1):
                    hosts.append(f"{prefix}{str(n).zfill(width)}{suffix}")
            else:
                hosts.append(f"{prefix}{item}{suffix}")
    hosts = [h for h in hosts if h]
    if len(hosts) > MAX_HOSTS:
        raise UsageError(messages.TOO_MANY_HOSTS.format(spec=spec, limit=MAX_HOSTS))
    if not hosts:
        raise UsageError(messages.HOST_NAMES_NO_HOST.format(spec=spec))
    return hosts


def read_hostfile(path: str) -> list:
    try:
        with open(path) as stream:
            lines = [line.split("#", 1)[0].strip() for line in stream]
    except OSError as exc:
        raise UsageError(messages.HOSTFILE_UNREADABLE.format(path=path, strerror=exc.strerror)) from None
    hosts = [line for line in lines if line]
    if not hosts:
        raise UsageError(messages.HOSTFILE_EMPTY.format(path=path))
    return hosts


def is_this_machine(host: str) -> bool:
    """Whether ``host`` names an address of this machine (a socket can bind to it)."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror:
        return False
    for family, _, _, _, address in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.bind((address[0], 0))
            return True
        except OSError:
            continue
    return False


def check_resolvable(host: str) -> None:
    try:
        socket.getaddrinfo(host, None)
    except socket.gaierror as exc:
        raise UsageError(messages.HOST_UNRESOLVED.format(host=host, strerror=exc.strerror)) from None


def parse_mpi_args(text: str, option: str):
    """``(environment, ignored tokens)`` from mpirun arguments."""
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"{option}: {exc}") from None
    env, ignored, i = {}, [], 0
    while i < len(tokens):
        token = tokens[i]
        if token == "-x":
            if i + 1 >= len(tokens):
                raise UsageError(messages.ENV_VARIABLE_FORMAT.format(option=option))
            name, sep, value = tokens[i + 1].partition("=")
            if sep:
                env[name] = value
            elif name in os.environ:
                env[name] = os.environ[name]
            i += 2
        elif token in _MPI_ACCEPTED:
            i += 1
        elif token in _MPI_ACCEPTED_WITH_VALUE and i + 1 < len(tokens) \
                and tokens[i + 1] == _MPI_ACCEPTED_WITH_VALUE[token]:
            i += 2
        else:
            ignored.append(token)
            i += 1
    return env, ignored


class Log:
    """poprun's own lines: ``HH:MM:SS.mmm PID POPRUN [I|W|E|D] message`` on stderr."""

    def __init__(self, verbosity: int):
        self.verbosity = verbosity

    def _write(self, level: str, message: str) -> None:
        now = datetime.datetime.now().strftime("%H:%M:%S.%f")[:-3]
        sys.stderr.write(f"{now} {os.getpid()} POPRUN [{level}] {message}\n")
        sys.stderr.flush()

    def info(self, message):
        if self.verbosity >= 1:
            self._write("I", message)

    def debug(self, message):
        if self.verbosity >= 2:
            self._write("D", message)

    def warning(self, message):
        self._write("W", message)

    def error(self, message):
        self._write("E", message)


class Plan:
    """The launch, decided from the command line and the environment."""

    def __init__(self, args, environ):
        self.args = args
        if args.num_replicas % args.num_instances:
            raise UsageError(messages.REPLICAS_NOT_DIVISIBLE.format(num_replicas=args.num_replicas,
                                                                    num_instances=args.num_instances))
        if args.host and args.hostfile:
            raise UsageError(messages.HOST_AND_HOSTFILE)
        if args.program is None:
            raise UsageError(messages.NO_PROGRAM)
        hosts = expand_hosts(args.host) if args.host else read_hostfile(args.hostfile) if args.hostfile else None
        self.kubeflow = False
        if hosts is not None:
            for host in hosts:
                check_resolvable(host)
            if not any(is_this_machine(h) for h in hosts):
                raise UsageError(messages.NOT_AMONG_HOSTS.format(hostname=socket.gethostname(),
                                                                 hosts=','.join(hosts)))
            self.hosts = hosts
            self.endpoint = f"{hosts[0]}:{args.rendezvous_port}" if len(hosts) > 1 else "localhost:0"
            self.local_addr = next(h for h in hosts if is_this_machine(h)) if len(hosts) > 1 else None
        elif _kubeflow_nodes(environ) > 1:
            self.kubeflow = True
            nodes = _kubeflow_nodes(environ)
            master = environ.get("PET_MASTER_ADDR") or environ.get("MASTER_ADDR")
            port = environ.get("PET_MASTER_PORT") or environ.get("MASTER_PORT")
            if not master or not port:
                raise UsageError(messages.NO_MASTER_ADDRESS)
            self.hosts = [master] + [f"node{i}" for i in range(1, nodes)]
            self.endpoint = f"{master}:{port}"
            self.local_addr = None
        else:
            self.hosts = ["localhost"]
            self.endpoint = "localhost:0"
            self.local_addr = None
        if args.num_instances % len(self.hosts):
            raise UsageError(messages.INSTANCES_NOT_DIVISIBLE.format(num_instances=args.num_instances,
                                                                     hosts_count=len(self.hosts)))
        self.instances_per_host = args.num_instances // len(self.hosts)
        declared = environ.get("PET_NPROC_PER_NODE", "")
        if self.kubeflow and declared.isdigit() and int(declared) != self.instances_per_host:
            raise UsageError(messages.POD_PROCESSES_MISMATCH.format(
                instances_per_host=self.instances_per_host, num_instances=args.num_instances,
                hosts_count=len(self.hosts), declared=declared))
        if args.only_output_from_instance is not None and args.only_output_from_instance >= args.num_instances:
            raise UsageError(messages.OUTPUT_INSTANCE_OUT_OF_RANGE.format(
                instance=args.only_output_from_instance, last=args.num_instances - 1))
        self.timeout = args.collective_timeout or float(
            environ.get(instance_env.COLLECTIVE_TIMEOUT, instance_env.DEFAULT_COLLECTIVE_TIMEOUT))
        self.mpi_env, self.mpi_ignored = {}, []
        for option in ("mpi_global_args", "mpi_local_args"):
            env, ignored = parse_mpi_args(getattr(args, option), "--" + option.replace("_", "-"))
            self.mpi_env.update(env)
            self.mpi_ignored.extend(ignored)
        self.run_id = environ.get("PET_RDZV_ID") or environ.get("TORCHELASTIC_RUN_ID") or "poprun"

    @property
    def multi_node(self) -> bool:
        return len(self.hosts) > 1

    def topology(self) -> str:
        return topology_table(self.hosts, self.args.num_instances, self.args.num_replicas,
                              self.args.num_ilds or 1)


def _kubeflow_nodes(environ) -> int:
    """Pods of a Kubeflow PyTorchJob (``PET_NNODES``; ``min:max`` counts ``max``), or 0."""
    value = environ.get("PET_NNODES", "")
    if not value:
        return 0
    try:
        return int(value.split(":")[-1])
    except ValueError:
        raise UsageError(messages.PET_NNODES_VALUE.format(value=value)) from None


def _version_text(fmt: str) -> str:
    from .._version import openpop_version
    if fmt == "full-json":
        return json.dumps({"name": "poprun", "implementation": "openpop", "version": openpop_version,
                           "launcher": "torch.distributed.launcher (torchrun elastic agent)"})
    if fmt == "full-text":
        return (f"poprun (openpop {openpop_version})\n"
                "launcher: torch.distributed elastic agent; transport: torch.distributed (gloo/NCCL)")
    return f"poprun (openpop {openpop_version})"


def _import_config(parser, argv):
    """Options read from ``--import-config FILE`` become defaults; the command line wins."""
    options = normalise_argv(argv, parser)
    options = options[:options.index("--")] if "--" in options else options
    paths = [a.split("=", 1)[1] for a in options if a.startswith("--import-config=")]
    if not paths:
        return
    path = paths[-1]
    try:
        with open(path) as stream:
            values = json.load(stream)
    except (OSError, ValueError) as exc:
        raise UsageError(messages.CONFIGURATION_UNREADABLE.format(path=path, exc=exc)) from None
    parser.set_defaults(**_config_values(parser, values, path))


def _config_values(parser, values, path) -> dict:
    """``--import-config``'s options as the command line would give them: each checked by its option's
    type and choices (``set_defaults`` alone would skip both for values that are not strings)."""
    if not isinstance(values, dict):
        raise UsageError(messages.CONFIGURATION_NOT_OBJECT.format(path=path, type=type(values).__name__))
    actions = {action.dest: action for action in parser._actions if action.dest != "help"}
    unknown = sorted(set(values) - set(actions))
    if unknown:
        raise UsageError(messages.CONFIGURATION_UNKNOWN_OPTIONS.format(path=path, unknown=', '.join(unknown)))
    converted = {}
    for dest, value in values.items():
        action = actions[dest]
        name = action.option_strings[-1] if action.option_strings else dest
        try:
            converted[dest] = _config_value(action, value)
        except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
            raise UsageError(messages.CONFIGURATION_BAD_VALUE.format(path=path, option=name, value=value,
                                                                     problem=exc)) from None
    return converted


def _config_value(action, value):
    if value is None:
        return None
    if action.nargs == 0:  # --version, -v, --vv: true or false
        if not isinstance(value, bool):
            raise TypeError(messages.CONFIGURATION_NOT_BOOLEAN)
        return value
    if action.nargs == argparse.REMAINDER:  # the program's arguments
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise TypeError(messages.CONFIGURATION_NOT_STRINGS)
        return value
    if isinstance(value, (list, dict)):
        raise TypeError(messages.CONFIGURATION_NOT_SCALAR)
    result = action.type(str(value)) if action.type is not None else str(value)
    if action.choices is not None and result not in action.choices:
        raise ValueError(messages.CONFIGURATION_NOT_A_CHOICE.format(choices=", ".join(action.choices)))
    return result


def _export_config(args) -> None:
    path = args.export_config
    if os.path.exists(path) and not args.overwrite_config:
        raise UsageError(messages.CONFIGURATION_EXISTS.format(path=path))
    skip = {"program", "program_args", "export_config", "import_config", "overwrite_config", "version",
            "version_format"}
    values = {key: value for key, value in vars(args).items() if key not in skip}
    with open(path, "w") as stream:
        json.dump(values, stream, indent=2, sort_keys=True)
        stream.write("\n")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        _import_config(parser, argv)
        args = parser.parse_args(normalise_argv(argv, parser))
        if args.version:
            print(_version_text(args.version_format))
            return 0
        if args.export_config:
            _export_config(args)
            if args.program is None:
                return 0
        plan = Plan(args, os.environ)
    except UsageError as exc:
        sys.stderr.write(f"poprun: error: {exc}\n")
        return USAGE_ERROR
    log = Log(2 if args.vv else 1 if args.verbose else 0)
    for dest, reason in messages.NO_EFFECT_REASONS.items():
        if getattr(args, dest) is not None:
            log.warning(messages.OPTION_HAS_NO_EFFECT.format(option=dest.replace("_", "-"), reason=reason))
    if plan.mpi_ignored:
        log.warning(messages.MPIRUN_ARGUMENTS_IGNORED.format(arguments=" ".join(plan.mpi_ignored)))
    if args.print_topology or args.vv:
        sys.stdout.write(plan.topology())
        sys.stdout.flush()
    try:
        if not _hosts_answer(plan, log):
            return 1
    except KeyboardInterrupt:  # Ctrl-C while waiting for a host: nothing was started
        log.error(messages.INTERRUPTED_BEFORE_LAUNCH)
        return 128 + 2
    from .launch import launch
    return launch(plan, log)


def _hosts_answer(plan, log) -> bool:
    """Whether every other host of ``--host`` answers at the rendezvous port (``reachability``);
    logs the ones that do not."""
    args = plan.args
    if not plan.multi_node or plan.kubeflow or not args.host_answer_timeout:
        return True
    others = [host for host in dict.fromkeys(plan.hosts) if host != plan.local_addr]
    log.debug(f"checking that the other hosts answer at port {args.rendezvous_port}: {', '.join(others)}")
    silent = reachability.silent_hosts(others, args.rendezvous_port, args.host_answer_timeout)
    for host, address, reason in silent:
        log.error(messages.HOST_NOT_ANSWERING.format(
            host=host, address=address, port=args.rendezvous_port, seconds=args.host_answer_timeout,
            reason=reason, where="--host" if args.host else "the hostfile"))
    return not silent


if __name__ == "__main__":
    sys.exit(main())
