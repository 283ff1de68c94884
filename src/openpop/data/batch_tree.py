"""Batches as trees: tensors nested in tuples, namedtuples, lists and dicts.

This is the structure ``torch.utils.data.default_collate`` produces. Any other object is a
leaf; a tree is "tensor-only" when all its leaves are tensors.
"""
from typing import Any, Callable

import torch

from . import messages


def _is_namedtuple(obj) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def _children(tree):
    """The children of a container node, or None for a leaf."""
    if type(tree) in (tuple, list) or _is_namedtuple(tree):
        return list(tree)
    if isinstance(tree, dict):
        return list(tree.values())
    return None


def _rebuild_node(template, children: list[Any]):
    if _is_namedtuple(template):
        return type(template)(*children)
    if type(template) is tuple:
        return tuple(children)
    if type(template) is list:
        return list(children)
    node = template.copy()  # keeps dict subclasses (OrderedDict, defaultdict) intact
    for key, child in zip(template.keys(), children):
        node[key] = child
    return node


def map_leaves(fn: Callable, *trees):
    """Apply ``fn`` to corresponding leaves of trees that share the structure of ``trees[0]``."""
    children = _children(trees[0])
    if children is None:
        return fn(*trees)
    others = [_children(t) for t in trees[1:]]
    return _rebuild_node(trees[0], [map_leaves(fn, c, *(o[i] for o in others)) for i, c in enumerate(children)])


def leaves(tree) -> list[Any]:
    children = _children(tree)
    if children is None:
        return [tree]
    return [leaf for child in children for leaf in leaves(child)]


def rebuild(tree):
    """Fresh containers around the same leaves, so callers can't alter ``tree`` itself."""
    return map_leaves(lambda leaf: leaf, tree)


def is_plain_tensor(obj) -> bool:
    return (isinstance(obj, torch.Tensor) and obj.layout == torch.strided and obj.device.type == "cpu"
            and not obj.requires_grad)


def is_tensor_only(tree) -> bool:
    """True when every leaf is a dense CPU tensor (the kind a shared-memory slot can hold)."""
    return all(is_plain_tensor(leaf) for leaf in leaves(tree))


def same_layout(slot, batch) -> bool:
    """True when ``batch`` has the structure, shapes and dtypes of the tensor-only tree ``slot``."""
    slot_children, batch_children = _children(slot), _children(batch)
    if slot_children is None or batch_children is None:
        return (slot_children is None and batch_children is None and is_plain_tensor(batch)
                and batch.shape == slot.shape and batch.dtype == slot.dtype)
    if type(slot) is not type(batch) or len(slot_children) != len(batch_children):
        return False
    if isinstance(slot, dict) and list(slot.keys()) != list(batch.keys()):
        return False
    return all(same_layout(s, b) for s, b in zip(slot_children, batch_children))


def empty_shared_like(batch):
    """A tree of uninitialised shared-memory tensors shaped like the tensor-only ``batch``."""
    return map_leaves(lambda t: torch.empty_like(t, memory_format=torch.contiguous_format).share_memory_(),
                      batch)


def copy_into(slot, batch) -> None:
    for destination, source in zip(leaves(slot), leaves(batch)):
        destination.copy_(source)


def batch_length(tree) -> int:
    """Size of the batch dimension (dim 0) of the first tensor leaf."""
    for leaf in leaves(tree):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return leaf.shape[0]
    raise TypeError(messages.REBATCH_NOT_BATCHED.format(tree_type=type(tree).__name__))


def _require_tensor(leaf):
    if not isinstance(leaf, torch.Tensor):
        raise TypeError(messages.REBATCH_LEAF_TYPE.format(leaf_type=type(leaf).__name__))
    return leaf


def concat(trees: list[Any]):
    """Concatenate tensor-only trees of the same structure along dim 0."""
    if len(trees) == 1:
        return map_leaves(_require_tensor, trees[0])
    return map_leaves(lambda *ts: torch.cat([_require_tensor(t) for t in ts]), *trees)


def split(tree, size: int):
    """``(tree[:size], tree[size:])`` along dim 0 of every leaf."""
    return map_leaves(lambda t: t[:size], tree), map_leaves(lambda t: t[size:], tree)
