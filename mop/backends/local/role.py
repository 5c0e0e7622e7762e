"""`LocalRole`: a role of a merged node, held for good."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

__all__ = ["LocalRole"]


class LocalRole:
    """A role of a merged node, which is the whole deployment: held from the start and for
    good, until released (see `Role`)."""

    permanent = True

    def __init__(self, name: str) -> None:
        self._name = name
        self._released = trio.Event()
        self._reported = False  # what `changed` last returned

    @property
    def name(self) -> str:
        return self._name

    @property
    def held(self) -> bool:
        return not self._released.is_set()

    async def changed(self) -> bool:
        if self._reported != self.held:
            await trio.lowlevel.checkpoint()
        elif self.held:
            await self._released.wait()  # the one change left
        else:
            await trio.sleep_forever()  # released and reported: nothing changes any more
        self._reported = self.held
        return self._reported

    async def release(self) -> None:
        self._released.set()
        await trio.lowlevel.checkpoint()


if TYPE_CHECKING:
    from mop.processor.backend import Role

    def _role_conforms(role: LocalRole) -> Role:
        return role
