"""Every environment variable openpop reads, in one list.

The documentation's reference page (``docs/reference/environment-variables.md``) is generated from
``VARIABLES``; ``tests/test_docs.py`` checks that the page is current and that every ``OPENPOP_*``
name in ``src/openpop`` is listed here. openpop's own settings (the first group) are the fields of
``openpop_settings.SETTINGS``, the one module that reads them; the other groups are Graphcore's
variables openpop honours and those openpop's launchers set for the processes they start.

    python -m openpop.env_vars            # print the reference page (Markdown)
    python -m openpop.env_vars --write    # rewrite docs/reference/environment-variables.md
    python -m openpop.env_vars --check    # exit status 1 if that page is out of date

Standard library only: the command-line tools may import it without torch.
"""
import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from . import openpop_settings

OPENPOP = "openpop"
POPTORCH = "ipu-stack"
POPRUN = "poprun"
RUN_LOCAL = "run-local"

GROUP_TITLES = {
    OPENPOP: "openpop's settings",
    POPTORCH: "Graphcore's variables that openpop honours",
    POPRUN: "Set by poprun for each instance",
    RUN_LOCAL: "Set by openpop-k8s run-local for each pod",
}
GROUP_INTROS = {
    OPENPOP: "openpop's own switches. Where an `Options` method sets the same thing, the method wins.",
    POPTORCH: "Variables that PopTorch and Poplar read on IPUs; they mean the same here.",
    POPRUN: ("`poprun` sets these in every instance it launches. You do not normally set them; they are "
             "listed so that a script or a launcher of your own (torchrun) can read or provide them."),
    RUN_LOCAL: ("`openpop-k8s run-local` sets these in every pod it runs, besides the variables the Kubeflow "
                "controller injects."),
}


@dataclass(frozen=True)
class EnvVar:
    """One environment variable: its name, default, what it does and the guide that explains it.

    ``default`` is what applies when the variable is unset, in words; ``see`` is a page of the
    documentation relative to ``docs/`` (with an optional ``#anchor``)."""

    name: str
    default: str
    meaning: str
    group: str = OPENPOP
    see: str = ""


