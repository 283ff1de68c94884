"""A LightningModule step as the compiled backend runs it (``runtime/compiled/``).

The compiled backend traces ``StepModule.forward`` into one program per host call (a
``while_loop`` over the device iterations). Traced code may not change Python objects that exist
outside the micro-batch, so, there:

* ``self`` inside the step is a ``LoggingView`` of the LightningModule: ``self.log(name, value)``
  appends to a list made for this micro-batch, the user's own methods (a shared step) are called
  with the view as ``self``, and everything else (attributes, submodules, ``self(x)``) is the
  module's; setting an attribute sets it on the module, which the program cannot do (the
  backend then declines: the model runs eagerly);
* the logged values become outputs of the step: ``(loss, extra, logs)`` in training,
  ``(output, logs)`` in evaluation. The program returns them for every micro-batch whatever the
  output mode (``compiled_micro_batch_leaves``) and ``StepModule.compiled_host_call_result``
  hands them to the call's ``StepLogs``, which reduces and logs them as for an eager call;
* ``batch_idx`` is a 0-d int64 tensor computed from the micro-batch's position: a Python int
  would be a constant of the program (Python branching on it makes the backend decline);
* Python values the step reads are constants of the program, re-traced by torch.compile when
  they change between host calls (``self.current_epoch``: once per epoch). Values that change
  between the optimizer steps of one host call cannot be constants: reading ``PER_STEP_STATE``
  (``self.global_step``, ``self.trainer``, ...) directly in the step keeps the model eager, and
  a value that changes at every host call ends in torch's recompile limit, after which the
  backend declines (eager from then on).

The names, options and batch sizes of the ``self.log`` calls come from the backend's probe, which
runs the step eagerly once on the first micro-batch (``LogSpec``): they must not depend on the
data. Logged values must be tensors (a ``torchmetrics.Metric`` or a number keeps the model eager).
"""
import functools
import inspect

from openpop.runtime.compiled import Ineligible

from . import messages
from .logs import log_options, logged_batch_size

# What a step may not read on the compiled backend: values that change between the optimizer
# steps of one host call (the program would see the value of its trace, for every step).
PER_STEP_STATE = frozenset({"global_step", "trainer", "_trainer", "optimizers", "lr_schedulers"})


class LoggingView:
    """``self`` for a traced step (see the module docstring). ``probing``: the backend's eager
    probe, where reading ``PER_STEP_STATE`` makes the model ineligible."""

    def __init__(self, module, records: list, probing: bool = False):
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_records", records)
        object.__setattr__(self, "_probing", probing)
        if probing and type(module) not in _USER_METHODS:
            _USER_METHODS[type(module)] = _user_methods(type(module))

    def __getattr__(self, name):
        if self._probing and name in PER_STEP_STATE:
            raise Ineligible(messages.COMPILED_STEP_STATE.format(name=name))
        cls = type(self._module)
        if name in _USER_METHODS.get(cls, ()):  # the user's helper (a shared step): its self.log too
            return functools.partial(getattr(cls, name), self)
        return getattr(self._module, name)

    def __setattr__(self, name, value):
        setattr(self._module, name, value)

    def __call__(self, *args, **kwargs):
        return self._module(*args, **kwargs)

    def log(self, name, value, *args, **kwargs):
        self._records.append((name, value, args, kwargs))


_USER_METHODS = {}  # LightningModule class -> names of methods its user classes define (filled by probes)


def _user_methods(cls) -> frozenset:
    """Plain methods defined by ``cls`` and its bases other than Lightning's and torch's."""
    names = set()
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] in ("lightning", "pytorch_lightning", "torch", "builtins"):
            continue
        names.update(name for name, attr in vars(klass).items()
                     if inspect.isfunction(attr) and not name.startswith("__"))
    return frozenset(names)


class LogSpec:
    """Name, options and batch size of each ``self.log`` call of a step, in call order."""

    def __init__(self, records, batch):
        self.entries = []
        for name, value, args, kwargs in records:
            if not hasattr(value, "detach") or not hasattr(value, "shape"):
                raise Ineligible(messages.COMPILED_LOG_VALUE.format(name=name, kind=type(value).__name__))
            options = log_options(args, kwargs)
            batch_size = options.get("batch_size") or logged_batch_size(batch)
            self.entries.append((name, options, batch_size))

    def __len__(self) -> int:
        return len(self.entries)


def micro_batch_index(geometry, global_position):
    """``batch_idx`` of the micro-batch at ``global_position`` (``host batch_idx x
    batches_per_call + position``): its index in a CPU run, as ``StepCall.micro_batch_index``."""
    per_iteration = geometry.gradient_accumulation * geometry.input_replicas
    return (global_position // per_iteration) * geometry.gradient_accumulation + \
        (global_position // geometry.input_replicas) % geometry.gradient_accumulation


def split_result(result, training: bool):
    """The program's result -> (the host call's result as eager returns it, the logged values)."""
    if training:
        loss, extra, logs = result
        return (loss, extra), logs
    output, logs = result
    return output, logs
