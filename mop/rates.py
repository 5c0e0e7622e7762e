"""Rates of counters that only grow (messages in, bytes out...), worked out when they are read,
so that counting costs a publish (or a delivery) nothing more than an addition. No I/O; times
are seconds on any clock the caller keeps to.
"""

from __future__ import annotations

from typing import Final

__all__ = ["RATE_WINDOW", "RateMeter"]

# Rates cover at least this many seconds: reads closer together than that repeat the last rates.
RATE_WINDOW: Final = 5.0


class RateMeter:
    """The rates of a fixed set of counters, per second.

    The first `read` measures from `since` (when counting began, from zero); each later one
    measures from the reading before it, once at least `window` seconds have passed, and
    until then answers the rates it measured last. So the rates are those of the last window
    or more, however often they are read."""

    __slots__ = ("_at", "_rates", "_values", "window")

    def __init__(self, since: float, size: int, *, window: float = RATE_WINDOW) -> None:
        self.window = window
        self._at = since
        self._values: tuple[int, ...] = (0,) * size
        self._rates: tuple[float, ...] | None = None

    def read(self, now: float, values: tuple[int, ...]) -> tuple[float, ...]:
        elapsed = now - self._at
        if self._rates is not None and elapsed < self.window:
            return self._rates
        if elapsed <= 0:
            return self._rates or (0.0,) * len(values)
        self._rates = tuple(
            max(0, value - before) / elapsed
            for value, before in zip(values, self._values, strict=True)
        )
        self._at, self._values = now, values
        return self._rates
