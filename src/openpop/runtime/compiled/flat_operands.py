"""Dynamo flattens a higher-order op's flat operands without tracing pytree (a Dynamo pass).

When Dynamo traces a ``while_loop`` (or ``cond``), it flattens the operands and the body's results
with ``torch.utils._pytree`` and unflattens them again - by inlining pytree's Python, bytecode by
bytecode (``higher_order_ops._make_inlined``): ~25 ms per carried tensor per loop on a 2-core
EPYC, a third of the time to build a program whose graphs are all cached, paid again by every
new program. The operands of a program's loops are flat tuples of tensors (``flat_loop.py``),
whose flattening is the identity. While a program is traced (``flat_operands()``, entered by
``Program``'s calls through Dynamo), ``tree_flatten`` of a flat list or tuple of tensor variables
returns those variables and a spec of the same structure directly, and ``tree_unflatten`` with
such a spec rebuilds the list or tuple; everything else, and anything the direct path cannot
build, goes to Dynamo's inlined pytree (the fallback). The graph Dynamo builds is the same. The
patch is process-wide while any program traces: another thread tracing then takes the direct
path too, to the same graphs.

Switch: ``OPENPOP_DISABLE_PASSES=flat_operands``; probe: ``applies()``, the Dynamo names it
replaces exist in this torch (``passes.py``).
"""
import contextlib
import functools
import threading

from ... import openpop_settings, torch_compat
from ...torch_compat import pytree

_lock = threading.Lock()
_depth = 0  # traces inside flat_operands() now (programs may trace in several threads)
_original = None  # Dynamo's _make_inlined while patched
_specs = {}  # id(spec variable) -> (spec variable, list or tuple, length), for one patched period


def applies() -> bool:
    """Whether this torch has the Dynamo function the pass replaces and the variables it builds."""
    try:
        hops = torch_compat.dynamo_higher_order_ops
        built = (torch_compat.dynamo_ListVariable, torch_compat.dynamo_TupleVariable,
                 torch_compat.dynamo_SourcelessBuilder)
    except (ImportError, AttributeError):
        return False
    return callable(getattr(hops, "_make_inlined", None)) and all(built)


@contextlib.contextmanager
def flat_operands():
    """Dynamo's higher-order ops flatten flat operands directly within (module docstring); the
    pass off (``passes.active``), nothing changes."""
    if not _switched_on(openpop_settings.raw("disable_passes")):
        yield
        return
    global _depth, _original
    hops = torch_compat.dynamo_higher_order_ops
    with _lock:
        if _depth == 0:
            _original = hops._make_inlined
            hops._make_inlined = _make_inlined
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                hops._make_inlined = _original
                _specs.clear()


@functools.lru_cache(maxsize=8)
def _switched_on(disable_passes) -> bool:
    """``passes.active("flat_operands")`` for the switch's text ``disable_passes``: asked once per
    text (entered on every call through Dynamo, which the cache-hit path does not always avoid)."""
    from .passes import active

    return active("flat_operands")


def _make_inlined(tx, f):
    """Dynamo's ``_make_inlined(tx, f)``, with the direct path for pytree's flatten and unflatten."""
    inlined = _original(tx, f)
    if f is pytree.tree_flatten:
        return lambda *args, **kwargs: _flatten(tx, args, kwargs) or inlined(*args, **kwargs)
    if f is pytree.tree_unflatten:
        return lambda *args, **kwargs: _unflatten(args, kwargs) or inlined(*args, **kwargs)
    return inlined


def _flatten(tx, args, kwargs):
    """``(leaves, spec)`` of a flat list or tuple of tensor variables, else None (the fallback)."""
    lists, tuples = torch_compat.dynamo_ListVariable, torch_compat.dynamo_TupleVariable
    if kwargs or len(args) != 1 or type(args[0]) not in (lists, tuples):
        return None
    items = list(args[0].items)
    if not all(item.is_tensor() for item in items):
        return None
    kind = list if type(args[0]) is lists else tuple
    try:
        spec = torch_compat.dynamo_SourcelessBuilder.create(tx, pytree.tree_flatten(kind(range(len(items))))[1])
    except Exception:  # this torch builds no variable for a spec: Dynamo's own path
        return None
    _specs[id(spec)] = (spec, kind, len(items))
    return tuples([lists(items), spec])


def _unflatten(args, kwargs):
    """The list or tuple ``_flatten`` flattened into ``args[0]``'s leaves, else None (the fallback)."""
    if kwargs or len(args) != 2:
        return None
    leaves, spec = args
    known = _specs.get(id(spec))
    lists, tuples = torch_compat.dynamo_ListVariable, torch_compat.dynamo_TupleVariable
    if known is None or known[0] is not spec or type(leaves) not in (lists, tuples) or len(leaves.items) != known[2]:
        return None
    return lists(list(leaves.items)) if known[1] is list else tuples(list(leaves.items))
