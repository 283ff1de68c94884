"""openpop's own settings, in one model: documented fields whose values come from ``OPENPOP_*``
environment variables (their defaults where unset). This is the one module that reads them.

    from openpop import openpop_settings
    openpop_settings.read("collective_timeout")        # 600.0, or OPENPOP_COLLECTIVE_TIMEOUT's value
    openpop_settings.SETTINGS                          # every field: its variable, default and meaning

Where an ``Options`` method sets the same thing for one model (``Options.openpopBackend``,
``Options.deviceMap``), the method wins; the field is what applies to options that do not call it.
Most fields are process-wide (the Lightning import hook, the all-reduce buckets, the host's memory
policy): they have no ``Options`` method. A value is read when it is needed, not cached, so a
variable set by a test or a launcher before that point applies.

The documentation's environment-variable page (``python -m openpop.env_vars``) takes its
"openpop's settings" table from ``SETTINGS``. Variables openpop's launchers set for the processes
they start (poprun, run-local) are listed in ``env_vars.py``; they are not settings.

Standard library only: the command-line tools import it without torch.
"""
import os
from dataclasses import dataclass
from typing import Any, Callable, Optional


def _text(raw: Optional[str]) -> Optional[str]:
    return raw or None


def _word(default: str) -> Callable:
    return lambda raw: (raw or default).lower()


def _number(kind, default) -> Callable:
    return lambda raw: kind(float(raw)) if raw else default


def _on_unless(*off_words: str) -> Callable:
    return lambda raw: (raw or "1").lower() not in off_words


def _names(raw: Optional[str]) -> tuple:
    return tuple(name.strip().lower() for name in (raw or "").split(",") if name.strip())


@dataclass(frozen=True)
class Setting:
    """One setting: ``field`` (its name here), ``env`` (the variable it is read from), ``parse``
    (the variable's text, or None when unset or empty, to the field's value: its default when
    unset), and for the documentation ``default`` (in words), ``meaning`` and ``see`` (a page of the
    documentation, relative to ``docs/``, with an optional ``#anchor``)."""

    field: str
    env: str
    parse: Callable[[Optional[str]], Any]
    default: str
    meaning: str
    see: str = ""

    def raw(self, environ=None) -> Optional[str]:
        """The variable's text, None when unset or empty."""
        return (os.environ if environ is None else environ).get(self.env) or None

    def read(self, environ=None) -> Any:
        return self.parse(self.raw(environ))


