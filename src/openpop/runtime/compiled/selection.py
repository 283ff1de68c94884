"""Which backend runs a host call: ``Options.openpopBackend("auto"|"eager"|"compiled")``
(default from the environment variable ``OPENPOP_BACKEND``, else ``auto``).

``auto`` is a ski-rental rule: compiling costs a time C (seconds for a tiny model, many minutes
for BERT) and then saves a fraction of every host call. Without knowing how long the run will be,
running eager until the eager host calls have taken C seconds and compiling then never costs
more than twice the best choice in hindsight - short runs (tests, notebooks) never pay for a
compile; long runs pay it once. C is ``compile_after`` when given (``openpopBackend("auto",
compile_after=...)`` or ``OPENPOP_COMPILE_AFTER``), else ``compile_cost.py``'s estimate for this
program, made at the first host call (``DEFAULT_COMPILE_AFTER`` when the model cannot be probed).

What the compiled backend compiles is its *unit* (``openpopBackend(..., unit=...)``, else
``OPENPOP_COMPILED_UNIT``, else ``auto``): ``"program"``, the whole host call as one program
(``program.py``), or ``"regions"``, the model's blocks compiled one by one (torch's regional
compilation) in the eager host call (``regions.py``). ``auto`` takes regions when the probe
micro-batch does at least ``regions.REGIONS_FLOPS_PER_OP`` floating-point operations per aten op
(the host's share of a step is then negligible, and the whole program's compile is not) and the
model has regions, the program otherwise.

``auto`` keeps a model eager for good when compiling cannot pay (``compiling_pays``): on the CPU,
a model whose FLOPs are mostly convolutions and whose aten ops are large. Inductor calls the same
oneDNN convolutions eager calls, the host's share of such a step is a few percent, and the
batch-norm, pooling and layout copies Inductor generates around the convolutions cost more than
aten's own kernels: torchvision's ResNet-18 (batch 2, 224x224, float32, SGD; 2-core EPYC, 2 threads)
trains in 147 ms a step eagerly, 170 ms as a compiled program and 186 ms with compiled regions (a
hand-written loop under ``torch.compile``: 164 against its eager 159). Small convolutional models,
whose steps are mostly host work, still compile (``benchmarks/host_overhead.py``'s CNN: 0.41x its
eager loop). ``compile_after`` and ``unit`` given by the user, and ``openpopBackend("compiled")``,
are not second-guessed.

Neither choice reads a clock: the eager seconds the rental counts are estimated from the probe's
counts (``compile_cost.eager_call_seconds``) and the unit's rule counts FLOPs, so the same program
switches at the same host call, to the same unit, on a busy machine as on an idle one.
"""
from ... import openpop_settings
from ...log import logger
from ...openpop_settings import BACKENDS, UNITS, check_backend, check_unit  # noqa: F401  (the words Options take)
from .. import messages

ENV = openpop_settings.env("backend")
UNIT_ENV = openpop_settings.env("compiled_unit")
COMPILE_AFTER_ENV = openpop_settings.env("compile_after")  # e.g. 0: run a test suite compiled wherever possible
DEFAULT_COMPILE_AFTER = 30.0  # seconds: C when there is no estimate


def backend_from_env(default: str = "auto") -> str:
    """``OPENPOP_BACKEND`` if set, else ``default``."""
    default = check_backend(default)
    return check_backend(openpop_settings.raw("backend") or default)


#: ``compiling_pays``: on the CPU, convolutions holding at least this share of a micro-batch's FLOPs...
CONVOLUTION_SHARE = 0.5
#: ...at this many FLOPs per aten op or more (the host's ~10 us per op then ~5 % of the step or less)
CONVOLUTION_FLOPS_PER_OP = 1e7


def compiling_pays(flops: float, convolution_flops: float, ops: int, device_type: str) -> bool:
    """Whether ``auto`` may compile a model whose probe micro-batch ran ``ops`` aten ops doing
    ``flops`` floating-point operations, ``convolution_flops`` of them in convolutions (module
    docstring): False for convolution-bound CPU models."""
    if device_type != "cpu" or flops <= 0:
        return True
    return not (convolution_flops >= CONVOLUTION_SHARE * flops and flops / max(ops, 1) >= CONVOLUTION_FLOPS_PER_OP)


