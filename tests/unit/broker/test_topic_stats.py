"""What the broker counts for a topic's stats (messages and bytes in and out, a subscription's
unacknowledged messages, rates) and how a topic is deleted."""

from __future__ import annotations

import pytest

from mop.broker.storage import MemoryStorage
from mop.message import Message
from mop.messaging import ProducerAccess, SubscriptionKind, TopicBusy
from mop.rates import RateMeter
from tests.unit.broker.support import Clock, msg, new_broker, subscribe, take_all, topic


async def test_counts_what_is_published_and_taken() -> None:
    broker = new_broker()
    att = await subscribe(broker, "s", ["a/b"])
    await broker.publish(topic("a/b"), msg("hello"))
    batch = Message(b"", batch=(Message(b"12"), Message(b"345")))
    await broker.publish(topic("a/b"), batch)
    node = broker.topic(topic("a/b"))
    assert node is not None
    assert (node.messages_in, node.bytes_in) == (3, 10)
    take_all(broker, att)
    cursor = node.cursors[0]
    assert (cursor.messages_out, cursor.bytes_out) == (3, 10)


async def test_owed_counts_unacknowledged_messages_wherever_they_are() -> None:
    broker = new_broker()
    att = await subscribe(broker, "s", ["a"], kind=SubscriptionKind.SHARED)
    for n in range(10):
        await broker.publish(topic("a"), msg(str(n)))
    cursor = broker.subscription("s").cursors[topic("a")]  # type: ignore[union-attr]
    assert cursor.owed() == 10
    deliveries = broker.take(att, 4)
    assert cursor.owed() == 10  # with the consumer, not acknowledged
    broker.ack(att, [deliveries[1], deliveries[3]])  # out of order
    assert cursor.owed() == 8
    broker.ack(att, [deliveries[0], deliveries[2]])
    assert cursor.owed() == 6


async def test_owed_after_a_long_out_of_order_run_is_compacted() -> None:
    broker = new_broker()
    att = await subscribe(broker, "s", ["a"], kind=SubscriptionKind.SHARED, capacity=5000)
    for n in range(3000):
        broker.store(topic("a"), msg(str(n), qos=0))
    deliveries = broker.take(att, 3000)
    broker.ack(att, deliveries[1:])  # the first stays in flight
    cursor = broker.subscription("s").cursors[topic("a")]  # type: ignore[union-attr]
    assert cursor.owed() == 1
    cursor.compact()
    assert len(cursor.ids) < 10
    assert cursor.owed() == 1


def test_rates_cover_a_window_and_start_from_the_load() -> None:
    meter = RateMeter(100.0, 2, window=5.0)
    assert meter.read(102.0, (10, 100)) == (5.0, 50.0)  # since the load
    assert meter.read(103.0, (20, 200)) == (5.0, 50.0)  # within the window: the last rates
    assert meter.read(107.0, (60, 300)) == (10.0, 40.0)


async def test_delete_refuses_a_topic_with_consumers_or_producers_unless_forced() -> None:
    broker = new_broker()
    att = await subscribe(broker, "s", ["a"])
    await broker.publish(topic("a"), msg("1"))
    with pytest.raises(TopicBusy):
        await broker.delete_topic(topic("a"))
    broker.close(att)
    handle = broker.producers.add(topic("a"), "p", ProducerAccess.SHARED)
    assert broker.topic_users(topic("a")) == (0, 1)
    with pytest.raises(TopicBusy):
        await broker.delete_topic(topic("a"))
    broker.producers.remove(handle)
    assert await broker.delete_topic(topic("a"))
    assert broker.topic(topic("a")) is None
    assert not await broker.delete_topic(topic("a"))


async def test_a_deleted_topic_loses_its_messages_and_its_subscriptions_come_back_to_it() -> None:
    storage = MemoryStorage()
    broker = new_broker(storage, Clock())
    att = await subscribe(broker, "s", ["a"])
    await broker.publish(topic("a"), msg("old"))
    assert await broker.delete_topic(topic("a"), force=True)
    assert take_all(broker, att) == []  # its backlog left the consumer
    assert storage.topic_size(topic("a")) == 0
    assert topic("a") not in broker.topics("public/default")
    await broker.publish(topic("a"), msg("new"))  # the topic again: the subscription is there
    assert [d.message.payload for d in take_all(broker, att)] == [b"new"]
    node = broker.topic(topic("a"))
    assert node is not None and node.messages_in == 1


async def test_a_table_topic_is_not_deleted() -> None:
    broker = new_broker()
    name = "persistent://public/__mop/default/table/t"
    broker.store(name, Message(b"v", key="k"))
    with pytest.raises(TopicBusy):
        await broker.delete_topic(name, force=True)
