"""One task that runs many deadline callbacks (session expiry, delayed wills).

A heap instead of a sleeping task per offline session keeps 100k offline sessions cheap.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Awaitable, Callable, Hashable
from itertools import count

import trio

log = logging.getLogger("mop.mqtt")

Callback = Callable[[], Awaitable[None]]


class Timers:
    def __init__(self) -> None:
        # Keys are names, or an object that is its own key (no string made per timer).
        self._heap: list[tuple[float, int, Hashable]] = []
        self._live: dict[Hashable, tuple[int, Callback]] = {}
        self._seq = count()
        self._wake = trio.Event()

    def schedule(self, key: Hashable, delay: float, callback: Callback) -> None:
        """Run `callback` after `delay` seconds, replacing any timer with the same key."""
        seq = next(self._seq)
        self._live[key] = (seq, callback)
        entry = (trio.current_time() + max(0.0, delay), seq, key)
        heapq.heappush(self._heap, entry)
        if len(self._heap) > 2 * len(self._live) + 1024:
            self._drop_stale()
        if self._heap[0] is entry:  # a later one is seen when the task next wakes anyway
            self._wake.set()

    def _drop_stale(self) -> None:
        """Forget the entries of timers cancelled or rescheduled since, which would otherwise
        stay until their time comes (a timer rescheduled again and again, far ahead)."""
        live = self._live
        self._heap = [e for e in self._heap if (t := live.get(e[2])) is not None and t[0] == e[1]]
        heapq.heapify(self._heap)
        self._wake.set()

    def cancel(self, key: Hashable) -> bool:
        return self._live.pop(key, None) is not None

    def __contains__(self, key: Hashable) -> bool:
        return key in self._live

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            self._wake = trio.Event()
            deadline = self._heap[0][0] if self._heap else float("inf")
            with trio.move_on_at(deadline):
                await self._wake.wait()
            await self._fire_due()

    async def _fire_due(self) -> None:
        now = trio.current_time()
        while self._heap and self._heap[0][0] <= now:
            _, seq, key = heapq.heappop(self._heap)
            live = self._live.get(key)
            if live is None or live[0] != seq:
                continue  # cancelled or rescheduled
            del self._live[key]
            try:
                await live[1]()
            except Exception:
                log.exception("timer %s failed", key)
