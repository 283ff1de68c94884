"""What poptorch's logger logged in a block, without pytest's caplog: how caplog attaches its
handlers changed between pytest releases (9.2 also attaches to the named logger, so a record that
propagates is captured twice), and a test counting log lines must not depend on that."""
import contextlib
import logging

LOGGER = "poptorch::python"


class _Collector(logging.Handler):
    def __init__(self):
        super().__init__(logging.NOTSET)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@contextlib.contextmanager
def logged(level=logging.INFO, name=LOGGER):
    """``with logged(logging.INFO) as messages:`` — ``messages()`` lists the messages of records
    at ``level`` or above that ``name``'s logger handled inside the block."""
    logger, collector = logging.getLogger(name), _Collector()
    previous = logger.level
    logger.setLevel(min(previous, level) if previous else level)  # never hides what the logger showed
    logger.addHandler(collector)
    try:
        yield lambda: [r.getMessage() for r in collector.records if r.levelno >= level]
    finally:
        logger.removeHandler(collector)
        logger.setLevel(previous)
