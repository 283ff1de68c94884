"""Which backend runs a host call: ``Options.openpopBackend("auto"|"eager"|"compiled")``
(default from the environment variable ``OPENPOP_BACKEND``, else ``auto``).

``auto`` is a ski-rental rule: compiling costs a roughly fixed time C (seconds to tens of
seconds of Inductor) and then saves a fraction of every host call. Without knowing how long the
run will be, running eager until the eager host calls have taken ``compile_after`` seconds
(default 30, about C) and compiling then never costs more than twice the best choice in
hindsight - short runs (tests, notebooks) never pay for a compile; long runs pay it once.
"""
import os

from ... import errors
from .. import messages

BACKENDS = ("auto", "eager", "compiled")
ENV = "OPENPOP_BACKEND"
COMPILE_AFTER_ENV = "OPENPOP_COMPILE_AFTER"  # e.g. 0: run a test suite compiled wherever possible
DECLINED = object()  # the compiled backend's answer to a host call the eager backend runs


def check_backend(name) -> str:
    if name not in BACKENDS:
        raise errors.createPoptorchError(messages.UNKNOWN_BACKEND.format(name=name, backends=", ".join(BACKENDS),
                                                                         env=ENV))
    return name


def backend_from_env() -> str:
    return check_backend(os.environ.get(ENV, "auto") or "auto")


class Selection:
    """The per-executor decision: eager, compiled, or eager until the rental is paid."""

    def __init__(self, backend: str, compile_after: float):
        self.backend = check_backend(backend)
        self.compile_after = float(compile_after)
        self.eager_seconds = 0.0
        self.declined = None  # why the compiled backend cannot run this model (auto: once)

    @classmethod
    def from_options(cls, options):
        """Options win; unset, the environment (``OPENPOP_BACKEND``, ``OPENPOP_COMPILE_AFTER``)."""
        backend = options.openpop_backend if options.explicitlySet("openpop_backend") else backend_from_env()
        compile_after = options.compile_after
        if not options.explicitlySet("compile_after") and os.environ.get(COMPILE_AFTER_ENV):
            compile_after = float(os.environ[COMPILE_AFTER_ENV])
        return cls(backend, compile_after)

    @property
    def forced(self) -> bool:
        return self.backend == "compiled"

    def wants_compiled(self) -> bool:
        if self.backend == "eager" or self.declined is not None:
            return False
        return self.forced or self.eager_seconds >= self.compile_after

    def record_eager(self, seconds: float) -> None:
        self.eager_seconds += seconds
