"""Rate-limited log lines: at most one line per kind of event per interval, the next line saying
how many like it were held back, so that a flood (every publish refused while the disk is full)
costs one line per interval instead of one per event. `LineBudget` bounds events that are each
worth a line (clients connecting) to a number of lines per interval instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["LimitedLog", "LineBudget", "RateLimit"]


class RateLimit:
    """Decides which events of each kind are worth a line: the first of a kind, then the first
    one at least `interval` seconds after the last line of that kind. Pure; `clock` returns
    seconds."""

    __slots__ = ("_clock", "_held", "_last", "interval")

    def __init__(self, interval: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def admit(self, kind: str) -> int | None:
        """None when this event of `kind` is held back (and counted); else the number of events
        of `kind` held back since its last admitted one."""
        now = self._clock()
        last = self._last.get(kind)
        if last is not None and now - last < self.interval:
            self._held[kind] = self._held.get(kind, 0) + 1
            return None
        self._last[kind] = now
        return self._held.pop(kind, 0)


class LineBudget:
    """Admits at most `lines` events per window of `interval` seconds and holds back the rest,
    counting them, so that a storm of events that each deserve a line costs a bounded number
    of lines. Pure; `clock` returns seconds."""

    __slots__ = ("_clock", "_held", "_used", "_window", "interval", "lines")

    def __init__(
        self, lines: int, interval: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.lines = lines
        self.interval = interval
        self._clock = clock
        self._window = -float("inf")  # when the current window began
        self._used = 0
        self._held = 0

    def admit(self) -> int | None:
        """None when this event is held back (and counted); else the number of events held
        back since the last admitted one."""
        now = self._clock()
        if now - self._window >= self.interval:
            self._window = now
            self._used = 0
        if self._used >= self.lines:
            self._held += 1
            return None
        self._used += 1
        held, self._held = self._held, 0
        return held


class LimitedLog:
    """A logger's `warning` and `error` through a `RateLimit`: a line that follows held-back
    ones ends with "(N more like this in the last S s)"."""

    __slots__ = ("limit", "logger")

    def __init__(self, logger: logging.Logger, limit: RateLimit | None = None) -> None:
        self.logger = logger
        self.limit = limit if limit is not None else RateLimit()

    def warning(self, kind: str, msg: str, *args: object) -> None:
        self.log(logging.WARNING, kind, msg, *args)

    def error(self, kind: str, msg: str, *args: object) -> None:
        self.log(logging.ERROR, kind, msg, *args)

    def log(self, level: int, kind: str, msg: str, *args: object) -> None:
        if not self.logger.isEnabledFor(level):
            return
        held = self.limit.admit(kind)
        if held is None:
            return
        if held:
            msg = f"{msg} (%d more like this in the last %g s)"
            args = (*args, held, self.limit.interval)
        self.logger.log(level, msg, *args)
