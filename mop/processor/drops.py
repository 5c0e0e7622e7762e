"""`DropLog`: messages dropped for a client, logged once per client per interval with the
reason and the count, never once per message."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["DROP_LOG_INTERVAL", "DropLog"]

logger = logging.getLogger("mop.processor")

# Seconds between two lines about the drops of one subscription.
DROP_LOG_INTERVAL = 10.0


class DropLog:
    """Counts drops per (subscription, reason). The first drop of a quiet pair is logged at
    once; the ones after it are added up and logged when `interval` has passed since the last
    line, by the next drop of any subscription (so a count that stops growing is still
    logged, unless nothing is dropped anywhere again)."""

    __slots__ = ("_clock", "_interval", "_next_sweep", "_pending")

    def __init__(
        self, interval: float = DROP_LOG_INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._interval = interval
        self._clock = clock
        # (subscription, reason) -> [dropped since the last line, time of the last line]
        self._pending: dict[tuple[str, str], list[float]] = {}
        self._next_sweep = 0.0

    def note(self, subscription: str, reason: str, count: int) -> None:
        now = self._clock()
        key = (subscription, reason)
        slot = self._pending.get(key)
        if slot is None:
            self._pending[key] = [0, now]
            self._log(key, count, None)
        else:
            slot[0] += count
            if now - slot[1] >= self._interval:
                self._log(key, int(slot[0]), now - slot[1])
                slot[0], slot[1] = 0, now
        if now >= self._next_sweep:
            self._next_sweep = now + self._interval
            self._sweep(now)

    def _sweep(self, now: float) -> None:
        for key, slot in list(self._pending.items()):
            count, since = slot
            if now - since < self._interval:
                continue
            if count:
                self._log(key, int(count), now - since)
                slot[0], slot[1] = 0, now
            else:
                del self._pending[key]  # quiet for an interval: its next drop is logged at once

    @staticmethod
    def _log(key: tuple[str, str], count: int, seconds: float | None) -> None:
        subscription, reason = key
        during = "" if seconds is None else f" in the last {seconds:.0f} s"
        logger.warning(
            "subscription %r: %d message(s) dropped%s (%s)", subscription, count, during, reason
        )
