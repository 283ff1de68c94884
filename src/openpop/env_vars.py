"""Every environment variable openpop reads, in one list.

The documentation's reference page (``docs/reference/environment-variables.md``) is generated from
``VARIABLES``; ``tests/test_docs.py`` checks that the page is current and that every ``OPENPOP_*``
name in ``src/openpop`` is listed here. Modules keep reading their variables themselves (most
through a name constant such as ``selection.ENV``); this module only describes them.

    python -m openpop.env_vars            # print the reference page (Markdown)
    python -m openpop.env_vars --write    # rewrite docs/reference/environment-variables.md
    python -m openpop.env_vars --check    # exit status 1 if that page is out of date

Standard library only: the command-line tools may import it without torch.
"""
import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

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
    # --- devices and execution ---------------------------------------------------------------
    EnvVar("OPENPOP_DEVICE_MAP", "unset: every CUDA GPU round-robin, else the CPU",
           "The torch devices virtual IPUs run on, comma-separated (`cuda:0,cuda:1`, `cpu`). Virtual IPU "
           "`i` of replica `r` runs on entry `r * ipus_per_replica + i`, reused round-robin. Used when "
           "`Options.deviceMap()` is empty. poprun sets it for each instance on a GPU host.",
           see="coming-from-ipus.md#choosing-cpus-and-gpus"),
    EnvVar("OPENPOP_CONCURRENT_STAGES", "`auto`",
           "`auto`, `on` or `off`: whether pipeline stages on different devices run micro-batches "
           "concurrently on host threads. `auto` turns it on when the plan uses more than one device.",
           see="guides/model-parallelism.md#pipelining"),
    EnvVar("OPENPOP_HOST_MEMORY", "`auto`",
           "`auto`, `retain` or `release`: whether the process keeps freed host memory for the next step "
           "(glibc `mallopt`). `auto` retains it once a training model is wrapped; `retain` for inference "
           "models too; `release` keeps glibc's defaults. Any other value is an error when a model is "
           "wrapped.",
           see="guides/poptorch.md#host-memory-between-steps"),
    # --- compiled backend ---------------------------------------------------------------------
    EnvVar("OPENPOP_BACKEND", "`auto` (`openpop-bert`: `eager`)",
           "`auto`, `eager` or `compiled`: how host calls run, for options that do not call "
           "`Options.openpopBackend()`.",
           see="guides/compiled-backend.md"),
    EnvVar("OPENPOP_COMPILE_AFTER", "unset: the estimated compile time of the model (30 s without an "
           "estimate)",
           "Seconds of eager host calls after which the `auto` backend compiles; `0` compiles at the first "
           "call. `Options.openpopBackend(\"auto\", compile_after=...)` wins.",
           see="guides/compiled-backend.md#when-auto-compiles"),
    EnvVar("OPENPOP_COMPILED_UNIT", "`auto`",
           "`auto`, `program` or `regions`: what the compiled backend compiles - the whole host call as one "
           "program, or the model's blocks one by one with the host call run eagerly. `auto` takes regions "
           "for models whose ops each take about a millisecond or more.",
           see="guides/compiled-backend.md#program-or-regions"),
    EnvVar("OPENPOP_CPU_GEMM", "`auto`",
           "`auto`, `onednn` or `aten`: which library runs float32 matrix products in compiled regions on "
           "the CPU. `auto` times both once per process and takes oneDNN when it is at least 1.25x faster.",
           see="guides/compiled-backend.md#settings"),
    EnvVar("OPENPOP_DISABLE_PASSES", "unset: every pass whose probe passes",
           "Comma-separated names of openpop's Inductor passes to turn off (`attention_backward`, "
           "`dropout_masks`, `onednn_matmuls`, `kernel_batch`); torch's own path runs in their place.",
           see="reference/inductor-passes.md"),
    EnvVar("OPENPOP_CACHE_LOCK_TIMEOUT", "`1800`",
           "Seconds a process waits for another one compiling into the same executable cache directory "
           "before it compiles without the lock.",
           see="guides/compiled-backend.md#the-executable-cache"),
    # --- precision ----------------------------------------------------------------------------
    EnvVar("OPENPOP_HALF_COMPUTE", "`auto`",
           "`auto`, `native` or `float32`: how CPUs compute the matmuls and convolutions of float16 and "
           "bfloat16 models. `auto` measures this CPU once per process and computes in float32 where "
           "half precision is slower. Read when a model is wrapped; any other value is an error there.",
           see="guides/precision.md#half-precision-at-cpu-speed"),
    # --- front-ends ---------------------------------------------------------------------------
    EnvVar("OPENPOP_LIGHTNING_HOOK", "`1` (on)",
           "`0`, `off`, `false` or `no` stop the import hook that adds `IPUStrategy` and friends to "
           "Lightning when it is imported; then `import openpop.lightning` does it.",
           see="guides/lightning.md#how-the-names-resolve"),
    EnvVar("OPENPOP_POPART_NUM_IPUS", "`64`",
           "How many virtual IPUs `popart.DeviceManager()` offers.",
           see="guides/popart.md#devices"),
    EnvVar("OPENPOP_CACHE_DIR", "`~/.cache/openpop`",
           "Root of `openpop-bert`'s data cache (corpus, tokenizer and examples go to `<root>/bert`); "
           "`--data-cache-dir` wins.",
           see="guides/bert.md#data"),
    # --- scale-out ----------------------------------------------------------------------------
    EnvVar("OPENPOP_COLLECTIVE_TIMEOUT", "`600`",
           "Seconds before a collective across poprun's instances that does not complete fails with an "
           "error naming it. poprun's `--collective-timeout` sets it for every instance.",
           see="guides/scale-out.md#faults"),
    EnvVar("OPENPOP_ALLREDUCE_BUCKET_MB", "`25`",
           "Size in MB of the buckets in which gradients are all-reduced across processes.",
           see="guides/scale-out.md#global-replication"),
    EnvVar("OPENPOP_ALLREDUCE_OVERLAP", "`1` (on)",
           "`0` stops reducing gradient buckets during the last micro-batch's backward pass; they are then "
           "reduced after it.",
           see="guides/scale-out.md#global-replication"),
    EnvVar("OPENPOP_HOROVOD_COMPAT", "`1` (on)",
           "`0` stops `import horovod.torch` from finding openpop's compatibility layer when horovod is "
           "not installed.",
           see="guides/scale-out.md#horovod"),
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
    EnvVar("POPTORCH_CACHE_DIR", "unset (no cache)",
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
