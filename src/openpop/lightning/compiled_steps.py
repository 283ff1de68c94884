"""A LightningModule step as the compiled backend runs it (``runtime/compiled/``).

The compiled backend traces ``StepModule.forward`` into one program per host call (a
``while_loop`` over the device iterations). Traced code may not change Python objects that exist
outside the micro-batch, so, there:

* ``self`` inside the step is a ``LoggingView`` of the LightningModule: ``self.log(name, value)``
  appends to a list made for this micro-batch, and everything else (attributes, submodules,
  ``self(x)``) is the module's; setting an attribute sets it on the module, which the program
  cannot do (the backend then declines: the model runs eagerly);
* the logged values become outputs of the step: ``(loss, extra, logs)`` in training,
  ``(output, logs)`` in evaluation. The program returns them for every micro-batch whatever the
  output mode (``compiled_micro_batch_leaves``) and ``StepModule.compiled_host_call_result``
  hands them to the call's ``StepLogs``, which reduces and logs them as for an eager call;
* ``batch_idx`` is a 0-d int64 tensor computed from the micro-batch's position: a Python int
  would be a constant of the program (Python branching on it makes the backend decline).

The names, options and batch sizes of the ``self.log`` calls come from the backend's probe, which
runs the step eagerly once on the first micro-batch (``LogSpec``): they must not depend on the
data. Logged values must be tensors (a ``torchmetrics.Metric`` or a number keeps the model eager).
"""
from openpop.runtime.compiled.eligibility import Ineligible

from . import messages
from .logs import log_options, logged_batch_size


class LoggingView:
    """``self`` for a traced step (see the module docstring)."""

    def __init__(self, module, records: list):
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_records", records)

    def __getattr__(self, name):
        return getattr(self._module, name)

    def __setattr__(self, name, value):
        setattr(self._module, name, value)

    def __call__(self, *args, **kwargs):
        return self._module(*args, **kwargs)

    def log(self, name, value, *args, **kwargs):
        self._records.append((name, value, args, kwargs))


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
