"""Where the broker keeps messages, cursors and tables: the `Storage` interface and its
implementations."""

from mop.broker.storage.api import (
    CursorKey,
    CursorState,
    Storage,
    StorageError,
    StorageFull,
    StorageStats,
)
from mop.broker.storage.durable import DurableStorage, open_durable_storage
from mop.broker.storage.memory import MemoryStorage
from mop.broker.storage.ranges import IdRanges, IdRangeSet

__all__ = [
    "CursorKey",
    "CursorState",
    "DurableStorage",
    "IdRangeSet",
    "IdRanges",
    "MemoryStorage",
    "Storage",
    "StorageError",
    "StorageFull",
    "StorageStats",
    "open_durable_storage",
]
