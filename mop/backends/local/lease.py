"""`LocalLease`: a client id held within this process."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from mop.backends.local.backend import LocalBackend

__all__ = ["LocalLease"]


class LocalLease:
    """Ownership of a client id within this process. Its events are made only when a task
    waits for them: most leases are never fenced and never waited for."""

    __slots__ = (
        "_backend",
        "_client_id",
        "_fenced",
        "_fenced_event",
        "_on_fenced",
        "_released",
        "_released_event",
    )

    def __init__(self, backend: LocalBackend, client_id: str) -> None:
        self._backend = backend
        self._client_id = client_id
        self._fenced = False
        self._released = False
        self._fenced_event: trio.Event | None = None
        self._released_event: trio.Event | None = None
        self._on_fenced: Callable[[], None] | None = None

    @property
    def client_id(self) -> str:
        return self._client_id

    @property
    def fenced(self) -> bool:
        return self._fenced

    async def wait_fenced(self) -> None:
        if self._fenced:
            await trio.lowlevel.checkpoint()
            return
        if self._fenced_event is None:
            self._fenced_event = trio.Event()
        await self._fenced_event.wait()

    def on_fenced(self, callback: Callable[[], None]) -> None:
        if self._fenced:
            callback()
        else:
            self._on_fenced = callback

    async def release(self) -> None:
        self._release_now()
        await trio.lowlevel.checkpoint()

    def _fence(self) -> None:
        if self._fenced:
            return
        self._fenced = True
        if self._fenced_event is not None:
            self._fenced_event.set()
        callback, self._on_fenced = self._on_fenced, None
        if callback is not None:
            callback()

    async def _wait_released(self) -> None:
        if self._released:
            await trio.lowlevel.checkpoint()
            return
        if self._released_event is None:
            self._released_event = trio.Event()
        await self._released_event.wait()

    def _release_now(self) -> None:
        self._released = True
        self._on_fenced = None
        if self._released_event is not None:
            self._released_event.set()
        self._backend._lease_released(self)
