"""``while_loop`` over a flat tuple of tensors, and the optimizer state carried through it.

torch's ``while_loop`` flattens its carried values with ``torch.utils._pytree`` and unflattens them
again in wrappers around ``cond`` and ``body``; under ``torch.compile`` Dynamo traces that pytree
code bytecode by bytecode, as it traces openpop's own flattening of the optimizer state. For a
program's loops, whose carried values are already a flat tuple, that was ~40 % of the
instructions Dynamo traced to build the program, paid again for every new program (its graphs
cached or not). ``flat_while_loop`` calls the operator Dynamo traces (``while_loop_op``)
directly, and ``CarriedState`` flattens the optimizer state and loss scaling by a layout read
once, with plain indexing.
"""
import torch

from ...torch_compat import while_loop, while_loop_op


def flat_while_loop(cond, body, carried):
    """``while_loop(cond, body, carried)`` for a flat sequence of tensors ``carried``; ``cond`` and
    ``body`` take them as positional arguments, ``body`` returns as many. Returns a tuple."""
    if torch.compiler.is_dynamo_compiling():
        return tuple(while_loop_op(cond, body, tuple(carried), ()))
    return tuple(while_loop(cond, body, tuple(carried)))


class CarriedState:
    """The layout of ``(state, scaling)``: ``state`` a list of per-parameter dicts of tensors (a
    ``FunctionalOptimizer``'s), ``scaling`` a dict of tensors (``ScalingState``'s)."""

    def __init__(self, state, scaling):
        self.state_keys = [tuple(st) for st in state]
        self.scaling_keys = tuple(scaling)

    def flatten(self, state, scaling):
        """The tensors of ``state`` and ``scaling`` in the layout's order."""
        flat = [st[key] for st, keys in zip(state, self.state_keys) for key in keys]
        return flat + [scaling[key] for key in self.scaling_keys]

    def unflatten(self, flat):
        """``flatten``'s inverse: ``(state, scaling)``."""
        state, at = [], 0
        for keys in self.state_keys:
            state.append(dict(zip(keys, flat[at:at + len(keys)])))
            at += len(keys)
        return state, dict(zip(self.scaling_keys, flat[at:]))
