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

__all__ = [
    "CursorKey",
    "CursorState",
    "DurableStorage",
    "MemoryStorage",
    "Storage",
    "StorageError",
    "StorageFull",
    "StorageStats",
    "open_durable_storage",
]
