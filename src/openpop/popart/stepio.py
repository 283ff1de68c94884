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


class PyStepIO:
    """Inputs by tensor id (numpy arrays holding every micro-batch of a ``run``) and the anchor
    arrays ``run`` writes into."""

    def __init__(self, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray]):
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
        self.input_callback = input_callback
        self.input_complete_callback = input_complete_callback
        self.output_callback = output_callback
        self.output_complete_callback = output_complete_callback
        self._asserts = True

    def enableRuntimeAsserts(self, b: bool) -> None:
        self._asserts = bool(b)

    def runtimeAssertsEnabled(self) -> bool:
        return self._asserts


class PyWeightsIO:
    """``{weight id: np.ndarray}`` for ``readWeights`` (filled) and ``writeWeights`` (read)."""

    def __init__(self, weights: dict[str, np.ndarray]):
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
