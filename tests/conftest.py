import logging
import os
import signal
import sys

import pytest
import torch

TESTS = os.path.dirname(os.path.abspath(__file__))
if TESTS not in sys.path:  # ``helpers`` imports whatever pytest's import mode (e.g. importlib)
    sys.path.insert(0, TESTS)

# A shell starts background jobs with SIGINT ignored, and Python then installs no KeyboardInterrupt
# handler: the Ctrl-C tests (signal.raise_signal(SIGINT)) need the handler an interactive run has.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The suite runs the eager backend (the reference) unless a test forces another with
# Options.openpopBackend: "auto" would compile any model whose eager calls pass 30 s, making a
# test's path depend on the machine's speed. Subprocesses inherit it.
os.environ.setdefault("OPENPOP_BACKEND", "eager")


@pytest.fixture(autouse=True)
def _deterministic_seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def one_thread():
    """Tiny models run fastest on one thread (and don't fight other processes for the cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def warnings_logged(caplog):
    """The messages poptorch's logger warns with during the test (a function returning them)."""
    import poptorch
    poptorch.logger.propagate = True
    try:
        with caplog.at_level(logging.WARNING, logger="poptorch::python"):
            yield lambda: [r.getMessage() for r in caplog.records]
    finally:
        poptorch.logger.propagate = False


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
