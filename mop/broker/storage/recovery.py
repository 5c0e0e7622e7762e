"""Recovery of the durable log: scan every segment in order, verify each record, cut a torn
tail off the last segment, and rebuild the indexes, cursors and tables. Blocking; run it in a
worker thread.

A bad record in the last segment is a write that a crash interrupted: the segment is cut there.
A bad record in an older segment is damage to data that was once complete: the rest of that
segment is skipped (and left on disk untouched), the error is logged, and recovery goes on with
the next segment, whose records do not depend on the skipped ones being readable.
"""

from __future__ import annotations

import logging
import time
import zlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path

from mop.broker.storage.index import LogIndex, Run, TopicIndex
from mop.broker.storage.records import (
    FRAME,
    HEADER_SIZE,
    MAX_RECORD,
    MESSAGE_KEY,
    MESSAGE_MIN,
    CursorRecord,
    EpochRecord,
    Kind,
    Record,
    SegmentHeader,
    TableRecord,
    TopicDeleteRecord,
    TopicRecord,
    TrimRecord,
    decode_record,
)
from mop.broker.storage.segments import cut_segment, list_segments, read_segment, segment_path
from mop.message import MessageId

__all__ = ["Recovered", "RecoveryReport", "recover"]

logger = logging.getLogger("mop.storage")


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What opening the store found on disk."""

    topics: int
    messages: int
    cursors: int
    table_keys: int
    segments: int
    bytes: int  # scanned
    truncated: int  # torn bytes cut off the last segment
    skipped: int  # bytes of older segments left unread after a bad record
    seconds: float

    def __str__(self) -> str:
        text = (
            f"recovered {self.topics} topics, {self.messages} messages, {self.cursors} cursors"
            f" and {self.table_keys} table keys from {self.segments} segments"
            f" ({self.bytes / 1e6:.1f} MB) in {self.seconds:.2f} s;"
            f" truncated {self.truncated} torn bytes"
        )
        if self.skipped:
            text += f"; SKIPPED {self.skipped} bytes after corrupt records"
        return text


@dataclass(slots=True)
class Recovered:
    index: LogIndex
    report: RecoveryReport
    end: int  # log position where the next record goes
    epoch: int  # highest epoch found, -1 for an empty directory


@dataclass(slots=True)
class _Ledger:
    """Message records of one ledger in scan (= log) order."""

    entries: array[int] = field(default_factory=lambda: array("q"))
    positions: array[int] = field(default_factory=lambda: array("q"))
    sizes: array[int] = field(default_factory=lambda: array("I"))
    times: array[int] = field(default_factory=lambda: array("I"))

    def runs(self, ledger: int) -> list[Run]:
        """Runs of consecutive entries. A reclaim may have copied older entries after newer
        ones, and a crash between the copy and the deletion leaves two copies: the later
        position wins."""
        entries, n = self.entries, len(self.entries)
        if n and entries == array("q", range(entries[0], entries[0] + n)):
            run = Run(ledger, entries[0])
            run.load(self.positions, self.sizes, self.times)
            return [run]
        latest = {entry: i for i, entry in enumerate(entries)}
        runs: list[Run] = []
        for entry in sorted(latest):
            i = latest[entry]
            if not runs or runs[-1].next_entry != entry:
                runs.append(Run(ledger, entry))
            runs[-1].append(self.positions[i], self.sizes[i], self.times[i])
        return runs


@dataclass(slots=True)
class _TopicState:
    ledgers: set[int] = field(default_factory=set)
    last_id: MessageId | None = None
    trimmed: MessageId | None = None
    declared: bool = False  # a topic record was seen (else only a trim survived)


def _max(a: MessageId | None, b: MessageId | None) -> MessageId | None:
    if a is None:
        return b
    return a if b is None or a >= b else b


class _Replay:
    """Applies records in log order. Messages are gathered per ledger and bound to topics at
    the end, because the topic record naming a ledger may have been rewritten after them."""

    def __init__(self) -> None:
        self.index = LogIndex()
        self.ledgers: dict[int, _Ledger] = {}
        self.dead: set[int] = set()
        self.topics: dict[str, _TopicState] = {}
        self.epoch = -1

    def scan(self, base: int, data: memoryview) -> tuple[int, str | None]:
        """Replay one segment's records; returns where it stopped and why (None: at the end).

        The framing checks of `records.Scanner`, inlined: this loop is most of recovery time.
        """
        ledgers, dead = self.ledgers, self.dead
        unpack_frame, unpack_key, crc32 = FRAME.unpack_from, MESSAGE_KEY.unpack_from, zlib.crc32
        kind, head, limit = int(Kind.MESSAGE), FRAME.size, len(data)
        offset = HEADER_SIZE
        while offset < limit:
            if limit - offset < head:
                return offset, "torn record header"
            length, crc = unpack_frame(data, offset)
            start = offset + head
            end = start + length
            if length == 0 or length > MAX_RECORD or end > limit:
                return offset, "bad record length" if length == 0 else "torn record"
            if crc32(data[start:end]) != crc:
                return offset, "checksum mismatch"
            if data[start] == kind and length >= MESSAGE_MIN:
                ledger, entry, millis = unpack_key(data, start + 1)
                acc = ledgers.get(ledger)
                if acc is None and ledger not in dead:
                    acc = ledgers[ledger] = _Ledger()
                if acc is not None:
                    acc.entries.append(entry)
                    acc.positions.append(base + offset)
                    acc.sizes.append(head + length)
                    acc.times.append(millis // 1000)
            else:
                self._replay_state(data[start:end], base + offset, head + length)
            offset = end
        return offset, None

    def _replay_state(self, body: memoryview, position: int, size: int) -> None:
        try:
            record = decode_record(body)
        except ValueError as exc:
            # The checksum held, so this is a format this code does not know, not a torn
            # write: keep going rather than lose everything after it.
            logger.error("log position %d: unreadable record (%s)", position, exc)
            return
        self.apply(record, position, size)

    def apply(self, record: Record, position: int, size: int) -> None:
        index = self.index
        match record:
            case TopicRecord(name, ledgers, last_id, trimmed):
                topic = self.topics.setdefault(name, _TopicState())
                topic.ledgers.update(ledgers)
                topic.last_id = _max(topic.last_id, last_id)
                topic.trimmed = _max(topic.trimmed, trimmed)
                topic.declared = True
                index.set_state(("T", name), position, size)
            case TrimRecord(name, through):
                topic = self.topics.setdefault(name, _TopicState())
                topic.trimmed = _max(topic.trimmed, through)
            case TopicDeleteRecord(name):
                gone = self.topics.pop(name, None)
                for ledger in gone.ledgers if gone else ():
                    self.dead.add(ledger)
                    self.ledgers.pop(ledger, None)
                index.set_state(("T", name), None)
                index.drop_topic_cursors(name)
            case CursorRecord(topic_name, subscription, state):
                index.put_cursor((topic_name, subscription), state)
                key = ("C", topic_name, subscription)
                index.set_state(key, None if state is None else position, size)
            case TableRecord(table, key, value):
                index.put_table(table, key, value)
                index.set_state(("K", table, key), None if value is None else position, size)
            case EpochRecord(epoch):
                self.epoch = max(self.epoch, epoch)

    def finish(self) -> None:
        for name, state in self.topics.items():
            if state.declared:
                self.index.add_topic(self._build(name, state))
        # Whatever is left belongs to deleted topics or lost its topic record to corruption.
        self.ledgers.clear()

    def _build(self, name: str, state: _TopicState) -> TopicIndex:
        topic = TopicIndex(name, last_id=state.last_id, trimmed=state.trimmed)
        for ledger in sorted(state.ledgers):
            acc = self.ledgers.pop(ledger, None)
            if acc is None:
                continue
            for run in acc.runs(ledger):
                topic.runs.append(run)
                topic.count += len(run)
                topic.bytes += sum(run.sizes)
                topic.last_id = _max(topic.last_id, MessageId(ledger, run.next_entry - 1))
        if topic.trimmed is not None:
            for _ in topic.trim(topic.trimmed):
                pass
        return topic


def _drop_torn_last_segments(directory: Path, bases: list[int]) -> int:
    """Remove trailing segment files whose header never made it to disk whole."""
    removed = 0
    while bases:
        path = segment_path(directory, bases[-1])
        with path.open("rb") as file:
            header = SegmentHeader.decode(file.read(HEADER_SIZE))
        if header is not None and header.base == bases[-1]:
            break
        removed += path.stat().st_size
        cut_segment(directory, bases.pop(), 0)
    return removed


def recover(directory: Path) -> Recovered:
    started = time.perf_counter()
    bases = list_segments(directory)
    truncated = _drop_torn_last_segments(directory, bases)
    replay = _Replay()
    scanned = skipped = end = 0
    for n, base in enumerate(bases):
        data = read_segment(directory, base)
        scanned += len(data)
        replay.index.add_segment(base)
        header = SegmentHeader.decode(data)
        if header is None or header.base != base:
            logger.error("segment %d: bad header, skipping %d bytes", base, len(data))
            skipped += len(data)
            continue
        replay.epoch = max(replay.epoch, header.epoch)
        valid, error = replay.scan(base, memoryview(data))
        end = base + valid
        if error is None:
            continue
        lost = len(data) - valid
        if n == len(bases) - 1:
            logger.warning("segment %d: cutting %d bytes (%s)", base, lost, error)
            cut_segment(directory, base, valid)
            truncated += lost
        else:
            logger.error(
                "segment %d offset %d: %s; skipping the %d bytes after it",
                base,
                valid,
                error,
                lost,
            )
            skipped += lost
    replay.finish()
    index = replay.index
    report = RecoveryReport(
        topics=len(index.topics),
        messages=index.messages,
        cursors=len(index.cursors),
        table_keys=sum(len(entries) for entries in index.tables.values()),
        segments=len(bases),
        bytes=scanned,
        truncated=truncated,
        skipped=skipped,
        seconds=time.perf_counter() - started,
    )
    return Recovered(index, report, end, replay.epoch)
