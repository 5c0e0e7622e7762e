"""`BanStore`: the bans of a deployment, kept in table `BANS_TABLE` (so every node and proxy,
and the `mop ban` command, see the same ones) and followed into a `BanList` to match clients
against as they connect. It also removes bans that are over from the table."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

import trio

from mop.processor.backend import BackendError, Table
from mop.security.abuse import (
    Ban,
    BanKind,
    BanList,
    ban_key,
    checked_ban,
    decode_ban,
    encode_ban,
)

__all__ = ["EXPIRY_INTERVAL", "BanStore"]

log = logging.getLogger("mop.security")

# Seconds between two removals of the bans that are over (they stop applying at once anyway).
EXPIRY_INTERVAL: Final = 5.0


class BanStore:
    """`BANS_TABLE`'s bans, as a `BanList` (`bans`) that follows the table's changes.

    The table must have loaded when the store is made (a node names `BANS_TABLE` among the
    tables it loads as it starts). `clock` gives seconds since the epoch.
    """

    def __init__(self, table: Table, *, clock: Callable[[], float] = time.time) -> None:
        self.table = table
        self.bans = BanList()
        self._clock = clock
        for key, value in table.items():
            self.bans.apply(key, value)
        table.watch(self.bans.apply)

    def match(self, *, client_id: str, username: str | None, address: str) -> Ban | None:
        """The ban in force that keeps this client out now, if any (see `BanList.match`)."""
        return self.bans.match(
            client_id=client_id, username=username, address=address, now=self._clock()
        )

    async def add(self, ban: Ban) -> Ban:
        """Store `ban` (replacing any of the same target) and return it as stored (its target
        normalised). Raises ValueError for a ban no node could read back (see `checked_ban`),
        BackendError when the table cannot be written."""
        ban = checked_ban(ban)
        await self.table.put(ban_key(ban.kind, ban.value), encode_ban(ban))
        self.bans.put(ban)
        return ban

    async def remove(self, kind: BanKind, value: str) -> bool:
        """Lift the ban of this target; whether the table had one. Raises ValueError for a
        target that is not valid, BackendError when the table cannot be written."""
        key = ban_key(kind, value)
        if self.table.get(key) is None:
            await trio.lowlevel.checkpoint()
            self.bans.apply(key, None)
            return False
        await self.table.put(key, None)
        self.bans.apply(key, None)
        return True

    async def remove_expired(self) -> int:
        """Delete the bans that are over from the table; how many were deleted."""
        now = self._clock()
        removed = 0
        for key in self.bans.expired_keys(now):
            value = self.table.get(key)
            if value is not None:
                try:
                    current = decode_ban(key, value)
                except ValueError:
                    current = None
                if current is not None and current.active(now):
                    self.bans.apply(key, value)  # set again meanwhile, for longer
                    continue
                await self.table.put(key, None)
                removed += 1
            self.bans.apply(key, None)
        return removed

    async def serve_expiry(
        self,
        *,
        interval: float = EXPIRY_INTERVAL,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Remove the bans that are over every `interval` seconds, until cancelled. (Every
        node of a deployment may run it: a ban deleted twice is deleted.)"""
        task_status.started()
        while True:
            try:
                await self.remove_expired()
            except BackendError as exc:
                log.warning("bans: cannot remove those that are over: %s", exc)
            await trio.sleep(interval)
