"""``popart.PyStepIO`` / ``PyStepIOCallback`` / ``PyWeightsIO`` and PopART's element-count check."""
from typing import Callable

import numpy as np

from .errors import popart_exception

SIZE_ERROR = ("Unexpected number of input elements for Tensor {id}. Expected {expected}, but received {got}.\n"
              "To disable this check at your own risk, use IStepIO::enableRuntimeAsserts.\n"
              "This with, \n"
              "   replication  factor = {repl}\n"
              "   accumulation factor = {accl}\n"
              "   batches per step    = {bps}\n"
              "   Tensor nelms        = {nelms}\n")
OUTPUT_SIZE_ERROR = ("Unexpected number of output elements for Tensor {id}. Expected {expected}, but received "
                     "{got}.\nTo disable this check at your own risk, use IStepIO::enableRuntimeAsserts.")


STEPIO_NOT_CONTIGUOUS = ("PyStepIO is unable to use the numpy {io} array for tensor '{id}' as it is not c-contiguous "
                         "(a data conversion here could have a significant impact on performance and hence is not "
                         "allowed)")
WEIGHTSIO_NOT_CONTIGUOUS = ("PyWeightsIO is unable to use the provided numpy output array for tensor '{id}' as it is "
                            "not c-contiguous. Please use a function like `numpy.ascontiguousarray()` to make "
                            "contiguous before passing to PyWeightsIO")


def _contiguous(array, message: str, tensor_id: str, io: str = ""):
    """PopART's bindings take numpy arrays as they are, without a copy: one that is not C-contiguous is refused."""
    if isinstance(array, np.ndarray) and not array.flags.c_contiguous:
        raise popart_exception(message.format(io=io, id=tensor_id))
    return array


class PyStepIO:
    """Inputs by tensor id (numpy arrays holding every micro-batch of a ``run``) and the anchor
    arrays ``run`` writes into."""

    def __init__(self, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray]):
        for tensor_id, array in inputs.items():
            _contiguous(array, STEPIO_NOT_CONTIGUOUS, tensor_id, "input")
        for tensor_id, array in outputs.items():
            _contiguous(array, STEPIO_NOT_CONTIGUOUS, tensor_id, "output")
        self.inputs = dict(inputs)
        self.outputs = outputs
        self._asserts = True

    def enableRuntimeAsserts(self, b: bool) -> None:
        self._asserts = bool(b)

    def runtimeAssertsEnabled(self) -> bool:
        return self._asserts


class PyStepIOCallback:
    """Callbacks instead of buffers: ``input_callback(id, prefetch) -> np.ndarray`` for one
    micro-batch, ``input_complete_callback(id)``, ``output_callback(id) -> np.ndarray`` to write
    one micro-batch's anchor into, ``output_complete_callback(id)``."""

    def __init__(self, input_callback: Callable, input_complete_callback: Callable, output_callback: Callable,
                 output_complete_callback: Callable):
        self.input_callback = lambda tensor_id, prefetch: _contiguous(
            input_callback(tensor_id, prefetch), STEPIO_NOT_CONTIGUOUS, tensor_id, "input")
        self.input_complete_callback = input_complete_callback
        self.output_callback = lambda tensor_id: _contiguous(
            output_callback(tensor_id), STEPIO_NOT_CONTIGUOUS, tensor_id, "output")
        self.output_complete_callback = output_complete_callback
        self._asserts = True

    def enableRuntimeAsserts(self, b: bool) -> None:
        self._asserts = bool(b)

    def runtimeAssertsEnabled(self) -> bool:
        return self._asserts


class PyWeightsIO:
    """``{weight id: np.ndarray}`` for ``readWeights`` (filled) and ``writeWeights`` (read)."""

    def __init__(self, weights: dict[str, np.ndarray]):
        for tensor_id, array in weights.items():
            _contiguous(array, WEIGHTSIO_NOT_CONTIGUOUS, tensor_id)
        self.weights = weights

    def contains(self, tensor_id: str) -> bool:
        return tensor_id in self.weights


def check_input_size(tensor_id: str, array: np.ndarray, nelms: int, repl: int, accl: int, bps: int,
                     broadcast: bool = False) -> None:
    """PopART's input size assertion; a ``Broadcast`` input (ReplicatedStreamMode) has no replicas."""
    expected = nelms * (1 if broadcast else repl) * accl * bps
    if array.size != expected:
        raise popart_exception(SIZE_ERROR.format(id=tensor_id, expected=expected, got=array.size, repl=repl,
                                                 accl=accl, bps=bps, nelms=nelms))
