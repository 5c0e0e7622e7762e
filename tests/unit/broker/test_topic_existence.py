"""When a topic exists (`Broker.open_topic` / `close_topic`): from its first producer on, as in
Pulsar, durably for a persistent topic until it is deleted; a topic only an idle subscription
made leaves nothing behind."""

from __future__ import annotations

from mop.broker import TOPICS_TABLE
from mop.broker.storage import MemoryStorage
from mop.messaging import ProducerAccess

from .support import msg, new_broker, payloads, subscribe, take_all, topic

NS = "public/default"


async def test_a_producers_topic_is_listed_before_its_first_message() -> None:
    broker = new_broker()
    wildcard = await subscribe(broker, "w", ["prefix/#"])
    assert broker.open_topic(topic("prefix/a"))
    assert not broker.open_topic(topic("prefix/a"))  # recorded once
    assert broker.topics(NS) == [topic("prefix/a")]
    # A wildcard subscription made before the topic has it from its first message.
    broker.store(topic("prefix/a"), msg("first"))
    assert payloads(take_all(broker, wildcard)) == ["first"]


async def test_a_producers_topic_survives_a_restart_until_deleted() -> None:
    storage = MemoryStorage()
    broker = new_broker(storage)
    handle = broker.producers.add(topic("idle"), "p", ProducerAccess.SHARED)
    broker.open_topic(topic("idle"))
    broker.producers.remove(handle)
    broker.close_topic(topic("idle"))
    assert broker.topics(NS) == [topic("idle")]  # no producer, no message: still there
    again = new_broker(storage)
    await again.recover()
    assert again.topics(NS) == [topic("idle")]
    assert await again.delete_topic(topic("idle"))
    assert list(storage.table_items(TOPICS_TABLE)) == []
    third = new_broker(storage)
    await third.recover()
    assert third.topics(NS) == []


async def test_a_topic_with_messages_is_not_recorded_again() -> None:
    storage = MemoryStorage()
    broker = new_broker(storage)
    broker.store(topic("busy"), msg("m"))
    assert not broker.open_topic(topic("busy"))
    assert list(storage.table_items(TOPICS_TABLE)) == []


async def test_a_non_persistent_topic_lives_while_its_producer_does() -> None:
    broker = new_broker()
    name = "non-persistent://public/default/np"
    handle = broker.producers.add(name, "p", ProducerAccess.SHARED)
    assert not broker.open_topic(name)  # nothing to store
    assert broker.topics(NS) == [name]
    broker.producers.remove(handle)
    broker.close_topic(name)
    assert broker.topics(NS) == []


async def test_an_idle_subscriptions_topic_goes_with_it() -> None:
    storage = MemoryStorage()
    broker = new_broker(storage)
    att = await subscribe(broker, "mqtt-client", ["devices/1/cmd"], durable=False)
    assert broker.topics(NS) == [topic("devices/1/cmd")]
    broker.close(att)
    assert broker.topics(NS) == []
    assert list(storage.table_items(TOPICS_TABLE)) == []


async def test_a_producer_keeps_its_topic_when_a_subscription_leaves() -> None:
    broker = new_broker()
    name = "non-persistent://public/default/shared"
    broker.producers.add(name, "p", ProducerAccess.SHARED)
    broker.open_topic(name)
    att = await subscribe(broker, "s", [name], durable=False)
    broker.close(att)
    assert broker.topics(NS) == [name]


async def test_a_durable_subscriptions_topic_is_listed_after_a_restart() -> None:
    # A Pulsar consumer's subscription is durable: its topic comes back with it, and goes
    # with it (no record of its own), as long as it never held a message.
    storage = MemoryStorage()
    broker = new_broker(storage)
    await subscribe(broker, "s", [topic("consumed")])
    again = new_broker(storage)
    await again.recover()
    assert again.topics(NS) == [topic("consumed")]
    await again.delete_subscription("s")
    assert again.topics(NS) == []
    assert list(storage.table_items(TOPICS_TABLE)) == []


async def test_a_non_persistent_topic_goes_after_its_messages_with_its_last_user() -> None:
    broker = new_broker()
    name = "non-persistent://public/default/sent"
    handle = broker.producers.add(name, "p", ProducerAccess.SHARED)
    broker.open_topic(name)
    att = await subscribe(broker, "s", [name], durable=False)
    broker.store(name, msg("m"))
    broker.producers.remove(handle)
    broker.close_topic(name)
    assert broker.topics(NS) == [name]  # its consumer is still attached
    broker.close(att)
    assert broker.topics(NS) == []


async def test_an_unattached_wildcard_does_not_keep_a_non_persistent_topic() -> None:
    broker = new_broker()
    name = "non-persistent://public/default/np"
    wildcard = await subscribe(broker, "offline", ["#"])  # a durable MQTT session
    broker.close(wildcard)
    handle = broker.producers.add(name, "p", ProducerAccess.SHARED)
    broker.open_topic(name)
    broker.store(name, msg("m"))
    broker.producers.remove(handle)
    broker.close_topic(name)
    assert broker.topics(NS) == []
    # The topic comes back with its next producer, and joins the wildcard again.
    attached = await subscribe(broker, "offline", ["#"])
    broker.producers.add(name, "p", ProducerAccess.SHARED)
    broker.open_topic(name)
    broker.store(name, msg("again"))
    assert payloads(take_all(broker, attached)) == ["again"]
