"""Rate-limited log lines: at most one line per kind of event per interval, the next line saying
how many like it were held back, so that a flood (every publish refused while the disk is full)
costs one line per interval instead of one per event.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["LimitedLog", "RateLimit"]


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