class Selection:
    """The per-executor decision: eager, compiled, or eager until the rental is paid."""

    def __init__(self, backend: str, compile_after=None, unit: str = "auto"):
        self.backend = check_backend(backend)
        self.unit = check_unit(unit)  # "auto" until the backend chooses (backend.py)
        self.compile_after = None if compile_after is None else float(compile_after)  # None: estimate
        self.cost = None  # compile_cost.CompileCost, once estimated
        self.estimated = False
        self.eager_seconds = 0.0
        self.declined = None  # why the compiled backend cannot run this model (auto: once)
        self.not_paying = None  # why ``auto`` keeps this model eager although it could compile it
        self._decided = False
        self.announcement = None  # why ``auto`` compiles mid-run, for the bar's first line (take_announcement)

    @classmethod
    def from_options(cls, options):
        """Options win; unset, the environment (``OPENPOP_BACKEND``, ``OPENPOP_COMPILE_AFTER``)."""
        backend = options.openpop_backend if options.explicitlySet("openpop_backend") else backend_from_env()
        compile_after = options.compile_after if options.explicitlySet("compile_after") else None
        if compile_after is None:
            compile_after = openpop_settings.read("compile_after")
        unit = options.compiled_unit if options.explicitlySet("compiled_unit") \
            else openpop_settings.read("compiled_unit")
        return cls(backend, compile_after, unit)

    @property
    def forced(self) -> bool:
        return self.backend == "compiled"

    @property
    def needs_estimate(self) -> bool:
        """Whether the first host call probes: ``auto``, unless ``compile_after`` is 0 (compile at
        once). With a ``compile_after`` the probe still counts what an eager call costs."""
        return self.backend == "auto" and self.compile_after != 0 and not self.estimated \
            and self.declined is None

    def keep_eager(self, reason: str) -> None:
        """``auto`` found that compiling this model would not pay (``compiling_pays``): eager for good."""
        self.declined = self.not_paying = reason
        logger.info(messages.AUTO_STAYS_EAGER, reason)

    def set_cost(self, cost) -> None:
        """The estimate (a ``CompileCost``, or None: the model could not be probed)."""
        self.cost, self.estimated = cost, True

    @property
    def budget(self):
        """Seconds of eager host calls after which ``auto`` compiles (None: not known yet)."""
        if self.compile_after is not None:
            return self.compile_after
        if not self.estimated:
            return None
        return DEFAULT_COMPILE_AFTER if self.cost is None else self.cost.seconds

    def wants_compiled(self) -> bool:
        if self.backend == "eager" or self.declined is not None:
            return False
        if self.forced:
            return True
        budget = self.budget
        if budget is None or self.eager_seconds < budget:
            return False
        if not self._decided and budget > 0:
            self._decided = True
            logger.info(messages.AUTO_COMPILES, self.eager_seconds, budget, self._basis())
            self.announcement = messages.AUTO_COMPILES_NOW.format(eager=self.eager_seconds,
                                                                  basis=f"{budget:.1f} s, {self._basis()}")
        return True

    def take_announcement(self):
        """Why the model compiles now, once (None: no mid-run switch to say)."""
        announcement, self.announcement = self.announcement, None
        return announcement

    def _basis(self) -> str:
        if self.compile_after is not None:
            return "compile_after"
        cost = self.cost
        if cost is None:
            return "default"
        warm = ", warm" if cost.warm else ""
        if cost.regions:
            return messages.AUTO_ESTIMATE_REGIONS.format(ops=cost.ops, regions=cost.regions, warm=warm)
        return messages.AUTO_ESTIMATE.format(ops=cost.ops, unrolled=cost.unrolled, tensors=cost.tensors, warm=warm)

    def record_eager(self, seconds: float) -> None:
        self.eager_seconds += seconds
