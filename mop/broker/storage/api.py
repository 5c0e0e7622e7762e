"""The storage interface under the broker: one ordered write-ahead stream of messages, cursors
and table entries, made durable in groups by `sync()`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias

from mop.broker.storage.ranges import NO_IDS, IdRanges
from mop.message import Message, MessageId

__all__ = [
    "CursorKey",
    "CursorState",
    "Storage",
    "StorageError",
    "StorageFull",
    "StorageStats",
]

# (topic, subscription)
CursorKey: TypeAlias = tuple[str, str]


@dataclass(frozen=True, slots=True)
class CursorState:
    """Where a subscription stands on one topic.

    Every message with an id <= `mark_delete` is acknowledged (None: no message is); `acked`
    holds the ids after `mark_delete` that are acknowledged one by one, as runs of consecutive
    entries (so a long run costs what one id does). Every other stored message after
    `mark_delete` is still owed to the subscription.
    """

    mark_delete: MessageId | None
    acked: IdRanges = NO_IDS


@dataclass(frozen=True, slots=True)
class StorageStats:
    topics: int
    messages: int
    bytes: int


class StorageError(Exception):
    """The storage failed to read or write (I/O error, corrupt data, closed store)."""


class StorageFull(StorageError):
    """The disk or a configured size limit refuses more data; backends answer `QuotaExceeded`."""


class Storage(Protocol):
    """Messages per topic, subscription cursors and small key -> value tables.

    Every mutation (`append`, `trim`, `delete_topic`, `save_cursors`, `table_put`) returns at
    once: it takes effect for readers immediately and is queued, in call order, for writing.
    `await sync()` returns when everything queued before the call is durable under the store's
    fsync policy, so concurrent callers share one write and one fsync (group commit), and a
    durable cursor or table entry never refers to a message that is lost. A store may raise
    `StorageFull` from a mutation (refusing it) or from `sync()` (the write failed).

    Message ids are strictly increasing per topic for the whole life of the store, across
    `trim` and restarts; only `delete_topic` lets a topic start again.
    """

    def append(self, topic: str, messages: Sequence[Message]) -> list[MessageId]:
        """Assign the next ids of `topic` to `messages` (creating the topic) and queue them."""
        ...

    async def sync(self) -> None:
        """Return once every mutation made before this call is durable."""
        ...

    def when_written(self, callback: Callable[[bool], None]) -> None:
        """Call `callback(True)` on the event loop once the messages appended so far are
        written (they will be durable at the next `sync()`), or `callback(False)` if their
        write failed: they are then refused, never stored, and `sync()` raises for them.
        What is not delivered before `callback(True)` can never be delivered and then lost to a
        failed write."""
        ...

    async def read(
        self, topic: str, after: MessageId | None, max_count: int, max_bytes: int | None = None
    ) -> list[tuple[MessageId, Message]]:
        """Up to `max_count` stored messages of `topic` with an id greater than `after`
        (None: from the first one kept), in id order; [] for an unknown topic. With
        `max_bytes`, no more messages than fit in about that many bytes as stored (always
        one at least)."""
        ...

    def topics(self) -> list[str]:
        """Every topic that has been appended to and not deleted (even if trimmed empty)."""
        ...

    def last_id(self, topic: str) -> MessageId | None:
        """The id last assigned in `topic` (even if trimmed since), None if there is none."""
        ...

    def trim(self, topic: str, through: MessageId) -> None:
        """Drop the messages of `topic` with an id <= `through`; their space may be reclaimed."""
        ...

    def retention_cut(
        self, topic: str, *, appended_before: int | None, keep_bytes: int | None
    ) -> MessageId | None:
        """The last id of the oldest kept messages of `topic` that retention's limits let go:
        those appended before `appended_before` (wall clock, s), and those beyond the newest
        `keep_bytes` bytes of the topic (None: that limit does not apply). None when none."""
        ...

    def oldest_append_time(self, topic: str) -> int | None:
        """When (wall clock, s) the oldest kept message of `topic` was appended (None: none
        is kept): when retention by time next has something to trim there."""
        ...

    def delete_topic(self, topic: str) -> None:
        """Forget `topic`, its messages and its cursors."""
        ...

    def save_cursors(self, updates: Mapping[CursorKey, CursorState | None]) -> None:
        """Record cursor states (None deletes one). Cheap: a store keeps only the latest state
        of each cursor, so callers may save on every acknowledgement."""
        ...

    def load_cursors(self) -> dict[CursorKey, CursorState]:
        """Every saved cursor."""
        ...

    def table_put(self, table: str, key: str, value: bytes | None) -> None:
        """Set a key of a table (None deletes it)."""
        ...

    def table_items(self, table: str) -> Iterator[tuple[str, bytes]]:
        """A snapshot of every key of a table with its latest value."""
        ...

    def stats(self) -> StorageStats: ...

    def topic_size(self, topic: str) -> int:
        """Bytes the kept messages of `topic` take (0 for a topic it does not hold)."""
        ...

    @property
    def closed(self) -> bool:
        """Whether `aclose` was called (later calls raise `StorageError`)."""
        ...

    async def aclose(self) -> None:
        """Make everything durable and release files; later calls raise `StorageError`."""
        ...
