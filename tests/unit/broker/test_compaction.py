"""Compacted topics of the system namespace: the latest message per key, tombstones, readers
from the earliest position, batches, trimming and recovery."""

from __future__ import annotations

from mop.broker import Broker
from mop.broker.compaction import TOMBSTONE_PROPERTY
from mop.broker.storage import MemoryStorage
from mop.message import Delivery, Message, MessageId
from mop.messaging import StartPosition

from .support import Clock, payloads, subscribe, take_all

TABLE = "persistent://public/__mop/retained"


def put(key: str, value: str) -> Message:
    return Message(value.encode(), key=key)


def delete(key: str) -> Message:
    return Message(b"", key=key, properties=((TOMBSTONE_PROPERTY, "1"),))


def new_broker(storage: MemoryStorage) -> Broker:
    return Broker(storage, clock=Clock())


def keyed(deliveries: list[Delivery]) -> list[tuple[str | None, str]]:
    return [(d.message.key, d.message.payload.decode()) for d in deliveries]


async def test_a_reader_from_the_earliest_sees_the_latest_value_of_each_live_key() -> None:
    broker = new_broker(MemoryStorage())
    for message in (put("a", "1"), put("b", "1"), put("a", "2"), put("c", "1"), delete("b")):
        await broker.publish(TABLE, message)
    reader = await subscribe(broker, "r", [TABLE], durable=False, start=StartPosition.EARLIEST)
    assert keyed(take_all(broker, reader)) == [("a", "2"), ("c", "1")]
    # Later writes come as they are written, deletions included.
    await broker.publish(TABLE, put("a", "3"))
    await broker.publish(TABLE, delete("c"))
    assert keyed(take_all(broker, reader)) == [("a", "3"), ("c", "")]


async def test_other_namespaces_are_not_compacted() -> None:
    broker = new_broker(MemoryStorage())
    plain = "persistent://public/default/t"
    await broker.publish(plain, put("a", "1"))
    await broker.publish(plain, put("a", "2"))
    reader = await subscribe(broker, "r", [plain], durable=False, start=StartPosition.EARLIEST)
    assert payloads(take_all(broker, reader)) == ["1", "2"]


async def test_a_latest_reader_gets_only_later_writes() -> None:
    broker = new_broker(MemoryStorage())
    await broker.publish(TABLE, put("a", "1"))
    reader = await subscribe(broker, "r", [TABLE], durable=False)
    await broker.publish(TABLE, put("b", "1"))
    assert keyed(take_all(broker, reader)) == [("b", "1")]


async def test_the_table_outlives_trimming_of_the_log() -> None:
    storage = MemoryStorage()
    broker = new_broker(storage)
    await broker.publish(TABLE, put("a", "1"))
    await broker.publish(TABLE, put("b", "1"))
    broker.trim_acknowledged()  # nobody subscribes: the log goes
    assert storage.stats().messages == 0
    reader = await subscribe(broker, "r", [TABLE], durable=False, start=StartPosition.EARLIEST)
    assert keyed(take_all(broker, reader)) == [("a", "1"), ("b", "1")]


async def test_the_table_survives_a_restart() -> None:
    storage = MemoryStorage()
    first = new_broker(storage)
    for message in (put("a", "1"), put("b", "1"), delete("a")):
        await first.publish(TABLE, message)
    last_written = await first.publish(TABLE, put("c", "1"))
    second = new_broker(storage)
    await second.recover()
    reader = await subscribe(second, "r", [TABLE], durable=False, start=StartPosition.EARLIEST)
    assert keyed(take_all(second, reader)) == [("b", "1"), ("c", "1")]
    last, _ = await second.position(reader.sub, TABLE)
    assert last == last_written.message_id


async def test_batch_members_are_kept_per_key() -> None:
    broker = new_broker(MemoryStorage())
    batch = Message(b"", batch=(put("a", "1"), put("b", "1"), put("c", "1")))
    stored = await broker.publish(TABLE, batch)
    await broker.publish(TABLE, put("b", "2"))
    reader = await subscribe(broker, "r", [TABLE], durable=False, start=StartPosition.EARLIEST)
    deliveries = take_all(broker, reader)
    # The batch comes back with the members still current ("b" was written since).
    assert [d.message_id for d in deliveries][:2] == [
        MessageId(stored.message_id.ledger, stored.message_id.entry, 0),
        MessageId(stored.message_id.ledger, stored.message_id.entry, 1),
    ]
    assert keyed(deliveries) == [("a", "1"), ("c", "1"), ("b", "2")]


async def test_the_last_position_is_the_last_current_message() -> None:
    broker = new_broker(MemoryStorage())
    await broker.publish(TABLE, put("a", "1"))
    second = await broker.publish(TABLE, put("b", "1"))
    await broker.publish(TABLE, delete("a"))  # the last entry, but a reader never gets it
    reader = await subscribe(broker, "r", [TABLE], durable=False, start=StartPosition.EARLIEST)
    last, _ = await broker.position(reader.sub, TABLE)
    assert last == second.message_id
    assert [d.message_id for d in take_all(broker, reader)] == [second.message_id]


async def test_acknowledged_snapshot_entries_move_a_durable_cursor() -> None:
    storage = MemoryStorage()
    broker = new_broker(storage)
    await broker.publish(TABLE, put("a", "1"))
    await broker.publish(TABLE, put("a", "2"))
    sub = await subscribe(broker, "d", [TABLE], start=StartPosition.EARLIEST)
    got = take_all(broker, sub)
    assert keyed(got) == [("a", "2")]
    broker.ack(sub, got)
    cursor = sub.sub.cursors[TABLE]
    assert cursor.mark_delete == got[0].message_id
    assert not cursor.acked
