import json
import logging
import os
import signal
import sys
import tempfile

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
# A developer's executable cache (POPTORCH_CACHE_DIR) would make tests that count compiles or
# traces depend on what an earlier run left there; tests that want a cache give their own.
os.environ.pop("POPTORCH_CACHE_DIR", None)
# For the same reason the default cache (~/.cache/openpop/executables) is off; the tests of the
# default give it a directory of their own with OPENPOP_CACHE_DIR.
os.environ["OPENPOP_EXECUTABLE_CACHE"] = "0"

try:
    from hypothesis import settings as _hypothesis_settings
except ImportError:  # the test extra installs it; only the property-based tests import it
    pass
else:
    # The same examples on every run (derandomize), no clock in the outcome (the machine is shared and
    # loaded), no .hypothesis directory; tests set their own max_examples to keep the fuzzing short.
    _hypothesis_settings.register_profile("openpop", deadline=None, derandomize=True, database=None,
                                          max_examples=20, print_blob=False)
    _hypothesis_settings.load_profile("openpop")
    # Hypothesis's pytest plugin writes a patch of a failure's examples under its home directory
    # (.hypothesis/ in the working directory by default): keep the checkout clean.
    from hypothesis.configuration import set_hypothesis_home_dir
    set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "openpop-hypothesis"))


@pytest.fixture(autouse=True)
def _deterministic_seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(params=["eager", "compiled"])
def backend(request, monkeypatch):
    """The test runs twice: on the eager backend and on the compiled one (``OPENPOP_BACKEND`` is
    the default of every ``Options`` the test makes; "compiled" is forced, so a model it cannot run
    exactly raises instead of quietly running eagerly). Compiled runs use one thread: Inductor's
    kernels for tiny models are fastest so, and compiling competes with nothing."""
    monkeypatch.setenv("OPENPOP_BACKEND", request.param)
    threads = torch.get_num_threads()
    if request.param == "compiled":
        torch.set_num_threads(1)
    yield request.param
    torch.set_num_threads(threads)


@pytest.fixture
def one_thread():
    """Tiny models run fastest on one thread (and don't fight other processes for the cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def warnings_logged():
    """The messages poptorch's logger warns with during the test (a function returning them)."""
    from helpers.logs import logged
    with logged(logging.WARNING) as messages:
        yield messages


@pytest.fixture
def no_environment_session(monkeypatch):
    """No profile session from ``POPLAR_ENGINE_OPTIONS`` during the test, nor left behind by it."""
    from openpop.runtime import trace
    monkeypatch.delenv(trace.ENGINE_OPTIONS_ENV, raising=False)
    trace.reset_environment_session()
    yield
    trace.reset_environment_session()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A 4-stage pipelined model run for 3 host calls, calls 1 and 2 recorded."""
    from openpop.runtime import trace

    from helpers.profile_models import batch, pipelined_model
    os.environ.pop(trace.ENGINE_OPTIONS_ENV, None)
    trace.reset_environment_session()
    directory = tmp_path_factory.mktemp("profile")
    model = pipelined_model()
    x, target = batch()
    with trace.TraceSession(directory, calls=range(1, 3)):
        for _ in range(3):
            model(x, target)
    perf = model.getPerfCounters()
    plan = model.executionPlan()
    options = model.options.toDict()
    with open(directory / "trace.json") as stream:
        trace_json = json.load(stream)
    with open(directory / "report.json") as stream:
        report = json.load(stream)
    yield {"dir": directory, "trace": trace_json, "report": report, "perf": perf, "plan": plan, "options": options}
    model.destroy()


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
