"""The settings a script gives that steer only IPU hardware, named once at INFO.

Graphcore's applications set memory proportions, tensor locations, tile and IO settings, Poplar
engine options and dozens of PopART session options (``opts._Popart.set(key, value)``). They
have no meaning on CPUs and GPUs: openpop accepts and keeps them (``Options`` prints them, the
report lists them) and changes nothing. So that a user can see what was ignored, the first model
built with a given set of such settings logs one INFO line naming them.

Which ``_Popart`` keys openpop reads is listed here (``POPART_KEYS_READ``); every other key a
script sets is IPU-only.
"""
import logging

from .log import logger

#: ``_Popart`` keys openpop acts on (recomputation, cycle counter, profiling through engine
#: options, precision, synthetic data, the executable cache).
POPART_KEYS_READ = frozenset({
    "autoRecomputation", "instrumentWithHardwareCycleCounter", "engineOptions", "partialsTypeMatMuls",
    "enableStochasticRounding", "enableFloatingPointChecks", "syntheticDataMode", "enableEngineCaching",
    "cachePath", "patterns_level", "patterns",
})
#: Keys of ``engineOptions`` openpop acts on: a profile report.
ENGINE_OPTIONS_READ = ("autoReport.",)
#: ``Options`` values that only steer IPU hardware, by the setter a script called.
IPU_ONLY_OPTION_VALUES = {
    "available_memory_proportion": "setAvailableMemoryProportion",
    "location_activation": "TensorLocations.setActivationLocation",
    "location_weight": "TensorLocations.setWeightLocation",
    "location_optimizer": "TensorLocations.setOptimizerLocation",
    "location_accumulator": "TensorLocations.setAccumulatorLocation",
    "num_io_tiles": "TensorLocations.numIOTiles",
    "sync_pattern": "syncPattern",
}

_logged: set = set()


def ipu_only_settings(options) -> list[str]:
    """The IPU-only settings ``options`` were given, as a script would name them."""
    names = [setter for group in (options, options.TensorLocations)
             for key, setter in IPU_ONLY_OPTION_VALUES.items() if _was_set(group, key)]
    popart = options._Popart.options
    defaults = type(options)()._Popart.options  # what PopTorch itself sets, not the script
    for key in sorted(popart):
        if key in defaults and _same(popart[key], defaults[key]):
            continue
        if key == "engineOptions":
            names += [f"engineOptions[{name}]" for name in sorted(popart[key] or {})
                      if not name.startswith(ENGINE_OPTIONS_READ)]
        elif key not in POPART_KEYS_READ:
            names.append(f"_Popart.{key}")
    return names


# Of the keys above, those every ``Options`` holds (with a default); the others exist once set.
_WITH_DEFAULTS = frozenset({"available_memory_proportion", "sync_pattern"})


def _was_set(group, key: str) -> bool:
    if key not in getattr(group, "_values", {}):
        return False
    return group.explicitlySet(key) if key in _WITH_DEFAULTS else True


def _same(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return False


def log_ipu_only_settings(options) -> None:
    """Log, once per process for each distinct list, the IPU-only settings ``options`` hold."""
    if not logger.isEnabledFor(logging.INFO):
        return  # (listing them builds a default Options: not worth it for a line nobody sees)
    names = tuple(ipu_only_settings(options))
    if names and names not in _logged:
        _logged.add(names)
        logger.info("These settings only steer IPU hardware; openpop keeps them and they change nothing "
                    "on CPUs/GPUs: %s", ", ".join(names))
