"""One micro-batch run on shapes only: the model's forward (and backward) with its inputs as fake
tensors (``torch._subclasses.FakeTensorMode``), which compute shapes, dtypes and autograd graphs
but no values.

What compiling needs from a micro-batch - the outputs' structure, the loss among them, the blocks,
the buffers the forward changes, whether it draws random numbers, the aten op sequence that keys
a saved program - depends on shapes, not values; computing the values costs a cached compile of
BERT-base most of its time (``benchmarks/RESULTS.md``, "cached compile of BERT-base"). The model
keeps its own parameters and buffers: the mode turns each into a fake tensor where an op meets it
(``allow_non_fake_inputs``), autograd still records the graph on the real leaves (gradients come
back fake), and in-place ops still bump the real tensors' version counters (the autograd layer
runs before the mode). Ops on real tensors and Python numbers only (``counter.add_(1)`` on a
buffer) are run for real by the mode: callers snapshot and restore buffers as for a real run.

Random draws are told by the ops' tag ``torch.Tag.nondeterministic_seeded`` (fake ops do not
advance the generators), except attention ops with ``dropout_p`` 0 (tagged, drawing nothing).
A model the mode cannot run (a value read with ``.item()``, a Python branch on a tensor's value,
an op without a meta kernel) raises: callers run it for real.
Metadata queries the mode dispatches on its own tensors (``prim.device``) are not ops of the
model: ``is_metadata`` tells them apart, so counters see the same sequence as in a real run.
"""
import contextlib

import torch

from ..torch_compat import TorchDispatchMode

_METADATA_NAMESPACES = ("prim",)


def is_metadata(func) -> bool:
    """A dispatched query of a tensor's metadata (only fake tensors dispatch these)."""
    return func.namespace in _METADATA_NAMESPACES


class RandomDraws(TorchDispatchMode):
    """``drew``: an op that draws from a random generator ran inside it."""

    def __init__(self):
        super().__init__()
        self.drew = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.drew and torch.Tag.nondeterministic_seeded in func.tags:
            self.drew = _dropout_probability(func, args, kwargs) != 0
        return func(*args, **kwargs)


def _dropout_probability(func, args, kwargs):
    """An attention op's ``dropout_p`` (its kernels draw only when it is not 0), else None."""
    for position, argument in enumerate(func._schema.arguments):
        if argument.name == "dropout_p":
            return kwargs.get("dropout_p", args[position] if position < len(args) else argument.default_value)
    return None


class ShapesOnly:
    """``fake(tensor)`` for the run's inputs, then ``with recorded(modes, shapes):`` around the run."""

    def __init__(self):
        from ..torch_compat import FakeTensorMode
        self.mode = FakeTensorMode(allow_non_fake_inputs=True)
        self.draws = RandomDraws()

    def fake(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.mode.from_tensor(tensor)


@contextlib.contextmanager
def recorded(modes, shapes=None):
    """The dispatch ``modes`` (op recorders) entered; with ``shapes``, inside its fake mode, so that
    they see each op as the model calls it, before the fake mode computes its result."""
    with contextlib.ExitStack() as stack:
        if shapes is not None:
            stack.enter_context(shapes.mode)
            stack.enter_context(shapes.draws)
        for mode in modes:
            stack.enter_context(mode)
        yield
