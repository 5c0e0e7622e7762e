"""Reading messages back from the durable log: from bytes not yet written or written recently
(kept by the log tail), or from segment files in a worker thread, one pread per run of adjacent
records.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import trio

from mop.broker.storage.api import StorageError
from mop.broker.storage.index import LogIndex, Slot
from mop.broker.storage.log import LogTail
from mop.broker.storage.records import FRAME, decode_message
from mop.broker.storage.segments import read_spans
from mop.message import Message, MessageId

__all__ = ["LogReader"]

# A reclaim can move records between looking up their positions and reading them; the read then
# looks them up again. More than a few moves in a row means something is wrong.
_ATTEMPTS = 4


def _decode(record: bytes, position: int) -> Message:
    length, crc = FRAME.unpack_from(record)
    body = memoryview(record)[FRAME.size :]
    if length != len(body) or zlib.crc32(body) != crc:
        raise StorageError(f"corrupt record at log position {position}")
    return decode_message(body)[1]


class LogReader:
    """Reads messages of the log whose records `index` locates: from `tail` when it still
    holds them, else from the segment files in `directory`."""

    __slots__ = ("directory", "index", "tail")

    def __init__(self, index: LogIndex, tail: LogTail, directory: Path) -> None:
        self.index = index
        self.tail = tail
        self.directory = directory

    async def read(
        self, topic: str, after: MessageId | None, max_count: int, max_bytes: int | None = None
    ) -> list[tuple[MessageId, Message]]:
        """Up to `max_count` messages of `topic` after `after`, in order; with `max_bytes`,
        those whose records fit in that many bytes (one at least)."""
        for _ in range(_ATTEMPTS):
            entry_topic = self.index.topics.get(topic)
            if entry_topic is None or max_count <= 0:
                await trio.lowlevel.checkpoint()
                return []
            found: list[tuple[MessageId, Message | None]] = []
            misses: list[tuple[int, int, int]] = []  # (slot, position, size)
            slots = entry_topic.locate(after, max_count)
            if max_bytes is not None:
                slots = _within(slots, max_bytes)
            for ledger, entry, position, size in slots:
                message = None
                raw = self.tail.find(position, size)
                if raw is not None:
                    message = _decode(raw, position)
                else:
                    misses.append((len(found), position, size))
                found.append((MessageId(ledger, entry), message))
            if not misses:
                await trio.lowlevel.checkpoint()
                return [(i, m) for i, m in found if m is not None]
            spans, parts = _spans(self.index, misses)
            try:
                chunks = await trio.to_thread.run_sync(read_spans, self.directory, spans)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise StorageError(f"log read failed: {exc}") from exc
            for (slot, position, _), (span, start, end) in zip(misses, parts, strict=True):
                found[slot] = (found[slot][0], _decode(chunks[span][start:end], position))
            return [(i, m) for i, m in found if m is not None]
        raise StorageError(f"records of {topic} kept moving during a read")


def _within(slots: list[Slot], max_bytes: int) -> list[Slot]:
    """The first of `slots` whose records add up to at most `max_bytes` (one at least)."""
    total = 0
    for count, slot in enumerate(slots):
        total += slot[3]
        if total > max_bytes and count:
            return slots[:count]
    return slots


def _spans(
    index: LogIndex, misses: list[tuple[int, int, int]]
) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """Merge adjacent records of one segment into single reads. Returns the reads as
    (segment base, offset, size) and, per miss, (read number, start, end) in that read."""
    spans: list[tuple[int, int, int]] = []
    parts: list[tuple[int, int, int]] = []
    for _, position, size in misses:
        base = index.segment_at(position).base
        if spans:
            last_base, last_offset, last_size = spans[-1]
            if last_base == base and last_offset + last_size == position - base:
                parts.append((len(spans) - 1, last_size, last_size + size))
                spans[-1] = (base, last_offset, last_size + size)
                continue
        parts.append((len(spans), 0, size))
        spans.append((base, position - base, size))
    return spans, parts
