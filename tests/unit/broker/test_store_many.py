"""`Broker.store_many`: consecutive messages of one topic stored and routed together, with the
results of storing them one at a time, and nothing stored when storage refuses them."""

from __future__ import annotations

import pytest

from mop.broker.storage import MemoryStorage, StorageFull
from mop.message import Message

from .support import msg, new_broker, payloads, subscribe, take_all, topic


async def test_messages_are_routed_in_order_with_consecutive_ids() -> None:
    broker = new_broker()
    exact = await subscribe(broker, "exact", ["a/1"])
    wildcard = await subscribe(broker, "wild", ["a/+"], auto_ack_qos0=True)
    await broker.publish(topic("a/1"), msg("first"))
    ids, count = broker.store_many(topic("a/1"), [msg(str(n), qos=n % 2) for n in range(5)])
    assert count == 2
    assert [i.entry for i in ids] == list(range(ids[0].entry, ids[0].entry + 5))
    assert broker.topic(topic("a/1")).last_id == ids[-1]  # type: ignore[union-attr]
    for att in (exact, wildcard):
        assert payloads(take_all(broker, att)) == ["first", "0", "1", "2", "3", "4"]
    stored = await broker.storage.read(topic("a/1"), None, 10)
    assert [m.payload for _, m in stored] == [b"first", b"0", b"1", b"2", b"3", b"4"]


async def test_a_new_topic_is_created_and_joins_matching_subscriptions() -> None:
    broker = new_broker()
    att = await subscribe(broker, "wild", ["b/#"])
    ids, count = broker.store_many(topic("b/new"), [msg("x"), msg("y")])
    assert count == 1 and len(ids) == 2
    assert payloads(take_all(broker, att)) == ["x", "y"]


async def test_without_subscriptions_the_messages_are_kept_for_trimming() -> None:
    broker = new_broker()
    ids, count = broker.store_many(topic("c"), [msg("x"), msg("y")])
    assert count == 0
    assert broker.trim_acknowledged() == 1
    assert await broker.storage.read(topic("c"), None, 10) == []
    assert len(ids) == 2


async def test_storage_refusing_the_batch_stores_none_of_it() -> None:
    storage = MemoryStorage(max_bytes=10)
    broker = new_broker(storage)
    att = await subscribe(broker, "s", ["d"])
    with pytest.raises(StorageFull):
        broker.store_many(topic("d"), [msg("12345"), msg("67890"), msg("x")])
    assert take_all(broker, att) == []
    assert await storage.read(topic("d"), None, 10) == []
    # Room for one: the next call stores it.
    ids, _ = broker.store_many(topic("d"), [msg("ok")])
    assert payloads(take_all(broker, att)) == ["ok"]
    assert len(ids) == 1


async def test_non_persistent_topics_get_ids_without_storage() -> None:
    broker = new_broker()
    name = "non-persistent://public/default/np"
    att = await subscribe(broker, "s", [name])
    ids, count = broker.store_many(name, [Message(b"1"), Message(b"2"), Message(b"3")])
    assert count == 1
    assert [i.entry for i in ids] == [0, 1, 2]
    assert payloads(take_all(broker, att)) == ["1", "2", "3"]
    assert broker.storage.topics() == []
