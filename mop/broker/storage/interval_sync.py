"""The "interval" fsync policy's fsync, on a thread of its own.

At every tick of the store's background writer (`poke`, once it has written what no `sync()`
asked for), the thread fsyncs what the event loop has written to the log since the last fsync,
and reports how far that covered; should the loop be too busy to poke it, it does so on its own
every two intervals. The event loop takes no part in it: handing each fsync to a worker thread
from a task cost the loop several task steps every interval, and a message that arrived during
them waited for all of them (a good part of the p99 latency of a node at a steady rate).
`os.fsync` releases the GIL, so the thread holds it only for a few lines either side of the
system call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["IntervalSyncer"]


class IntervalSyncer:
    """Calls `fsync()` when poked (or every two `interval`s) while `written()` is past
    `synced()`, then `done(through, started, seconds)`: the log position it covered, the
    `time.monotonic()` at which it began and how long it took. An `OSError` of `fsync()` goes
    to `failed` and the next tick tries again."""

    def __init__(
        self,
        interval: float,
        *,
        written: Callable[[], int],
        synced: Callable[[], int],
        fsync: Callable[[], None],
        done: Callable[[int, float, float], None],
        failed: Callable[[OSError], None],
    ) -> None:
        self.interval = interval
        self._written = written
        self._synced = synced
        self._fsync = fsync
        self._done = done
        self._failed = failed
        self._stop = threading.Event()
        self._poked = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mop-log-fsync", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def poke(self) -> None:
        """Fsync what is written now (from any thread; returns at once)."""
        self._poked.set()

    def stop(self) -> None:
        """Ask the thread to end (after the fsync under way, if any); `join` waits for it."""
        self._stop.set()
        self._poked.set()

    def join(self) -> None:
        self._thread.join()

    def _run(self) -> None:
        while True:
            self._poked.wait(2 * self.interval)
            self._poked.clear()
            if self._stop.is_set():
                return
            through = self._written()
            if through <= self._synced():
                continue  # nothing written since the last fsync
            started = time.monotonic()
            try:
                self._fsync()
            except OSError as exc:
                self._failed(exc)
            else:
                self._done(through, started, time.monotonic() - started)
