"""Messages on their way back to a subscription later: nacked ones with a redelivery delay, and
ones held until their `deliver_at`. A heap by due time, on whichever clock the caller uses.
"""

from __future__ import annotations

import heapq
import itertools

from mop.broker.cursor import Cursor, Entry

__all__ = ["DelayQueue"]


class DelayQueue:
    __slots__ = ("_heap", "_order")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Cursor, Entry]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def messages(self) -> int:
        """The messages held (a batch entry counts its messages): a walk, for the stats."""
        return sum(item[3].message.count for item in self._heap)

    def push(self, due: float, cursor: Cursor, entry: Entry) -> None:
        heapq.heappush(self._heap, (due, next(self._order), cursor, entry))

    def next_due(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> list[tuple[Cursor, Entry]]:
        """Everything due at `now`, earliest first."""
        heap = self._heap
        due: list[tuple[Cursor, Entry]] = []
        while heap and heap[0][0] <= now:
            _, _, cursor, entry = heapq.heappop(heap)
            due.append((cursor, entry))
        return due
