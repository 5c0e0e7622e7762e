"""`LeaseFence`: the fenced and released states every backend's client lease goes through, and
the ways to wait for them (`ClientLease`, `FenceNotifier`).

A node holds one lease per connected client, so the state is lean: two flags, and events made
only when a task waits (most leases are never fenced, and never waited for), and the fence is
reported to a connection by a callback instead of a task of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

__all__ = ["LeaseFence"]

log = logging.getLogger("mop.processor")


class LeaseFence:
    """Fenced (another connection took the client id over) and released (the connection let
    go); a subclass says what its backend does on the way."""

    __slots__ = ("_fenced", "_fenced_event", "_on_fenced", "_released", "_released_event")

    def __init__(self) -> None:
        self._fenced = False
        self._released = False
        self._fenced_event: trio.Event | None = None
        self._released_event: trio.Event | None = None
        self._on_fenced: Callable[[], None] | None = None

    @property
    def fenced(self) -> bool:
        return self._fenced

    @property
    def released(self) -> bool:
        return self._released

    async def wait_fenced(self) -> None:
        if self._fenced:
            await trio.lowlevel.checkpoint()
            return
        if self._fenced_event is None:
            self._fenced_event = trio.Event()
        await self._fenced_event.wait()

    def on_fenced(self, callback: Callable[[], None]) -> None:
        """See `FenceNotifier`: at once if fenced already; a lease released before it was
        fenced never calls it."""
        if self._fenced:
            callback()
        elif not self._released:
            self._on_fenced = callback

    async def wait_released(self) -> None:
        if self._released:
            await trio.lowlevel.checkpoint()
            return
        if self._released_event is None:
            self._released_event = trio.Event()
        await self._released_event.wait()

    def set_fenced(self) -> bool:
        """Fence (once; the callback runs here); whether this call did."""
        if self._fenced:
            return False
        self._fenced = True
        if self._fenced_event is not None:
            self._fenced_event.set()
        callback, self._on_fenced = self._on_fenced, None
        if callback is not None and not self._released:
            try:
                callback()
            except Exception:  # the connection's own failure: the fence holds all the same
                log.exception("a fence callback failed")
        return True

    def set_released(self) -> bool:
        """Mark released (once); whether this call did."""
        if self._released:
            return False
        self._released = True
        self._on_fenced = None  # a released lease never calls it
        if self._released_event is not None:
            self._released_event.set()
        return True
