"""Topic discovery of a separated proxy against a real broker process, seen from the broker's
side through a relay that counts the commands reaching it: one namespace listing per period
however many wildcard consumers the proxy has, none once no consumer needs it, none for `$SYS`
(each proxy serves its own)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio

from mop.backends.cluster import ClusterBackend
from mop.message import Message
from mop.protocols.pulsar.commands import CommandType
from mop.testing.cluster import open_cluster_backend
from mop.testing.pulsar_relay import CountingRelay, open_counting_relay
from mop.topic_names import mqtt_to_pulsar
from tests.e2e.cluster.support import OpenBackend, expect_nothing, receive, spec
from tests.e2e.nodeproc import NodeProcess

PERIOD = 1  # the backends' pattern_discovery
CONSUMERS = 50
LISTINGS = CommandType.GET_TOPICS_OF_NAMESPACE


@pytest.fixture
async def relay(broker: NodeProcess) -> AsyncIterator[CountingRelay]:
    async with open_counting_relay("127.0.0.1", broker.port) as running:
        yield running


@pytest.fixture
def open_backend(relay: CountingRelay) -> OpenBackend:
    """The backends connect through the relay."""
    return lambda: open_cluster_backend(relay.service_url)


async def listings_during(relay: CountingRelay, seconds: float) -> int:
    before = relay.counts[LISTINGS]
    await trio.sleep(seconds)
    return relay.counts[LISTINGS] - before


async def test_wildcard_consumers_share_one_listing_per_period(
    backend: ClusterBackend, relay: CountingRelay, prefix: str
) -> None:
    await backend.publish(mqtt_to_pulsar(f"{prefix}/old/x"), Message(b"seed"))
    consumers = [
        await backend.subscribe(spec(f"{prefix}-{i}", f"{prefix}/+/x")) for i in range(CONSUMERS)
    ]
    # Each consumer alone would list the namespace every period: 50 per second.
    seconds = 4 * PERIOD
    assert await listings_during(relay, seconds) <= seconds / PERIOD + 1
    for consumer in consumers:
        await consumer.unsubscribe()


async def test_a_new_topic_reaches_every_consumer_it_matches(
    backend: ClusterBackend, prefix: str
) -> None:
    matching = [await backend.subscribe(spec(f"{prefix}-{i}", f"{prefix}/+/x")) for i in range(10)]
    other = await backend.subscribe(spec(f"{prefix}-other", f"{prefix}/+/y"))
    # Created after the subscriptions: found by the next listing, and nothing is lost.
    await backend.publish(mqtt_to_pulsar(f"{prefix}/new/x"), Message(b"first"))
    for consumer in matching:
        assert [d.message.payload for d in await receive(consumer, 1)] == [b"first"]
    await expect_nothing(other)
    for consumer in [*matching, other]:
        await consumer.unsubscribe()


async def test_a_later_consumer_follows_topics_created_before_it(
    backend: ClusterBackend, prefix: str
) -> None:
    first = await backend.subscribe(spec(f"{prefix}-first", f"{prefix}/#"))
    topic = mqtt_to_pulsar(f"{prefix}/a")
    await backend.publish(topic, Message(b"before"))
    await receive(first, 1)
    # The poller knows the topic now; a consumer that starts later follows it at once.
    later = await backend.subscribe(spec(f"{prefix}-later", f"{prefix}/+"))
    await backend.publish(topic, Message(b"after"))
    assert [d.message.payload for d in await receive(later, 1)] == [b"after"]
    for consumer in (first, later):
        await consumer.unsubscribe()


async def test_no_listing_once_no_consumer_needs_the_namespace(
    backend: ClusterBackend, relay: CountingRelay, prefix: str
) -> None:
    consumer = await backend.subscribe(spec(f"{prefix}-s", f"{prefix}/#"))
    assert backend.discovery.polling() == ["public/default"]
    await consumer.close()
    assert backend.discovery.polling() == []
    assert await listings_during(relay, 2.5 * PERIOD) == 0


async def test_sys_is_each_proxys_own_and_never_listed(
    backend: ClusterBackend, relay: CountingRelay, prefix: str
) -> None:
    async with open_cluster_backend(relay.service_url) as other:
        here = await backend.subscribe(spec(f"{prefix}-here", "$SYS/#"))
        there = await other.subscribe(spec(f"{prefix}-there", "$SYS/broker/+"))
        assert backend.discovery.polling() == [] and other.discovery.polling() == []
        topic = mqtt_to_pulsar("$SYS/broker/uptime")
        await backend.publish(topic, Message(b"1 seconds"))
        await other.publish(topic, Message(b"7 seconds"))
        assert [d.message.payload for d in await receive(here, 1)] == [b"1 seconds"]
        assert [d.message.payload for d in await receive(there, 1)] == [b"7 seconds"]
        await expect_nothing(here)
        await expect_nothing(there)
        assert await listings_during(relay, 1.5 * PERIOD) == 0
        assert topic not in await backend.topics("public/default")
        await here.unsubscribe()
        await there.unsubscribe()