VARIABLES = (
    # openpop's own settings: documented, read and parsed in openpop_settings.py
    *(EnvVar(setting.env, setting.default, setting.meaning, see=setting.see) for setting in openpop_settings.SETTINGS),
    # --- Graphcore's ----------------------------------------------------------------------------
    EnvVar("POPTORCH_LOG_LEVEL", "`WARN`",
           "`TRACE`, `DEBUG`, `INFO`, `WARN`, `ERR` or `OFF`: the level of `poptorch.logger`. `INFO` shows "
           "the device allocation, the IPU-only settings that have no effect here, and openpop's choices "
           "(precision, compiled unit).",
           group=POPTORCH, see="troubleshooting.md#see-what-openpop-decided"),
    EnvVar("POPTORCH_DEFAULT_OPTIONS", "unset",
           "JSON applied to every new `poptorch.Options` with `Options.from_json`, e.g. "
           "`{\"deviceIterations\": 4}`.",
           group=POPTORCH, see="reference/api/options.md"),
    EnvVar("POPTORCH_CACHE_DIR", "unset (openpop's default cache, `~/.cache/openpop/executables`)",
           "The executable cache, as `Options.enableExecutableCaching(path)`: torch's compile caches "
           "live there, so a second process compiling the same model loads what the first compiled.",
           group=POPTORCH, see="guides/compiled-backend.md#the-executable-cache"),
    EnvVar("POPLAR_ENGINE_OPTIONS", "unset",
           "JSON. `autoReport.all` and `autoReport.directory` record a profile (trace, summary and HTML "
           "report) of the first host calls; `autoReport.executionProfileProgramRunCount` sets how many "
           "and openpop's `openpop.firstProfiledRun` from which call.",
           group=POPTORCH, see="guides/profiling.md"),
    # --- set by poprun --------------------------------------------------------------------------
    EnvVar("OPENPOP_POPRUN_GPUS", "set by poprun",
           "How many GPUs the instance's host has (0 on a CPU host); each instance's launch step splits "
           "them between the host's instances and writes its share to `OPENPOP_DEVICE_MAP`.",
           group=POPRUN, see="guides/scale-out.md#instances"),
    EnvVar("OPENPOP_DIST_BACKEND", "set by poprun; outside poprun `gloo`, or `cpu:gloo,cuda:nccl` when "
           "the model uses GPUs",
           "The torch.distributed backend of the instances' process group: `cpu:gloo,cuda:nccl` when every "
           "instance has GPUs of its own, else `gloo`.",
           group=POPRUN, see="guides/scale-out.md#instances"),
    EnvVar("POPDIST_NUM_TOTAL_REPLICAS", "set by poprun", "`--num-replicas`: replicas in the whole job.",
           group=POPRUN, see="guides/scale-out.md#instances"),
    EnvVar("POPDIST_NUM_LOCAL_REPLICAS", "set by poprun", "Replicas of this instance.",
           group=POPRUN, see="guides/scale-out.md#instances"),
    EnvVar("POPDIST_NUM_IPUS_PER_REPLICA", "set by poprun", "`--ipus-per-replica`.",
           group=POPRUN, see="guides/scale-out.md#instances"),
    EnvVar("POPDIST_REPLICA_INDEX_OFFSET", "set by poprun",
           "Index of this instance's first replica (instance index x local replicas).",
           group=POPRUN, see="guides/scale-out.md#instances"),
    EnvVar("POPDIST_LOCAL_INSTANCE_INDEX", "set by poprun", "Index of this instance on its host.",
           group=POPRUN, see="guides/scale-out.md#instances"),
    EnvVar("OMPI_COMM_WORLD_SIZE", "set by poprun",
           "Instances in the job, as mpirun set it; `poptorch.Options().Distributed` reads it (with "
           "`OMPI_COMM_WORLD_RANK`, the instance's index).",
           group=POPRUN, see="guides/scale-out.md#instances"),
    EnvVar("OPENPOP_POPRUN_JOB", "set by poprun (a random value per run)",
           "Marks the processes of one poprun job: when the job ends, poprun stops every process still "
           "running with this value in its environment (children of a killed instance, daemons). A "
           "process that drops it from its environment is not found.",
           group=POPRUN, see="guides/faults.md#nothing-outlives-the-job"),
    EnvVar("OPENPOP_RUN_LOCAL_POD", "set by run-local (a random value per pod)",
           "Marks the processes of one pod: when the pod's main process ends, every process with this "
           "value in its environment is killed with it, as a container's processes end with it.",
           group=RUN_LOCAL, see="guides/faults.md#nothing-outlives-the-job"),
)

BY_NAME = {variable.name: variable for variable in VARIABLES}

PAGE = Path("docs") / "reference" / "environment-variables.md"
GENERATED_NOTE = ("<!-- Generated by `python -m openpop.env_vars --write` from src/openpop/env_vars.py; "
                  "edit that file, not this page. -->")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _link(see: str) -> str:
    """A link from the reference page (``docs/reference/``) to ``see`` (relative to ``docs/``)."""
    return f"[more](../{see})" if see else ""


def markdown() -> str:
    """The reference page, as Markdown."""
    lines = [GENERATED_NOTE, "", "# Environment variables", "",
             "Every environment variable openpop reads. Options set in code win over the environment "
             "where both exist. This page is generated from `src/openpop/env_vars.py`.", ""]
    for group, title in GROUP_TITLES.items():
        lines += [f"## {title}", "", GROUP_INTROS[group], "",
                  "| variable | default | what it does | |", "|---|---|---|---|"]
        for variable in VARIABLES:
            if variable.group == group:
                lines.append(f"| `{variable.name}` | {_cell(variable.default)} | {_cell(variable.meaning)} | "
                             f"{_link(variable.see)} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m openpop.env_vars",
                                     description="Print, write or check the environment-variable reference page.")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help=f"rewrite {PAGE} (run from the repository root)")
    action.add_argument("--check", action="store_true", help=f"exit with status 1 if {PAGE} is out of date")
    parser.add_argument("--page", type=Path, default=PAGE, help=f"the page's path (default: {PAGE})")
    args = parser.parse_args(argv)
    text = markdown()
    if args.write:
        args.page.write_text(text, encoding="utf-8")
    elif args.check:
        current = args.page.read_text(encoding="utf-8") if args.page.exists() else ""
        if current != text:
            print(f"{args.page} is out of date: run python -m openpop.env_vars --write", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
