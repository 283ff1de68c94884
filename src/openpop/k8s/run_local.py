"""``openpop-k8s run-local``: a PyTorchJob or TrainJob on this machine, without a cluster.

Each replica pod of the job is one local process group (``start_new_session``), started in
the controller's order (Master, then Workers; TrainJob nodes by index), running the pod's
training container command as written (``command`` + ``args``, ``$(VAR)`` references
expanded from the container's env as the kubelet does) with the environment the Kubeflow
controller injects (:mod:`openpop.k8s.controller_env`) on top of the container's ``env``.

What differs from a cluster, on purpose:

* the master's service name (``<job>-master-0``, ``<job>-node-0-0.<job>``) resolves only in
  the cluster, so ``MASTER_ADDR``/``PET_MASTER_ADDR``/``PET_RDZV_ENDPOINT`` carry
  ``127.0.0.1`` instead; every other value is the controller's;
* a process inherits this shell's environment (in a pod it would be the image's), and
  ``HOSTNAME`` is the pod's name as in a pod;
* ``--master-port`` replaces the job's port (for machines where it is taken);
* the image is not pulled and restart policies are not applied: a pod that fails fails
  the job, at once.

When a pod's main process exits, whatever it left is killed (a container's processes end
with it): its process group, and every process whose environment carries the pod's mark
``OPENPOP_RUN_LOCAL_POD=<random>-<index>``, which finds what left the group (poprun's instances
run in sessions of their own; daemons) (:mod:`openpop.leftover_processes`). When a pod fails,
the other pods' groups get SIGTERM, then SIGKILL after a grace period; the job fails naming
the pod and its exit code. A pod stopped by SIGTERM (what Kubernetes sends to stop a pod: it
was killed by SIGTERM or exited with 143) stops the job the same way, as ``JobStopped``:
``openpop-k8s`` exits 143, as it does when it receives SIGTERM itself. SIGTERM and Ctrl-C
wait while the pods are being stopped. No process outlives ``run-local``.
"""

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from openpop import leftover_processes
from openpop.k8s import messages
from openpop.k8s.controller_env import job_pods
from openpop.k8s.errors import ManifestError
from openpop.k8s.validation import validate_kubeflow_job

LOCAL_ADDRESS = "127.0.0.1"
GRACE_SECONDS = 5.0
POD_MARK = "OPENPOP_RUN_LOCAL_POD"
_ADDRESS_VARIABLES = ("MASTER_ADDR", "PET_MASTER_ADDR")
_VAR_REF = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")
_OPTIONS = r"(?:\s+-\S+)*"  # flags between a tool and its verb: apt -y install, pip3 -q install
# What an image's build steps do and a pod's command often repeats at start-up (IPUJob examples
# clone Graphcore's repositories and apt/pip install into the container): on this machine it would
# change the user's system, so run-local asks for --command or --allow-pod-commands first.
_SETUP_STEPS = (
    (re.compile(r"\b(?:sudo\s+)?(?:apt|apt-get|aptitude|yum|dnf|zypper|apk)" + _OPTIONS +
                r"\s+(?:update|upgrade|dist-upgrade|full-upgrade|install|add)\b"), "installs system packages"),
    (re.compile(r"\b(?:pip|pip3|pip3\.\d+|uv\s+pip|python3?(?:\.\d+)?\s+-m\s+pip)" + _OPTIONS +
                r"\s+install\b"), "installs Python packages"),
    (re.compile(r"\b(?:conda|mamba|micromamba)" + _OPTIONS + r"\s+install\b"), "installs conda packages"),
    (re.compile(r"\bgit" + _OPTIONS + r"\s+clone\b"), "clones a repository"),
    (re.compile(r"\b(?:curl|wget)\b[^|;&\n]*\|\s*(?:sudo\s+)?(?:ba|z|da|k)?sh\b"),
     "pipes a download into a shell"),
)


@dataclass
class PodResult:
    name: str
    returncode: int


class JobFailed(RuntimeError):
    def __init__(self, pod, returncode):
        self.pod = pod
        self.returncode = returncode
        if returncode < 0:
            how = f"was killed by {signal.Signals(-returncode).name}"
        else:
            how = f"exited with code {returncode}"
        super().__init__(f"pod {pod} {how}: the job failed")


