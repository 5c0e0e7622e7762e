"""The grace of unsubscribed data: kept for a while, then trimmed as before."""

from __future__ import annotations

from mop.broker import Broker
from mop.broker.storage import MemoryStorage
from mop.messaging import StartPosition

from .support import Clock, msg, payloads, subscribe, take_all, topic


def grace_broker(storage: MemoryStorage, seconds: float = 5.0) -> Broker:
    return Broker(storage, clock=Clock(), unsubscribed_grace=seconds)


async def test_unsubscribed_data_stays_for_the_grace_then_goes() -> None:
    storage = MemoryStorage()
    broker = grace_broker(storage)
    await broker.publish(topic("nobody"), msg("1"))
    broker.trim_acknowledged(now=100.0)
    await broker.publish(topic("nobody"), msg("2"))
    broker.trim_acknowledged(now=102.0)
    assert storage.stats().messages == 2
    broker.trim_acknowledged(now=104.9)
    assert storage.stats().messages == 2
    broker.trim_acknowledged(now=105.0)  # "1" was seen 5 s ago; "2" only 3 s ago
    assert storage.stats().messages == 1
    broker.trim_acknowledged(now=107.0)
    assert storage.stats().messages == 0
    # Nothing is left to look at again.
    broker.trim_acknowledged(now=200.0)
    assert storage.stats().messages == 0


async def test_a_late_earliest_subscriber_still_finds_the_data() -> None:
    storage = MemoryStorage()
    broker = grace_broker(storage)
    await broker.publish(topic("new"), msg("early"))
    broker.trim_acknowledged(now=0.0)
    broker.trim_acknowledged(now=1.0)
    att = await subscribe(broker, "finder", ["new"], start=StartPosition.EARLIEST)
    assert payloads(take_all(broker, att)) == ["early"]


async def test_a_new_subscribed_topic_keeps_acknowledged_data_for_the_grace() -> None:
    # Another proxy's wildcard subscription finds a new topic up to a poll later and reads it
    # from the earliest message: what the first subscriber acknowledged must still be there.
    storage = MemoryStorage()
    broker = grace_broker(storage)
    att = await subscribe(broker, "c1", ["a"])
    await broker.publish(topic("a"), msg("1"))
    broker.ack(att, take_all(broker, att))
    broker.trim_acknowledged(now=10.0)
    broker.trim_acknowledged(now=12.0)
    assert storage.stats().messages == 1
    late = await subscribe(broker, "finder", ["a"], start=StartPosition.EARLIEST)
    assert payloads(take_all(broker, late)) == ["1"]


async def test_an_old_subscribed_topic_trims_on_acknowledgement_at_once() -> None:
    storage = MemoryStorage()
    broker = grace_broker(storage)
    att = await subscribe(broker, "c1", ["a"])
    await broker.publish(topic("a"), msg("1"))
    broker.ack(att, take_all(broker, att))
    broker.trim_acknowledged(now=10.0)  # trimming first sees the topic
    broker.trim_acknowledged(now=15.0)  # 5 s later it is no longer new
    assert storage.stats().messages == 0
    await broker.publish(topic("a"), msg("2"))
    broker.ack(att, take_all(broker, att))
    broker.trim_acknowledged(now=15.5)
    assert storage.stats().messages == 0


async def test_without_a_grace_unsubscribed_data_goes_at_once() -> None:
    storage = MemoryStorage()
    broker = grace_broker(storage, seconds=0.0)
    await broker.publish(topic("nobody"), msg("1"))
    broker.trim_acknowledged()
    assert storage.stats().messages == 0
