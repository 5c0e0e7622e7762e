"""Upkeep of the durable log: reclaiming the oldest segment once nothing live is left in it (the
broker trims what retention lets go), or once the log is mostly garbage (then its live records
are copied forward).

Segments are reclaimed oldest first only. That keeps deletions (of cursors, table keys, topics)
safe to forget: the records they override are always in an older segment, already gone.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import trio

from mop.broker.storage.api import CursorKey, StorageError
from mop.broker.storage.index import LogIndex, Segment, StateKey, TopicIndex
from mop.broker.storage.log import LogTail
from mop.broker.storage.records import Kind, Scanner, message_key
from mop.broker.storage.segments import SegmentFiles, read_segment
from mop.log_limit import LimitedLog
from mop.settings import StorageSettings

__all__ = ["LogWriter", "Upkeep", "UpkeepParts"]

logger = logging.getLogger("mop.storage")
_failures = LimitedLog(logger)

# How many copied records between two checkpoints, so a reclaim never holds the loop long.
_COPY_SLICE = 2000
# After a reclaim that could not finish, wait this long before trying again.
_RECLAIM_BACKOFF = 60.0


@dataclass(frozen=True, slots=True)
class UpkeepParts:
    """The parts of one log that upkeep works on."""

    directory: Path
    settings: StorageSettings
    index: LogIndex
    tail: LogTail
    files: SegmentFiles


class LogWriter(Protocol):
    """What upkeep asks of the store that owns the log: its state, and the writes that flush
    the tail and write live state records again."""

    @property
    def closed(self) -> bool: ...

    def disk_bytes(self) -> int: ...

    async def flush(self, target: int, *, fsync: bool) -> None: ...

    def write_topic(self, topic: TopicIndex) -> None: ...

    def write_cursor(self, key: CursorKey) -> None: ...

    def write_table_entry(self, table: str, key: str) -> None: ...


class Upkeep:
    """Runs at most one round of chores at a time for one log."""

    def __init__(self, parts: UpkeepParts, store: LogWriter) -> None:
        self.parts = parts
        self.store = store
        self._running: trio.Event | None = None
        self._reclaim_after = 0.0
        self.reclaimed = 0  # segments deleted, for tests and metrics

    def due(self) -> bool:
        if self._running is not None:
            return False
        return self._reclaimable() is not None

    async def run_if_due(self) -> None:
        if not self.due():
            return
        self._running = trio.Event()
        try:
            while not self.store.closed and (segment := self._reclaimable()) is not None:
                if not await self._reclaim(segment):
                    self._reclaim_after = time.monotonic() + _RECLAIM_BACKOFF
                    break
        except StorageError as exc:
            _failures.warning(type(exc).__name__, "log upkeep failed: %s", exc)
        finally:
            self._running.set()
            self._running = None

    async def wait_idle(self) -> None:
        if self._running is not None:
            await self._running.wait()

    # -- reclaim -------------------------------------------------------------------------------

    def _reclaimable(self) -> Segment | None:
        index = self.parts.index
        if len(index.segments) < 2 or time.monotonic() < self._reclaim_after:
            return None
        oldest = index.segments[0]
        if oldest.live_bytes == 0 and not oldest.state:
            return oldest
        # Copying live records forward costs a rewrite; do it once garbage outweighs them, so
        # the log stays within about twice its live size plus two segments.
        live = index.live_bytes + index.state_bytes
        garbage = self.store.disk_bytes() - live
        if garbage >= live + 2 * self.parts.settings.segment_bytes:
            return oldest
        return None

    async def _reclaim(self, segment: Segment) -> bool:
        store, parts = self.store, self.parts
        if segment.live_bytes:
            data = await trio.to_thread.run_sync(read_segment, parts.directory, segment.base)
            if store.closed:
                return False
            await self._copy_messages(segment, data)
        for key in list(segment.state):
            self._rewrite(key)
        if segment.live_bytes or segment.state:
            logger.error(
                "segment %d still holds %d live bytes after copying; keeping it",
                segment.base,
                segment.live_bytes,
            )
            return False
        # The copies and every record that made the segment's contents stale must be on disk
        # before the segment goes, whatever the fsync policy.
        await store.flush(parts.tail.end, fsync=True)
        if store.closed or parts.index.segments[0] is not segment:
            return False
        await trio.to_thread.run_sync(parts.files.unlink, segment.base)
        parts.index.remove_oldest()
        self.reclaimed += 1
        return True

    async def _copy_messages(self, segment: Segment, data: bytes) -> None:
        store = self.store
        index, tail = self.parts.index, self.parts.tail
        kind, copied = int(Kind.MESSAGE), 0
        for offset, body in Scanner(data):
            if body[0] != kind:
                continue
            ledger, entry, _ = message_key(body)
            found = index.find(ledger, entry)
            if found is None:
                continue
            run, i = found
            if run.positions[i] != segment.base + offset:
                continue
            position = tail.add_framed(data[offset : offset + run.sizes[i]])
            index.move_message(run, i, position)
            copied += 1
            if copied % _COPY_SLICE == 0:
                await trio.lowlevel.checkpoint()
                if store.closed:
                    return

    def _rewrite(self, key: StateKey) -> None:
        store = self.store
        match key:
            case ("T", name):
                store.write_topic(self.parts.index.topics[name])
            case ("C", topic, subscription):
                store.write_cursor((topic, subscription))
            case ("K", table, table_key):
                store.write_table_entry(table, table_key)
            case _:
                raise AssertionError(f"unknown state key {key!r}")