SETTINGS = (
    # --- devices and execution ---------------------------------------------------------------
    Setting("device_map", "OPENPOP_DEVICE_MAP", _text, "unset: every CUDA GPU round-robin, else the CPU",
            "The torch devices virtual IPUs run on, comma-separated (`cuda:0,cuda:1`, `cpu`). Virtual IPU "
            "`i` of replica `r` runs on entry `r * ipus_per_replica + i`, reused round-robin. Used when "
            "`Options.deviceMap()` is empty. poprun sets it for each instance on a GPU host.",
            see="coming-from-ipus.md#choosing-cpus-and-gpus"),
    Setting("concurrent_stages", "OPENPOP_CONCURRENT_STAGES", _word("auto"), "`auto`",
            "`auto`, `on` or `off`: whether pipeline stages on different devices run micro-batches "
            "concurrently on host threads. `auto` turns it on when the plan uses more than one device.",
            see="guides/model-parallelism.md#pipelining"),
    Setting("host_memory", "OPENPOP_HOST_MEMORY", _text, "`auto`",
            "`auto`, `retain` or `release`: whether the process keeps freed host memory for the next step "
            "(glibc `mallopt`). `auto` retains it once a training model is wrapped; `retain` for inference "
            "models too; `release` keeps glibc's defaults. Any other value is an error when a model is "
            "wrapped.",
            see="guides/poptorch.md#host-memory-between-steps"),
    # --- compiled backend ---------------------------------------------------------------------
    Setting("backend", "OPENPOP_BACKEND", _text, "`auto` (`openpop-bert`: `eager`)",
            "`auto`, `eager` or `compiled`: how host calls run, for options that do not call "
            "`Options.openpopBackend()`.",
            see="guides/compiled-backend.md"),
    Setting("compile_after", "OPENPOP_COMPILE_AFTER", _number(float, None),
            "unset: the estimated compile time of the model (30 s without an estimate)",
            "Seconds of eager host calls after which the `auto` backend compiles; `0` compiles at the first "
            "call. `Options.openpopBackend(\"auto\", compile_after=...)` wins.",
            see="guides/compiled-backend.md#when-auto-compiles"),
    Setting("compiled_unit", "OPENPOP_COMPILED_UNIT", lambda raw: raw or "auto", "`auto`",
            "`auto`, `program` or `regions`: what the compiled backend compiles - the whole host call as one "
            "program, or the model's blocks one by one with the host call run eagerly. `auto` takes regions "
            "for models whose ops each take about a millisecond or more.",
            see="guides/compiled-backend.md#program-or-regions"),
    Setting("cpu_gemm", "OPENPOP_CPU_GEMM", _text, "`auto`",
            "`auto`, `onednn` or `aten`: which library runs float32 matrix products in compiled regions on "
            "the CPU. `auto` times both once per process and takes oneDNN when it is at least 1.25x faster.",
            see="guides/compiled-backend.md#settings"),
    Setting("disable_passes", "OPENPOP_DISABLE_PASSES", _names, "unset: every pass whose probe passes",
            "Comma-separated names of openpop's Inductor and Dynamo passes to turn off (`attention_backward`, "
            "`dropout_masks`, `onednn_matmuls`, `kernel_batch`, `flat_operands`); torch's own path runs in "
            "their place.",
            see="reference/inductor-passes.md"),
    Setting("cache_lock_timeout", "OPENPOP_CACHE_LOCK_TIMEOUT", _number(float, 1800.0), "`1800`",
            "Seconds a process waits for another one compiling into the same executable cache directory "
            "before it compiles without the lock.",
            see="guides/compiled-backend.md#the-executable-cache"),
    Setting("executable_cache", "OPENPOP_EXECUTABLE_CACHE", _on_unless("0", "off", "false", "no"), "`1` (on)",
            "`0`, `off`, `false` or `no` turn off the default executable cache (`<OPENPOP_CACHE_DIR>/executables`), "
            "which the compiled backend uses when neither `POPTORCH_CACHE_DIR` nor "
            "`Options.enableExecutableCaching` names a directory.",
            see="guides/compiled-backend.md#the-executable-cache"),
    Setting("executable_cache_max_mb", "OPENPOP_EXECUTABLE_CACHE_MAX_MB", _number(float, 2048.0), "`2048`",
            "Size cap in MiB of the default executable cache: after a compile that leaves it larger, the least "
            "recently used files are deleted until it is at 80 % of the cap. A directory you name is not capped.",
            see="guides/compiled-backend.md#the-executable-cache"),
    # --- precision ----------------------------------------------------------------------------
    Setting("half_compute", "OPENPOP_HALF_COMPUTE", _text, "`auto`",
            "`auto`, `native` or `float32`: how CPUs compute the matmuls and convolutions of float16 and "
            "bfloat16 models. `auto` measures this CPU once per process and computes in float32 where "
            "half precision is slower. Read when a model is wrapped; any other value is an error there.",
            see="guides/precision.md#half-precision-at-cpu-speed"),
    Setting("half_overflow", "OPENPOP_HALF_OVERFLOW", _text, "`saturate`",
            "`saturate` or `inf`: what a float16 result too large for float16 becomes. `saturate` "
            "clamps it to +-65504, as the IPU does unless floating-point exceptions are enabled; `inf` "
            "is IEEE's overflow. Read when a model is wrapped; any other value is an error there.",
            see="guides/precision.md#float16-overflow-saturates"),
    # --- front-ends ---------------------------------------------------------------------------
    Setting("lightning_hook", "OPENPOP_LIGHTNING_HOOK", _on_unless("0", "off", "false", "no"), "`1` (on)",
            "`0`, `off`, `false` or `no` stop the import hook that adds `IPUStrategy` and friends to "
            "Lightning when it is imported; then `import openpop.lightning` does it.",
            see="guides/lightning.md#how-the-names-resolve"),
    Setting("popart_num_ipus", "OPENPOP_POPART_NUM_IPUS", _number(int, 64), "`64`",
            "How many virtual IPUs `popart.DeviceManager()` offers.",
            see="guides/popart.md#devices"),
    Setting("cache_dir", "OPENPOP_CACHE_DIR",
            lambda raw: raw or os.path.join(os.path.expanduser("~"), ".cache", "openpop"), "`~/.cache/openpop`",
            "Root of openpop's caches: `openpop-bert`'s data (corpus, tokenizer and examples go to `<root>/bert`; "
            "`--data-cache-dir` wins) and the default executable cache (`<root>/executables`).",
            see="guides/bert.md#data"),
    # --- scale-out ----------------------------------------------------------------------------
    Setting("collective_timeout", "OPENPOP_COLLECTIVE_TIMEOUT", _number(float, 600.0), "`600`",
            "Seconds before a collective across poprun's instances that does not complete fails with an "
            "error naming it. poprun's `--collective-timeout` sets it for every instance.",
            see="guides/scale-out.md#faults"),
    Setting("allreduce_bucket_mb", "OPENPOP_ALLREDUCE_BUCKET_MB", _number(float, 25.0), "`25`",
            "Size in MB of the buckets in which gradients are all-reduced across processes.",
            see="guides/scale-out.md#global-replication"),
    Setting("allreduce_overlap", "OPENPOP_ALLREDUCE_OVERLAP", _on_unless("0"), "`1` (on)",
            "`0` stops reducing gradient buckets during the last micro-batch's backward pass; they are then "
            "reduced after it.",
            see="guides/scale-out.md#global-replication"),
    Setting("horovod_compat", "OPENPOP_HOROVOD_COMPAT", lambda raw: raw != "0", "`1` (on)",
            "`0` stops `import horovod.torch` from finding openpop's compatibility layer when horovod is "
            "not installed.",
            see="guides/scale-out.md#horovod"),
)

