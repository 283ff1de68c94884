"""Re-cut a stream of batches into batches of a fixed size along dim 0."""
from collections.abc import Iterable, Iterator
from typing import Any

from . import batch_tree


def rebatch(batches: Iterable[Any], size: int, drop_last: bool) -> Iterator[Any]:
    """Yield batches of exactly ``size`` rows taken in order from ``batches``.

    The rows left at the end form one shorter batch, or are dropped when ``drop_last``.
    """
    pending, rows = [], 0
    for batch in batches:
        length = batch_tree.batch_length(batch)
        if length == 0:
            continue
        pending.append(batch)
        rows += length
        while rows >= size:
            merged = batch_tree.concat(pending)
            full, rest = batch_tree.split(merged, size)
            yield full
            rows -= size
            pending = [rest] if rows else []
    if rows and not drop_last:
        yield batch_tree.concat(pending)
