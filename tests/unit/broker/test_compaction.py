"""Compacted topics of the system namespace: the latest message per key, tombstones, readers
from the earliest position, batches, trimming and recovery; and `CompactedTopics.last`, kept up
to date as keys are written, deleted and restored (it must answer what a full scan of the live
keys answers, after any sequence of those)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mop.broker import Broker
from mop.broker.compaction import CompactedTopics
from mop.broker.storage import IdRanges, MemoryStorage
from mop.message import TOMBSTONE_PROPERTY, Delivery, Message, MessageId
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


TOPIC = "persistent://public/__mop/retained"
KEYS = st.sampled_from("abcde")  # few keys, so writes often replace and delete the newest

# One step: a write of a key, a tombstone, a batch of both, a message without a key, a restart.
STEP = st.one_of(
    st.tuples(st.just("put"), KEYS),
    st.tuples(st.just("delete"), KEYS),
    st.tuples(st.just("batch"), st.lists(st.tuples(KEYS, st.booleans()), min_size=1, max_size=4)),
    st.tuples(st.just("unkeyed"), st.none()),
    st.tuples(st.just("restart"), st.none()),
)


def member(key: str | None, tombstone: bool) -> Message:
    properties = ((TOMBSTONE_PROPERTY, "1"),) if tombstone else ()
    return Message(b"v", key=key, properties=properties)


def scanned_last(model: dict[str, MessageId]) -> MessageId | None:
    """The answer by brute force: the newest entry holding a live key, with the index of its
    last live member in what a reader gets, for a batch."""
    if not model:
        return None
    whole = max(position.whole for position in model.values())
    members = [position for position in model.values() if position.whole == whole]
    if members[0].batch_index < 0:
        return whole
    return MessageId(whole.ledger, whole.entry, len(members) - 1)


def read_last(tables: CompactedTopics) -> MessageId | None:
    """The answer as a reader from the earliest position sees it: its last delivery."""
    ids, entries = tables.backlog(TOPIC, None, [], IdRanges())
    if not ids:
        return None
    batch = entries[-1].message.batch
    return ids[-1] if not batch else MessageId(ids[-1].ledger, ids[-1].entry, len(batch) - 1)


@settings(max_examples=300, deadline=None)
@given(st.lists(STEP, max_size=40))
def test_last_matches_a_full_scan_through_writes_deletes_and_restarts(
    steps: list[tuple[str, object]],
) -> None:
    storage = MemoryStorage()
    tables = CompactedTopics(storage, tenant="public")
    model: dict[str, MessageId] = {}  # live key -> its position, kept by the test alone
    for kind, arg in steps:
        if kind == "restart":
            tables = CompactedTopics(storage, tenant="public")
            tables.restore()
        else:
            if kind == "put" or kind == "delete":
                assert isinstance(arg, str)
                message = member(arg, kind == "delete")
                members: list[tuple[str | None, bool]] = [(arg, kind == "delete")]
            elif kind == "batch":
                assert isinstance(arg, list)
                members = list(arg)
                message = Message(b"", batch=tuple(member(k, dead) for k, dead in members))
            else:
                members = [(None, False)]
                message = member(None, False)
            message_id = storage.append(TOPIC, (message,))[0]
            tables.record(TOPIC, message_id, message)
            for index, (key, dead) in enumerate(members):
                if key is None:
                    continue
                if dead:
                    model.pop(key, None)
                else:
                    position = -1 if kind != "batch" else index
                    model[key] = MessageId(message_id.ledger, message_id.entry, position)
        expected = scanned_last(model)
        assert tables.last(TOPIC) == expected
        assert read_last(tables) == expected
        assert sorted(tables.keys(TOPIC)) == sorted(model)


def test_last_of_an_unknown_topic_is_none() -> None:
    assert CompactedTopics(MemoryStorage(), tenant="public").last(TOPIC) is None


def test_last_skips_entries_whose_keys_all_died() -> None:
    storage = MemoryStorage()
    tables = CompactedTopics(storage, tenant="public")
    kept = Message(b"v", key="kept")
    kept_id = storage.append(TOPIC, (kept,))[0]
    tables.record(TOPIC, kept_id, kept)
    # Many overwrites of one key: every entry but the newest dies, then the newest is deleted.
    for _ in range(1000):
        churn = Message(b"v", key="churn")
        tables.record(TOPIC, storage.append(TOPIC, (churn,))[0], churn)
    tombstone = member("churn", True)
    tables.record(TOPIC, storage.append(TOPIC, (tombstone,))[0], tombstone)
    assert tables.last(TOPIC) == kept_id


async def test_changes_of_keys_are_told_with_the_message_before_and_after() -> None:
    broker = new_broker(MemoryStorage())
    changes: list[tuple[str, str, str | None, str | None]] = []

    def told(topic: str, key: str, before: Message | None, after: Message | None) -> None:
        text = [None if m is None else m.payload.decode() for m in (before, after)]
        changes.append((topic, key, text[0], text[1]))

    broker.compacted.on_change = told
    await broker.publish(TABLE, put("a", "1"))
    await broker.publish(TABLE, put("a", "2"))
    await broker.publish(TABLE, delete("a"))
    await broker.publish(TABLE, delete("a"))  # no live key: no change
    await broker.publish(TABLE, Message(b"no key"))
    await broker.publish(TABLE, Message(b"", batch=(put("b", "1"), put("c", "1"))))
    await broker.publish("persistent://public/default/t", put("d", "1"))  # not compacted
    assert changes == [
        (TABLE, "a", None, "1"),
        (TABLE, "a", "1", "2"),
        (TABLE, "a", "2", None),
        (TABLE, "b", None, "1"),
        (TABLE, "c", None, "1"),
    ]
    assert broker.compacted.latest(TABLE, "b") == put("b", "1")
    assert broker.compacted.latest(TABLE, "a") is None
    assert broker.compacted.latest("persistent://public/__mop/other", "b") is None
    assert broker.compacted.items(TABLE) == [("b", put("b", "1")), ("c", put("c", "1"))]
    assert broker.compacted.items("persistent://public/__mop/other") == []
