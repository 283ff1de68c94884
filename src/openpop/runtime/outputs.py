"""Output modes: which micro-batch results a host call returns, and in what shape.

Per micro-batch, the model returns a structure of tensors. Over a host call they are collected
in loop order ``[DI, GA, R]`` and assembled per leaf:

* ``All``    every micro-batch                        -> rows ``DI*GA*R``
* ``EveryN`` device iterations N-1, 2N-1, ...          -> rows ``DI*GA*R/N``
* ``Final``  the last accumulation step of the last DI -> rows ``R``
* ``Sum``    per replica, summed over DI and GA        -> rows ``R``

When the row count is 1 a leaf keeps its shape (a scalar loss stays 0-d); otherwise scalars
become ``[1]`` and leaves are concatenated on dim 0. Returned int64 become int32 and float64
become float32, as PopTorch returns them.
"""
import torch

from .. import errors
from ..enums import OutputMode
from ..torch_compat import FakeTensor, pytree
from .geometry import BatchGeometry

_DEMOTE = {torch.int64: torch.int32, torch.float64: torch.float32}


class OutputCollector:
    """Accumulates one host call's outputs according to the output mode."""

    def __init__(self, mode: OutputMode, period: int, geometry: BatchGeometry):
        self.mode = OutputMode(mode)
        self.period = period if self.mode == OutputMode.EveryN else 1
        self.geometry = geometry
        self.replicas = geometry.replication_factor
        if self.mode == OutputMode.All:
            rows = geometry.output_rows_per_call
        elif self.mode == OutputMode.EveryN:
            rows = geometry.output_rows_per_call // self.period
        else:
            rows = self.replicas
        self.rows = rows
        self._spec = None
        self._added = False
        self._kept = []  # flat leaf lists, in loop order
        self._sums = [None] * self.replicas

    def wants(self, iteration: int, accumulation: int) -> bool:
        """Whether the micro-batch at (iteration, accumulation) contributes to the result."""
        last = (iteration == self.geometry.device_iterations - 1
                and accumulation == self.geometry.gradient_accumulation - 1)
        return returned(self.mode, self.period, iteration, last)

    def add(self, replica: int, output) -> None:
        leaves, spec = flatten_output(output)
        self._spec = spec
        self._added = True
        leaves = [leaf.detach() if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
        if self.mode == OutputMode.Sum:
            current = self._sums[replica]
            if current is None:
                self._sums[replica] = leaves
            else:
                self._sums[replica] = [c + leaf if isinstance(leaf, torch.Tensor) else leaf
                                       for c, leaf in zip(current, leaves)]
        else:
            self._kept.append(leaves)

    def result(self):
        if not self._added:
            return None
        rows = self._sums if self.mode == OutputMode.Sum else self._kept
        assembled = [_assemble_leaf([row[i] for row in rows], self.rows) for i in range(len(rows[0]))]
        return _unflatten(assembled, self._spec)


def returned(mode: OutputMode, period: int, iteration: int, last: bool) -> bool:
    """Whether an output mode returns what device iteration ``iteration`` produced (``last``:
    the call's final one)."""
    if mode == OutputMode.All or mode == OutputMode.Sum:
        return True
    if mode == OutputMode.Final:
        return last
    return (iteration + 1) % period == 0


def _assemble_leaf(values, row_count):
    first = values[0]
    if not isinstance(first, torch.Tensor):
        if row_count > 1 and len(values) > 1 and all(type(v) is list for v in values):
            return [item for v in values for item in v]  # e.g. per-sample ids, kept in row order
        return values[-1]
    if row_count == 1 and len(values) == 1:
        out = first.clone()  # never alias a live model tensor (a returned parameter, an input)
    else:
        if any(isinstance(v, torch.Tensor) and v.device != first.device for v in values):
            values = [v.cpu() for v in values]  # replicas on different devices
        out = torch.cat([v.reshape(1) if v.dim() == 0 else v for v in values], dim=0)
    out = out.cpu()  # one device-to-host copy per output, after the call
    out = out.to(_DEMOTE[out.dtype]) if out.dtype in _DEMOTE else out
    return protect_output(out)


def _raise_backward(*args, **kwargs):
    raise errors.createPoptorchError(errors.BACKWARD_ON_OUTPUT)


def protect_output(tensor: torch.Tensor) -> torch.Tensor:
    """Returned tensors refuse ``.backward()`` with PopTorch's explanation."""
    tensor.backward = _raise_backward
    return tensor


_TUPLE_OF_TENSORS = "tuple of tensors"


def flatten_output(output):
    """``(leaves, spec)`` of a model output, the one walk used for collecting and finding the loss."""
    if isinstance(output, torch.Tensor):
        return [output], None
    if type(output) is tuple and all(type(o) is torch.Tensor or type(o) is FakeTensor for o in output):
        return list(output), _TUPLE_OF_TENSORS  # (fake tensors: a run on shapes only, shapes_only.py)
    return pytree.tree_flatten(output, is_leaf=_is_plain_list)


def _is_plain_list(value) -> bool:
    """A list holding no tensors (e.g. sample ids) is one output leaf, concatenated across rows."""
    return type(value) is list and not any(isinstance(v, torch.Tensor) or isinstance(v, (list, tuple, dict))
                                           for v in value)


def _unflatten(leaves, spec):
    if spec is None:
        return leaves[0]
    if spec is _TUPLE_OF_TENSORS:
        return tuple(leaves)
    return pytree.tree_unflatten(leaves, spec)