BY_FIELD = {setting.field: setting for setting in SETTINGS}
BY_ENV = {setting.env: setting for setting in SETTINGS}


def setting(field: str) -> Setting:
    return BY_FIELD[field]


def env(field: str) -> str:
    """The environment variable of ``field``."""
    return BY_FIELD[field].env


def raw(field: str, environ=None) -> Optional[str]:
    """``field``'s variable as text, None when unset or empty."""
    return BY_FIELD[field].raw(environ)


def read(field: str, environ=None) -> Any:
    """``field``'s value: its variable parsed, or its default (``environ``: another environment than
    this process's, e.g. the one a launcher passes on)."""
    return BY_FIELD[field].read(environ)


def choice(field: str, choices: tuple, message: str, default: str = "auto", environ=None) -> str:
    """A setting chosen from a fixed set of words: ``field``'s variable lower-cased, or ``default``
    when unset or empty; another value raises ``ValueError`` with ``message`` (formatted with
    ``env`` and ``value``)."""
    text = raw(field, environ)
    value = (text or "").strip().lower() or default
    if value not in choices:
        raise ValueError(message.format(env=env(field), value=text))
    return value


# --- the compiled backend's words, checked where Options take them ------------------------------
BACKENDS = ("auto", "eager", "compiled")
UNITS = ("auto", "program", "regions")
UNKNOWN_BACKEND = ("Unknown openpop backend {name!r}: use one of {backends} "
                   "(Options.openpopBackend or the {env} environment variable).")
UNKNOWN_UNIT = ("Unknown compiled unit {name!r}: use one of {units} "
                "(Options.openpopBackend(..., unit=...) or the {env} environment variable).")


def check_backend(name) -> str:
    from . import errors
    if name not in BACKENDS:
        raise errors.createPoptorchError(UNKNOWN_BACKEND.format(name=name, backends=", ".join(BACKENDS),
                                                                env=env("backend")))
    return name


def check_unit(name) -> str:
    from . import errors
    if name not in UNITS:
        raise errors.createPoptorchError(UNKNOWN_UNIT.format(name=name, units=", ".join(UNITS),
                                                             env=env("compiled_unit")))
    return name
