"""Read one range of one topic as Arrow record batches: whole entries with mop's driver,
decoded straight into columns, and pulsar-client's reader for what only it can read.

A range is every message after its start position up to and including its end position. The
task opens its own clients and readers (nothing live can be shipped to a Spark task) and stops
at the end position, or earlier when the topic holds nothing more (its end was trimmed away).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import pulsar
import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from mop.message import MessageId
from mop.protocols.pulsar.driver import ReceivedEntry
from mop.spark.client import last_message_id, open_client, to_pulsar_id
from mop.spark.entries import Unreadable, add_entry
from mop.spark.fetch import EntryFeed
from mop.spark.options import ReadOptions
from mop.spark.positions import WHOLE_ENTRY, format_position, order_key
from mop.spark.rows import ROWS_PER_BATCH, RowBatch
from mop.spark.security import link_auth
from mop.spark.topics import topic_names

__all__ = ["DataLossError", "TopicRange", "read_range", "split_range"]

# How long a read waits before it asks the broker whether more messages are coming at all.
_IDLE_MS: Final = 1000


class DataLossError(RuntimeError):
    """A range could not be read to its end: its messages are gone from the broker."""


@dataclass(frozen=True)
class TopicRange(InputPartition):
    """One Spark partition: the messages of `topic` in (start, end]."""

    topic: str
    start: MessageId
    end: MessageId


def split_range(
    topic: str, start: MessageId, end: MessageId, entries: int, first: MessageId | None = None
) -> list[TopicRange]:
    """The range as Spark partitions of at most `entries` stored entries each.

    Entry ids count up within a ledger, so the part of the range in the ledger of its end can be
    cut by entry id: from the start when it is in that ledger, else from `first` (the first
    message after the start) when that is. A range that spans ledgers otherwise stays whole.
    """
    if start.ledger == end.ledger:
        low = start.entry
    elif first is not None and first.ledger == end.ledger:
        low = first.entry - 1
    else:
        return [TopicRange(topic, start, end)]
    ranges = []
    lower = start
    for cut in range(low + entries, end.entry, entries):
        upper = MessageId(end.ledger, cut)
        ranges.append(TopicRange(topic, lower, upper))
        lower = upper
    ranges.append(TopicRange(topic, lower, end))
    return ranges


def read_range(options: ReadOptions, part: TopicRange) -> Iterator[pa.RecordBatch]:
    """The rows of the range, in record batches of about `ROWS_PER_BATCH`.

    Entries are read whole with mop's driver and their batches decoded straight into columns
    (`entries`); from an entry that only a full client can read (a chunk of a larger message,
    an encrypted batch) on, pulsar-client's reader reads the rest of the range.
    """
    names = topic_names(part.topic, tenant=options.tenant, namespace=options.namespace)
    rows = RowBatch(names)
    after = order_key(part.start)
    through = order_key(part.end)
    unreadable = False
    feed = EntryFeed(
        options.service_url, link_auth(options.security), part.topic, part.start, options.timeout_ms
    )
    with feed:
        for entry in _entries(feed, options, part, after):
            try:
                last = add_entry(rows, entry, after, through)
            except Unreadable:
                unreadable = True
                break
            if last is not None:
                after = last
            if len(rows) >= ROWS_PER_BATCH:
                yield rows.take()
            if (entry.message_id.ledger, entry.message_id.entry) >= through[:2]:
                break  # the end of the range is in this entry
    if unreadable:
        # pulsar-client reads on from the last row added.
        rest = TopicRange(part.topic, _position(after), part.end)
        yield from _read_with_client(options, rest, rows)
    elif len(rows):
        yield rows.take()


def _entries(
    feed: EntryFeed, options: ReadOptions, part: TopicRange, after: tuple[int, int, int]
) -> Iterator[ReceivedEntry]:
    """The entries `feed` reads, until the broker has no more to give.

    The end of the range was the topic's last message when it was planned, so the feed reads
    on until it gets there and only asks the broker whether more is coming when it has waited
    a while. The caller stops at the end of the range."""
    waited = 0
    last = after
    while True:
        entry = feed.get(_IDLE_MS / 1000)
        if entry is not None:
            waited = 0
            last = max(last, (entry.message_id.ledger, entry.message_id.entry, WHOLE_ENTRY))
            yield entry
            continue
        client = open_client(options.service_url, options.timeout_ms, options.security)
        try:
            newest = last_message_id(client, part.topic, options.timeout_ms)
        finally:
            client.close()
        if newest is None or order_key(newest) <= last:
            return  # the broker has nothing more: the range's end was deleted
        waited += _IDLE_MS
        if waited >= options.timeout_ms:
            raise _lost(part, options.timeout_ms, last)


def _read_with_client(
    options: ReadOptions, part: TopicRange, rows: RowBatch
) -> Iterator[pa.RecordBatch]:
    client = open_client(options.service_url, options.timeout_ms, options.security)
    try:
        reader = client.create_reader(
            part.topic, to_pulsar_id(part.start), receiver_queue_size=ROWS_PER_BATCH
        )
        for message, message_id in _messages(reader, part, options.timeout_ms):
            rows.add(message, message_id)
            if len(rows) >= ROWS_PER_BATCH:
                yield rows.take()
        if len(rows):
            yield rows.take()
    finally:
        client.close()


def _messages(reader: Any, part: TopicRange, timeout_ms: int) -> Iterator[tuple[Any, str]]:
    """The reader's messages in the range, with their ids as text.

    The end of the range was the topic's last message when it was planned, so the reader
    reads on until it gets there and only asks the broker whether more is coming when it has
    waited a while: asking for every message would cost a call each.
    """
    after = order_key(part.start)
    through = order_key(part.end)
    last = after
    waited = 0
    while True:
        try:
            message = reader.read_next(_IDLE_MS)
        except pulsar.Timeout:
            if not reader.has_message_available():
                return  # the broker has nothing more: the range's end was deleted
            waited += _IDLE_MS
            if waited >= timeout_ms:
                raise _lost(part, timeout_ms, last) from None
            continue
        waited = 0
        pid = message.message_id()
        ledger, entry, index = pid.ledger_id(), pid.entry_id(), pid.batch_index()
        key = (ledger, entry, index if index >= 0 else WHOLE_ENTRY)
        if key <= after:
            continue  # a reader may begin inside the entry of the start position
        if key > through:
            return
        last = key
        yield message, f"{ledger}:{entry}" if index < 0 else f"{ledger}:{entry}:{index}"
        if key == through:
            return


def _lost(part: TopicRange, timeout_ms: int, last: tuple[int, int, int]) -> DataLossError:
    return DataLossError(
        f"{part.topic}: no message arrived in {timeout_ms} ms after {_text(last)},"
        f" although the broker reports more up to {format_position(part.end)}; were"
        " they deleted before this query read them? (the 'subscription' option"
        " keeps them for a stream)"
    )


def _position(key: tuple[int, int, int]) -> MessageId:
    ledger, entry, index = key
    return MessageId(ledger, entry, index if index != WHOLE_ENTRY else -1)


def _text(key: tuple[int, int, int]) -> str:
    return format_position(_position(key))