class JobStopped(JobFailed):
    """A pod was stopped by SIGTERM (killed by it, or exited with 128 + 15): the job is stopped."""

    def __init__(self, pod, returncode):
        super().__init__(pod, returncode)
        how = messages.POD_KILLED_BY_SIGTERM if returncode < 0 else messages.POD_EXITED_AFTER_SIGTERM
        self.args = (messages.POD_STOPPED_BY_SIGTERM.format(pod=pod, how=how),)


def stopped_by_sigterm(returncode) -> bool:
    return returncode in (-signal.SIGTERM, 128 + signal.SIGTERM)


def expand_references(text, env):
    """Kubernetes' ``$(VAR)`` expansion in command and args (``$$`` escapes a ``$``)."""
    def replace(match):
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)
    return _VAR_REF.sub(replace, text)


def _container_env(container, pod_name, notes, path):
    env = {}
    for index, item in enumerate(container.get("env") or []):
        name = item["name"]
        if "value" in item or "valueFrom" not in item:
            env[name] = expand_references(str(item.get("value", "")), env)
            continue
        field_ref = (item["valueFrom"] or {}).get("fieldRef") or {}
        if field_ref.get("fieldPath") == "metadata.name":
            env[name] = pod_name
        elif field_ref.get("fieldPath") == "metadata.namespace":
            env[name] = "default"
        else:
            notes.append(f"{path}.env[{index}] ({name}): valueFrom is resolved only in a cluster; "
                         f"left unset here")
    return env


def pod_environment(pod, master_port=None, base=None):
    """The full environment of a local pod process and notes on what was not resolvable."""
    notes = []
    env = dict(os.environ if base is None else base)
    env.update(_container_env(pod.container, pod.name, notes, pod.name))
    controller = dict(pod.controller_env)
    for key in _ADDRESS_VARIABLES:
        if key in controller:
            controller[key] = LOCAL_ADDRESS
    if "PET_RDZV_ENDPOINT" in controller:
        port = controller["PET_RDZV_ENDPOINT"].rsplit(":", 1)[1]
        controller["PET_RDZV_ENDPOINT"] = f"{LOCAL_ADDRESS}:{master_port or port}"
    if master_port is not None:
        for key in ("MASTER_PORT", "PET_MASTER_PORT"):
            if key in controller:
                controller[key] = str(master_port)
    env.update(controller)
    env["HOSTNAME"] = pod.name
    return env, notes


def pod_argv(pod, env, command_override=None):
    if command_override is not None:
        argv = shlex.split(command_override)
    else:
        argv = list(pod.container.get("command") or []) + list(pod.container.get("args") or [])
    if not argv:
        raise ManifestError(f"pod {pod.name}", messages.CONTAINER_WITHOUT_COMMAND)
    return [expand_references(word, env) for word in argv]


def setup_steps(argv):
    """What in a pod's command line would install packages or fetch code on this machine:
    ``[(what, the words that do it)]``, in the order the command does them, one per kind."""
    line = " ".join(argv)
    found = []
    for pattern, what in _SETUP_STEPS:
        match = pattern.search(line)
        if match:
            found.append((match.start(), what, match.group(0)))
    return [(what, snippet) for _, what, snippet in sorted(found)]


def _joined(steps):
    whats = [what for what, _ in steps]
    return whats[0] if len(whats) == 1 else ", ".join(whats[:-1]) + " and " + whats[-1]


def _relay(stream, prefix, out, lock):
    for line in iter(stream.readline, b""):
        with lock:
            out.write(prefix + line.decode(errors="replace"))
            out.flush()
    stream.close()


