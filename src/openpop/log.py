"""PopTorch-style logging: ``poptorch.logger``, ``setLogLevel`` and ``POPTORCH_LOG_LEVEL``.

Records look like PopTorch's: ``[HH:MM:SS.mmm] [poptorch::python] [warning] message``.
"""
import datetime
import logging
import os
import sys

from . import errors

_LEVELS = {
    "TRACE": 5,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "ERR": logging.ERROR,
    "OFF": logging.CRITICAL + 10,
}
logging.addLevelName(5, "trace")
_LEVEL_NAMES = {5: "trace", logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warning",
                logging.ERROR: "error", logging.CRITICAL: "critical"}


class _PopTorchFormatter(logging.Formatter):
    def format(self, record):
        stamp = datetime.datetime.fromtimestamp(record.created).strftime("%H:%M:%S.%f")[:-3]
        level = _LEVEL_NAMES.get(record.levelno, record.levelname.lower())
        return f"[{stamp}] [poptorch::python] [{level}] {record.getMessage()}"


logger = logging.getLogger("poptorch::python")
_handler = logging.StreamHandler(sys.stderr)
_handler.setFormatter(_PopTorchFormatter())
logger.addHandler(_handler)
logger.propagate = False


def setLogLevel(level):
    """Set the level by name (TRACE, DEBUG, INFO, WARN, ERR, OFF) or by integer 0-6."""
    if isinstance(level, int):
        by_number = [5, logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL,
                     logging.CRITICAL + 10]
        if not 0 <= level < len(by_number):
            raise ValueError(errors.LOG_LEVEL_INTEGER)
        logger.setLevel(by_number[level])
        return
    if level not in _LEVELS:
        raise ValueError(errors.LOG_LEVEL_UNKNOWN.format(level=level))
    logger.setLevel(_LEVELS[level])


setLogLevel(os.environ.get("POPTORCH_LOG_LEVEL", "WARN"))
