"""A fake of the table every node of a separated deployment shares (a compacted topic): each
node has its own view, and a write through one view is reported to the others' watchers."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import trio

Watcher = Callable[[str, bytes | None], None]


class SharedTable:
    """One node's view of a table all nodes share; a write is reported to the other views."""

    def __init__(self, name: str, data: dict[str, bytes], views: list[SharedTable]) -> None:
        self._name = name
        self._data = data
        self._views = views
        self._watchers: list[Watcher] = []
        views.append(self)

    @property
    def name(self) -> str:
        return self._name

    def get(self, key: str) -> bytes | None:
        return self._data.get(key)

    def items(self) -> Iterator[tuple[str, bytes]]:
        return iter(list(self._data.items()))

    async def put(self, key: str, value: bytes | None) -> None:
        await trio.lowlevel.checkpoint()
        if value is None:
            self._data.pop(key, None)
        else:
            self._data[key] = value
        for view in self._views:
            if view is not self:
                for watcher in view._watchers:
                    watcher(key, value)

    def watch(self, callback: Watcher) -> None:
        self._watchers.append(callback)

    def lag(self, nursery: trio.Nursery, seconds: float) -> None:
        """Report the other views' writes to this view's watchers `seconds` late, as a node
        reading a compacted topic hears of them."""
        watchers, self._watchers = self._watchers, []

        def later(key: str, value: bytes | None) -> None:
            async def report() -> None:
                await trio.sleep(seconds)
                for watcher in watchers:
                    watcher(key, value)

            nursery.start_soon(report)

        self._watchers.append(later)
