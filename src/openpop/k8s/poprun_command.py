"""Finding a ``poprun`` launch inside a container's command and reading its topology.

A worker's command is either an exec form (``command: [poprun, --num-instances, ...]``) or a
shell script (``command: [/bin/bash, -c, --]``, ``args: ["... poprun \\ --num-replicas 16 ..."]``).
Either way the launch is kept as written in the pod; only its topology flags are read here:
``--num-instances`` (instances, which become the Kubeflow job's pods x processes per pod),
``--num-replicas`` and ``--ipus-per-replica`` (which keep their meaning inside each instance).
"""

import os
import shlex
from dataclasses import dataclass

from openpop.k8s import messages
from openpop.k8s.errors import ManifestError

# Options of poprun (reference B.1) that are followed by a value when written without "=".
_VALUE_OPTIONS = {
    "--num-replicas", "--ipus-per-replica", "--num-instances", "--num-ilds", "-H", "--host",
    "--hostfile", "--host-subnet", "--vipu-server-host", "--vipu-server-port",
    "--vipu-server-timeout", "--vipu-partition", "--vipu-partition-attempts", "--vipu-cluster",
    "--vipu-allocation", "--executable-cache-path", "--mpi-global-args", "--mpi-local-args",
    "--only-output-from-instance", "--import-config", "--export-config", "--version-format",
    "--sync-type",
}
# Yes/no options: written as --opt=yes, --opt yes, --opt 1, or bare.
_SWITCH_OPTIONS = {
    "--update-partition", "--reset-partition", "--remove-partition", "--numa-aware",
    "--print-topology", "--offline-mode", "--allow-run-as-root", "--overwrite-config",
}
_SWITCH_VALUES = {"yes", "no", "1", "0", "true", "false", "on", "off"}
_FLAGS = {"--help", "--version", "-v", "--verbose", "--vv"}
_SHELLS = {"sh", "bash", "dash", "zsh", "ash"}
_SEPARATORS = {";", "&&", "||", "|", "&", "(", ")", "\n"}


@dataclass(frozen=True)
class PoprunLaunch:
    num_instances: int
    num_replicas: int
    ipus_per_replica: int
    options: tuple          # (option, value) pairs as written, value None for bare flags
    program: tuple          # the program poprun runs, with its arguments

    @property
    def replicas_per_instance(self):
        return self.num_replicas // self.num_instances

    @property
    def ipus(self):
        return self.num_replicas * self.ipus_per_replica


def _positive(option, value, path):
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1:
        raise ManifestError(path, messages.POPRUN_OPTION_NOT_POSITIVE.format(option=option, value=value))
    return number


def parse_poprun_arguments(arguments, path):
    """Read poprun's options from ``arguments`` (everything after the word ``poprun``)."""
    options = []
    index = 0
    while index < len(arguments):
        word = arguments[index]
        if not word.startswith("-") or word == "--":
            break
        name, has_value, value = word.partition("=")
        if has_value:
            options.append((name, value))
        elif name in _VALUE_OPTIONS:
            if index + 1 >= len(arguments):
                raise ManifestError(path, messages.POPRUN_OPTION_WITHOUT_VALUE.format(name=name))
            index += 1
            options.append((name, arguments[index]))
        elif name in _SWITCH_OPTIONS:
            following = arguments[index + 1] if index + 1 < len(arguments) else None
            if following is not None and following.lower() in _SWITCH_VALUES:
                index += 1
                options.append((name, following))
            else:
                options.append((name, "yes"))
        elif name in _FLAGS:
            options.append((name, None))
        else:
            raise ManifestError(path, messages.UNKNOWN_POPRUN_OPTION.format(name=name))
        if name not in _VALUE_OPTIONS | _SWITCH_OPTIONS | _FLAGS:
            raise ManifestError(path, messages.UNKNOWN_POPRUN_OPTION.format(name=name))
        index += 1
    program = arguments[index + 1:] if index < len(arguments) and arguments[index] == "--" \
        else arguments[index:]
    if not program:
        raise ManifestError(path, messages.POPRUN_WITHOUT_PROGRAM)
    values = dict(options)
    instances = _positive("--num-instances", values.get("--num-instances", "1"), path)
    replicas = _positive("--num-replicas", values.get("--num-replicas", "1"), path)
    ipus_per_replica = _positive("--ipus-per-replica", values.get("--ipus-per-replica", "1"), path)
    if replicas % instances:
        raise ManifestError(path, messages.POPRUN_REPLICAS_NOT_DIVISIBLE.format(replicas=replicas, instances=instances))
    return PoprunLaunch(instances, replicas, ipus_per_replica, tuple(options), tuple(program))


def _shell_words(script, path):
    """Words of a shell script, with a "\n" word where a line (a statement) ends."""
    words = []
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True
        try:
            words.extend(lexer)
        except ValueError as exc:
            raise ManifestError(path, messages.SHELL_LINE_UNREADABLE.format(line=line.strip(), exc=exc)) from None
        words.append("\n")
    return words


def _find_in_words(words, path):
    """The poprun launch among shell or exec words, skipping ``VAR=value`` prefixes."""
    launches = []
    statement_start = True
    for index, word in enumerate(words):
        if word in _SEPARATORS or set(word) <= set(";&|()\n"):
            statement_start = True
            continue
        if statement_start and "=" in word and not word.startswith("-") \
                and word.split("=", 1)[0].isidentifier():
            continue  # an environment assignment before the command
        if statement_start and os.path.basename(word) == "poprun":
            end = index + 1
            while end < len(words) and words[end] not in _SEPARATORS:
                end += 1
            launches.append(parse_poprun_arguments(words[index + 1:end], path))
        statement_start = False
    if len(launches) > 1:
        raise ManifestError(path, messages.POPRUN_MORE_THAN_ONCE_MAPPED)
    return launches[0] if launches else None


def find_poprun(command, args, path):
    """The :class:`PoprunLaunch` in a container's ``command``/``args``, or None."""
    words = list(command or []) + list(args or [])
    if not words:
        return None
    if os.path.basename(words[0]) in _SHELLS:
        scripts = [w for w in words[1:] if not w.startswith("-")]
        found = [launch for script in scripts
                 if (launch := _find_in_words(_shell_words(script, path), path)) is not None]
        if len(found) > 1:
            raise ManifestError(path, messages.POPRUN_MORE_THAN_ONCE)
        return found[0] if found else None
    return _find_in_words(words, path)