def _block_stop_signals():
    """Block SIGTERM and SIGINT in this (main) thread; the previous mask, or None elsewhere."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})


def _signal_group(process, sig):
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class LocalJob:
    """The running pods of one job; ``run()`` returns when all succeeded or one failed."""

    def __init__(self, pods, argvs, envs, out=None, cwd=None):
        self.pods = pods
        self.argvs = argvs
        self.envs = envs
        self.out = out or sys.stdout
        self.cwd = cwd
        self.processes = []
        self.relays = []
        self._lock = threading.Lock()
        job = leftover_processes.new_mark()
        self.marks = [f"{job}-{index}" for index in range(len(pods))]

    def start(self):
        width = max(len(pod.name) for pod in self.pods)
        for pod, argv, env, mark in zip(self.pods, self.argvs, self.envs, self.marks):
            cwd = pod.working_dir if pod.working_dir and os.path.isdir(pod.working_dir) else self.cwd
            env = dict(env, **{POD_MARK: mark})
            process = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       start_new_session=True)
            self.processes.append(process)
            relay = threading.Thread(target=_relay, daemon=True,
                                     args=(process.stdout, f"{pod.name:<{width}} | ", self.out,
                                           self._lock))
            relay.start()
            self.relays.append(relay)

    def describe(self):
        """What ``run()`` would start, one shell line per pod: ``cd DIR && env VAR=value ... argv``
        with the variables that differ from this shell's environment."""
        lines = []
        for pod, argv, env in zip(self.pods, self.argvs, self.envs):
            cwd = pod.working_dir if pod.working_dir and os.path.isdir(pod.working_dir) else self.cwd
            changed = [f"{key}={value}" for key, value in sorted(env.items()) if os.environ.get(key) != value]
            words = (["env", *changed] if changed else []) + list(argv)
            line = shlex.join(words)
            if cwd:
                line = f"cd {shlex.quote(str(cwd))} && {line}"
            lines.append(f"# pod {pod.name}\n{line}")
        return lines

    def _end_pod(self, index):
        """SIGKILL what pod ``index`` left: its process group and the processes with its mark."""
        _signal_group(self.processes[index], signal.SIGKILL)
        leftover_processes.stop_marked(POD_MARK, self.marks[index], grace=0)

    def stop(self):
        """SIGTERM every pod's group still running, SIGKILL after the grace period, then
        SIGKILL what any pod still holds. SIGTERM and SIGINT wait until it is done."""
        blocked = _block_stop_signals()
        try:
            for process in self.processes:
                if process.poll() is None:
                    _signal_group(process, signal.SIGTERM)
            deadline = time.monotonic() + GRACE_SECONDS
            for process in self.processes:
                try:
                    process.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            for index, process in enumerate(self.processes):
                self._end_pod(index)
                process.wait()
            for relay in self.relays:
                relay.join(timeout=2)
        finally:
            if blocked is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def run(self):
        self.start()
        finished = set()
        try:
            while len(finished) < len(self.processes):
                for index, (pod, process) in enumerate(zip(self.pods, self.processes)):
                    if pod.name in finished or process.poll() is None:
                        continue
                    finished.add(pod.name)
                    self._end_pod(index)  # what the pod left behind
                    if stopped_by_sigterm(process.returncode):
                        raise JobStopped(pod.name, process.returncode)
                    if process.returncode != 0:
                        raise JobFailed(pod.name, process.returncode)
                time.sleep(0.05)
        finally:
            self.stop()
        return [PodResult(pod.name, process.returncode)
                for pod, process in zip(self.pods, self.processes)]


def prepare_local_job(manifest, command=None, master_port=None, out=None, cwd=None,
                      allow_pod_commands=False, dry_run=False):
    """Validate ``manifest`` and build (without starting) its :class:`LocalJob`; notes on stderr.

    A pod command that installs packages or clones repositories (:func:`setup_steps`) is refused
    unless ``command`` replaces it or ``allow_pod_commands`` is given; with ``dry_run`` it is
    a note instead (nothing runs).
    """
    kind = validate_kubeflow_job(manifest)
    pods = job_pods(manifest, kind)
    envs, argvs, notes = [], [], []
    for pod in pods:
        env, pod_notes = pod_environment(pod, master_port)
        envs.append(env)
        argv = pod_argv(pod, env, command)
        argvs.append(argv)
        notes.extend(pod_notes)
        if command is None and not allow_pod_commands:
            steps = setup_steps(argv)
            if steps and dry_run:
                notes.append(messages.DRY_RUN_SETUP_NOTE.format(
                    pod=pod.name, what=_joined(steps)))
            elif steps:
                raise ManifestError(f"pod {pod.name}", messages.POD_COMMAND_SETS_UP.format(
                    what=_joined(steps), snippet=steps[0][1]))
    image = pods[0].container.get("image")
    if image:
        notes.append(f"image {image} is not pulled: the commands run on this machine")
    if command is not None:
        notes.append(f"every pod runs --command {command!r} instead of its container's command")
    return LocalJob(pods, argvs, envs, out=out, cwd=cwd), notes
