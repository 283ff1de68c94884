"""Data loading: ``DataLoader`` (combined batches, per-process shards) and
``AsynchronousDataAccessor`` (loading in a separate process through shared memory)."""
from .async_accessor import AsynchronousDataAccessor
from .dataloader import DataLoader

__all__ = ["AsynchronousDataAccessor", "DataLoader"]
