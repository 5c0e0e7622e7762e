"""`LocalLease`: a client id held within this process."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from mop.processor.fencing import LeaseFence

if TYPE_CHECKING:
    from mop.backends.local.backend import LocalBackend

__all__ = ["LocalLease"]


class LocalLease(LeaseFence):
    """Ownership of a client id within this process (see `LeaseFence` for its states)."""

    __slots__ = ("_backend", "_client_id")

    def __init__(self, backend: LocalBackend, client_id: str) -> None:
        super().__init__()
        self._backend = backend
        self._client_id = client_id

    @property
    def client_id(self) -> str:
        return self._client_id

    async def release(self) -> None:
        self._release_now()
        await trio.lowlevel.checkpoint()

    def _release_now(self) -> None:
        if self.set_released():
            self._backend._lease_released(self)
