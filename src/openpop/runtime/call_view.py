"""``CallView``: what a backend may read of the executor whose host calls it runs.

Backends (``backends.py``) never touch ``PoplarExecutor``'s attributes: they get one view per
executor, whose properties read the executor's current state (the optimizer may be replaced by
``setOptimizer``, the session and executable appear at compile). The view has no setters: what a
backend changes it changes in the objects it is given (the session, the weights, the optimizer),
and what it reports back (timings, which backend ran) it returns or keeps on itself.
"""


class CallView:
    """Read-only view of an executor for its backends (see the module docstring)."""

    __slots__ = ("_executor",)

    def __init__(self, executor):
        self._executor = executor

    @property
    def settings(self):
        """``RunSettings``: the typed settings the executor runs with."""
        return self._executor._settings

    @property
    def geometry(self):
        """``BatchGeometry``: device iterations, accumulation, replicas and micro-batch sizes."""
        return self._executor._settings.geometry

    @property
    def training(self) -> bool:
        """True for a ``trainingModel``."""
        return self._executor._training

    @property
    def model(self):
        """The module the executor runs (Lightning's step module, a PopART graph, or the user's)."""
        return self._executor._model

    @property
    def user_model(self):
        """The user's model (``poptorch.trainingModel(model)``'s ``model``)."""
        return self._executor._user_model

    @property
    def optimizer(self):
        """The optimizer of the next step (training; None for inference)."""
        return self._executor._optimizer

    @property
    def precision(self):
        """``RunPrecision``: autocast, half compute, loss scaling."""
        return self._executor._precision

    @property
    def session(self):
        """``DeviceSession`` (placement, replicas), once compiled."""
        return self._executor._session

    @property
    def schedule(self):
        """The micro-batch schedule (``schedules.py``), once compiled."""
        return self._executor._schedule

    @property
    def executable(self):
        """``Executable``, once compiled."""
        return self._executor._executable

    @property
    def processes(self):
        """``GlobalReplication`` or ``SingleProcess`` (training), once compiled."""
        return self._executor._processes

    @property
    def signature(self):
        """``inspect.Signature`` of the model's ``forward``."""
        return self._executor._signature

    @property
    def compile_cache(self):
        """The executable cache (``compile_cache.py``), or None when it is off."""
        return self._executor._compile_cache

    @property
    def identity(self):
        """The executor as a key (trace sessions know executors by identity); not for reading its state."""
        return self._executor
