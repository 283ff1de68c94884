"""``POPLAR_ENGINE_OPTIONS`` (and ``Options.enableProfiling``'s engine options) as JSON: the
keys openpop reads, checked before the first host call runs."""
import json
import os

from .. import errors
from ..log import logger
from . import messages

ENGINE_OPTIONS_ENV = "POPLAR_ENGINE_OPTIONS"
KNOWN_AUTOREPORT_KEYS = (
    "autoReport.all", "autoReport.directory", "autoReport.outputGraphProfile",
    "autoReport.outputExecutionProfile", "autoReport.outputLoweredVars", "autoReport.outputDebugInfo",
    "autoReport.outputSerializedGraph", "autoReport.outputArchive", "autoReport.streamAtEveryRun",
    "autoReport.executionProfileProgramRunCount", "autoReport.optimizeForLongExecutions")
FIRST_RUN_KEY = "openpop.firstProfiledRun"
WARMUP_KEY = "openpop.warmupCalls"  # the report leaves a model's first N host calls out (default 1)
KNOWN_OPENPOP_KEYS = (FIRST_RUN_KEY, WARMUP_KEY)


def parse_engine_options(text: str, source: str = ENGINE_OPTIONS_ENV) -> dict:
    """``POPLAR_ENGINE_OPTIONS``'s JSON: a clear error when malformed, a warning per unknown
    ``autoReport.*`` key."""
    if not text.strip():
        return {}
    try:
        options = json.loads(text)
    except json.JSONDecodeError as exc:
        raise errors.createPoptorchError(messages.ENGINE_OPTIONS_JSON.format(
            source=source, error=exc.msg, pos=exc.pos, text=errors.shorten(text))) from None
    except RecursionError:
        raise errors.createPoptorchError(messages.ENGINE_OPTIONS_JSON.format(
            source=source, error=errors.JSON_TOO_DEEP, pos=0, text=errors.shorten(text))) from None
    if not isinstance(options, dict):
        raise errors.createPoptorchError(messages.ENGINE_OPTIONS_OBJECT.format(
            source=source, type=type(options).__name__, text=errors.shorten(text)))
    for key in options:
        for prefix, known in (("autoReport.", KNOWN_AUTOREPORT_KEYS), ("openpop.", KNOWN_OPENPOP_KEYS)):
            if key.startswith(prefix) and key not in known:
                logger.warning(messages.ENGINE_OPTION_UNKNOWN, source, key, ", ".join(known))
    return options


def truthy(value) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes", "on")


def count_option(options, key, default) -> int:
    value = options.get(key, default)
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: JSON's Infinity
        number = -1
    if number < 0 or isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise errors.createPoptorchError(messages.ENGINE_OPTION_COUNT.format(key=key, value=value))
    return number


def directory_option(options, key, default=".") -> str:
    """A directory named by an engine option: a path without NUL characters."""
    value = options.get(key, default)
    if not isinstance(value, (str, os.PathLike)) or "\0" in os.fspath(value):
        raise errors.createPoptorchError(messages.ENGINE_OPTION_DIRECTORY.format(key=key, value=value))
    return os.fspath(value)
