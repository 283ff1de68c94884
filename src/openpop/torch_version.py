"""The torch versions openpop runs on, checked when openpop is imported.

The eager backend uses torch's public API. The compiled backend and the profiler also use private
torch names (Dynamo, Inductor, the profiler's configuration), which change between torch's minor
versions without notice: openpop is checked against ``CHECKED`` (the suite passes on it). An older
torch is refused at import, naming the fix; a newer one than checked is allowed with one warning.
"""
import warnings

import torch

MINIMUM = (2, 13)  # also pyproject.toml's dependency
CHECKED = ((2, 13),)  # minor versions the whole suite has passed on

TOO_OLD = ("openpop needs torch {minimum} or newer; torch {found} is installed. "
           "Install a supported version: pip install torch=={checked}.0")
NOT_CHECKED = ("openpop was checked with torch {checked}; torch {found} is newer. The eager backend should work; "
               "the compiled backend and profiling use torch internals that may have changed "
               "(pip install torch=={checked}.0 to be sure).")


def minor_version(version: str) -> tuple:
    """``(major, minor)`` of a torch version string (``"2.13.0+cpu"`` -> ``(2, 13)``)."""
    parts = []
    for piece in version.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def check(version: str = torch.__version__) -> None:
    """Raise ``ImportError`` for a torch older than ``MINIMUM``; warn once for one newer than
    every ``CHECKED`` version."""
    found = minor_version(version)
    dotted = ".".join(map(str, CHECKED[-1]))
    if found < MINIMUM:
        raise ImportError(TOO_OLD.format(minimum=".".join(map(str, MINIMUM)), found=version, checked=dotted))
    if found not in CHECKED and found > CHECKED[-1]:
        warnings.warn(NOT_CHECKED.format(checked=dotted, found=version), RuntimeWarning, stacklevel=3)


check()
