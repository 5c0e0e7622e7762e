"""The "interval" fsync policy's timer, on a thread of its own.

Every `interval` seconds the thread fsyncs what the event loop has written to the log since
the last fsync, and reports how far that covered. The event loop takes no part in it: handing
each fsync to a worker thread from a task cost the loop several task steps every interval,
and a message that arrived during them waited for all of them (a good part of the p99 latency
of a node at a steady rate). `os.fsync` releases the GIL, so the thread holds it only for a
few lines either side of the system call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["IntervalSyncer"]


class IntervalSyncer:
    """Calls `fsync()` every `interval` seconds while `written()` is past `synced()`, then
    `done(through, started, seconds)`: the log position it covered, the `time.monotonic()`
    at which it began and how long it took. An `OSError` of `fsync()` goes to `failed` and
    the next tick tries again."""

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
        self._thread = threading.Thread(target=self._run, name="mop-log-fsync", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end (after the fsync under way, if any); `join` waits for it."""
        self._stop.set()

    def join(self) -> None:
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
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
