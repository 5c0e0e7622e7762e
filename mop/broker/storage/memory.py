"""`MemoryStorage`: the storage interface kept in process memory, for unit tests and for merged
mode until the durable log is in place. Nothing survives the process, but one instance can be
handed to a second broker to exercise recovery.
"""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Mapping, Sequence

import trio

from mop.broker.storage.api import (
    CursorKey,
    CursorState,
    StorageError,
    StorageFull,
    StorageStats,
)
from mop.message import Message, MessageId

__all__ = ["MemoryStorage"]


def _size(message: Message) -> int:
    own = len(message.payload) + len(message.wire)
    own += sum(len(k) + len(v) for k, v in message.properties)
    return own + sum(_size(member) for member in message.batch)


class _Log:
    """The kept messages of one topic: parallel id and message lists from `head` on."""

    __slots__ = ("bytes", "head", "ids", "messages", "next_entry", "times")

    def __init__(self) -> None:
        self.ids: list[MessageId] = []
        self.messages: list[Message] = []
        self.times: list[int] = []  # append time (wall clock, s) of each message
        self.head = 0
        self.next_entry = 0
        self.bytes = 0

    def __len__(self) -> int:
        return len(self.ids) - self.head

    def trim(self, through: MessageId) -> None:
        end = bisect_right(self.ids, through, lo=self.head)
        self.bytes -= sum(_size(m) for m in self.messages[self.head : end])
        self.head = end
        # Compact once the dropped prefix dominates, so trimming stays amortised O(1).
        if self.head > 1024 and self.head * 2 > len(self.ids):
            del self.ids[: self.head]
            del self.messages[: self.head]
            del self.times[: self.head]
            self.head = 0

    def cut(self, appended_before: int | None, keep_bytes: int | None) -> MessageId | None:
        end = self.head
        if appended_before is not None:
            end = bisect_left(self.times, appended_before, lo=self.head)
        if keep_bytes is not None:
            excess, i = self.bytes - keep_bytes, self.head
            while excess > 0 and i < len(self.ids):
                excess -= _size(self.messages[i])
                i += 1
            end = max(end, i)
        return self.ids[end - 1] if end > self.head else None


class MemoryStorage:
    """Implements `Storage` with dicts and lists; `max_bytes` (0 = no limit) makes `append`
    raise `StorageFull` once the kept payloads would exceed it, like a full disk."""

    def __init__(self, *, max_bytes: int = 0) -> None:
        self.max_bytes = max_bytes
        # The wall clock (s) that dates appended messages, for retention by time.
        self.clock: Callable[[], float] = time.time
        self._logs: dict[str, _Log] = {}
        self._cursors: dict[CursorKey, CursorState] = {}
        self._tables: dict[str, dict[str, bytes]] = {}
        self._bytes = 0
        self._closed = False
        # Counted so tests can check that QoS 0 publishes never wait for a sync.
        self.syncs = 0

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError("storage is closed")

    def append(self, topic: str, messages: Sequence[Message]) -> list[MessageId]:
        self._check_open()
        size = sum(_size(m) for m in messages)
        if self.max_bytes and self._bytes + size > self.max_bytes:
            raise StorageFull(f"storage limit of {self.max_bytes} bytes reached")
        log = self._logs.get(topic)
        if log is None:
            log = self._logs[topic] = _Log()
        ids = []
        now = int(self.clock())
        for message in messages:
            message_id = MessageId(0, log.next_entry)
            log.next_entry += 1
            log.ids.append(message_id)
            log.messages.append(message)
            log.times.append(now)
            ids.append(message_id)
        log.bytes += size
        self._bytes += size
        return ids

    def when_written(self, callback: Callable[[bool], None]) -> None:
        callback(True)  # nothing to write

    async def sync(self) -> None:
        self._check_open()
        self.syncs += 1
        await trio.lowlevel.checkpoint()

    async def read(
        self, topic: str, after: MessageId | None, max_count: int, max_bytes: int | None = None
    ) -> list[tuple[MessageId, Message]]:
        self._check_open()
        await trio.lowlevel.checkpoint()
        log = self._logs.get(topic)
        if log is None:
            return []
        start = log.head if after is None else bisect_right(log.ids, after, lo=log.head)
        end = min(len(log.ids), start + max_count)
        if max_bytes is not None:
            total = 0
            for index in range(start, end):
                total += _size(log.messages[index])
                if total > max_bytes and index > start:
                    end = index
                    break
        return list(zip(log.ids[start:end], log.messages[start:end], strict=True))

    def topics(self) -> list[str]:
        return list(self._logs)

    def last_id(self, topic: str) -> MessageId | None:
        log = self._logs.get(topic)
        if log is None or log.next_entry == 0:
            return None
        return MessageId(0, log.next_entry - 1)

    def trim(self, topic: str, through: MessageId) -> None:
        self._check_open()
        log = self._logs.get(topic)
        if log is not None:
            before = log.bytes
            log.trim(through)
            self._bytes -= before - log.bytes

    def retention_cut(
        self, topic: str, *, appended_before: int | None, keep_bytes: int | None
    ) -> MessageId | None:
        log = self._logs.get(topic)
        return None if log is None else log.cut(appended_before, keep_bytes)

    def delete_topic(self, topic: str) -> None:
        self._check_open()
        log = self._logs.pop(topic, None)
        if log is not None:
            self._bytes -= log.bytes
        for key in [key for key in self._cursors if key[0] == topic]:
            del self._cursors[key]

    def save_cursors(self, updates: Mapping[CursorKey, CursorState | None]) -> None:
        self._check_open()
        for key, state in updates.items():
            if state is None:
                self._cursors.pop(key, None)
            else:
                self._cursors[key] = state

    def load_cursors(self) -> dict[CursorKey, CursorState]:
        return dict(self._cursors)

    def table_put(self, table: str, key: str, value: bytes | None) -> None:
        self._check_open()
        entries = self._tables.setdefault(table, {})
        if value is None:
            entries.pop(key, None)
        else:
            entries[key] = value

    def table_items(self, table: str) -> Iterator[tuple[str, bytes]]:
        return iter(list(self._tables.get(table, {}).items()))

    def stats(self) -> StorageStats:
        messages = sum(len(log) for log in self._logs.values())
        return StorageStats(topics=len(self._logs), messages=messages, bytes=self._bytes)

    def oldest_append_time(self, topic: str) -> int | None:
        log = self._logs.get(topic)
        return None if log is None or not len(log) else log.times[log.head]

    def topic_size(self, topic: str) -> int:
        log = self._logs.get(topic)
        return 0 if log is None else log.bytes

    @property
    def closed(self) -> bool:
        return self._closed

    def reopen(self) -> None:
        """Allow use after `aclose`, as a durable store reopened from its files would."""
        self._closed = False

    async def aclose(self) -> None:
        self._closed = True
        await trio.lowlevel.checkpoint()
