"""Rows of whole Pulsar entries, as mop's driver hands them over: a batch's messages go straight
into the columns of a `RowBatch`, with no object per message on the way.

The rows are those pulsar-client's reader gives for the same entries (its `partition_key`,
`data`, `properties`, publish and event time, and message id), so that either way of reading
makes the same DataFrame. An entry this cannot read (a chunk of a larger message, an encrypted
or otherwise undecodable batch, one the driver could not decompress) raises `Unreadable`;
pulsar-client reads it instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from mop.protocols.pulsar.batching import read_columns
from mop.protocols.pulsar.driver import ReceivedEntry
from mop.protocols.pulsar.errors import PulsarError
from mop.protocols.pulsar.frames import unacked_indexes
from mop.spark.positions import WHOLE_ENTRY
from mop.spark.rows import RowBatch

__all__ = ["Key", "Unreadable", "add_entry"]

Key = tuple[int, int, int]  # (ledger, entry, batch index or WHOLE_ENTRY): see `order_key`


class Unreadable(Exception):
    """An entry whose messages only a full Pulsar client can read."""


def add_entry(rows: RowBatch, entry: ReceivedEntry, after: Key, through: Key) -> Key | None:
    """Add the messages of `entry` in (after, through] to `rows`; the key of the last one
    added (None: none was)."""
    meta = entry.metadata
    if meta.chunk_id is not None:
        raise Unreadable("a chunk of a larger message")
    if meta.encrypted:
        raise Unreadable("an encrypted message")
    if entry.undecodable is not None:
        raise Unreadable(entry.undecodable)
    ledger, number = entry.message_id.ledger, entry.message_id.entry
    published = meta.publish_time * 1000
    if not meta.batched:
        key = (ledger, number, WHOLE_ENTRY)
        if not after < key <= through:
            return None
        event = meta.event_time
        rows.extend(
            [meta.partition_key or None],
            [b"" if meta.null_value else entry.data],
            [tuple((kv.key, kv.value) for kv in meta.properties)],
            published,
            [event * 1000 if event else None],
            [f"{ledger}:{number}"],
        )
        return key
    if (ledger, number) > through[:2]:
        return None
    count = meta.message_count
    try:
        payloads, properties, keys, events = read_columns(entry.data, count)
    except PulsarError as exc:
        raise Unreadable(str(exc)) from None
    first, stop = 0, count
    if (ledger, number) <= after[:2]:
        first = after[2] + 1  # a range may start inside this entry
    if (ledger, number) >= through[:2]:
        stop = min(stop, through[2] + 1)
    indexes: Sequence[int] = range(first, stop)
    if entry.ack_set:  # acknowledged messages of a batch are not delivered again
        owed = set(unacked_indexes(entry.ack_set, count))
        indexes = [index for index in indexes if index in owed]
    if not indexes:
        return None
    if len(indexes) != count:
        payloads = [payloads[index] for index in indexes]
        properties = [properties[index] for index in indexes]
        keys = [keys[index] for index in indexes]
        events = [events[index] for index in indexes]
    if "" in keys:
        keys = [key or None for key in keys]  # pulsar-client shows no key as ""
    prefix = f"{ledger}:{number}:"
    rows.extend(
        keys,
        payloads,
        properties,
        published,
        [time * 1000 if time else None for time in events] if any(events) else [None] * len(keys),
        [prefix + str(index) for index in indexes],
    )
    return (ledger, number, indexes[-1])
