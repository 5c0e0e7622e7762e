"""Time in separated mode: the wall clock that publish times are compared with, and calls made
on the trio thread after a delay (negative acknowledgements, held back before they are
redelivered)."""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Callable

import trio

__all__ = ["Delays"]

log = logging.getLogger("mop.cluster")


class Delays:
    """Calls to make after a delay, on the trio thread (delayed negative acknowledgements)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._changed = trio.Event()

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (trio.current_time() + delay, next(self._seq), fn))
        self._changed.set()

    async def serve(self) -> None:
        while True:
            self._changed = trio.Event()
            deadline = self._heap[0][0] if self._heap else float("inf")
            with trio.move_on_at(deadline):
                await self._changed.wait()
            now = trio.current_time()
            while self._heap and self._heap[0][0] <= now:
                _, _, fn = heapq.heappop(self._heap)
                try:
                    fn()
                except Exception:
                    log.exception("a delayed call failed")
