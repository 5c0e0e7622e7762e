"""`LocalTable`: a table of the local backend, kept in memory and written through to storage."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from mop.backends.local.errors import translated
from mop.broker.storage import Storage

__all__ = ["LocalTable"]


class LocalTable:
    """A table kept in memory and written through to storage."""

    def __init__(self, storage: Storage, name: str) -> None:
        self._storage = storage
        self._name = name
        self._items: dict[str, bytes] = dict(storage.table_items(name))

    @property
    def name(self) -> str:
        return self._name

    def get(self, key: str) -> bytes | None:
        return self._items.get(key)

    def items(self) -> Iterator[tuple[str, bytes]]:
        return iter(list(self._items.items()))

    async def put(self, key: str, value: bytes | None) -> None:
        with translated():
            self._storage.table_put(self._name, key, value)
            if value is None:
                self._items.pop(key, None)
            else:
                self._items[key] = value
            await self._storage.sync()

    def watch(self, callback: Callable[[str, bytes | None], None]) -> None:
        """Every write goes through this node's one table object: there is nothing to report."""
