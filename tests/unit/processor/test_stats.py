"""What the processor counts (`ProcessorStats`): connections and messages by protocol, drops by
reason, and the latency of publishes it times."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from mop.backends.local import LocalBackend, open_local_backend
from mop.broker.storage import MemoryStorage
from mop.counters import Closing, Drop
from mop.message import Message
from mop.processor import (
    ClientContext,
    MessagingProcessor,
    ProcessorStats,
    ProducerSpec,
    SubscriptionSpec,
)
from mop.topic_names import mqtt_to_pulsar as T

MQTT = ClientContext(client_id="m", protocol="mqtt")
PULSAR = ClientContext(client_id="p", protocol="pulsar")


@pytest.fixture
async def backend() -> AsyncIterator[LocalBackend]:
    async with open_local_backend(MemoryStorage()) as running:
        yield running


async def test_connections_are_counted_by_protocol_and_closing_reason(
    backend: LocalBackend,
) -> None:
    processor = MessagingProcessor(backend)
    first = await processor.open_client(MQTT)
    await processor.open_client(PULSAR)
    await processor.close_client(MQTT, first, Closing.TAKEOVER)
    again = await processor.open_client(MQTT)
    await processor.close_client(MQTT, again)
    mqtt, pulsar = processor.stats.protocol("mqtt"), processor.stats.protocol("pulsar")
    assert (mqtt.connections, mqtt.opened, mqtt.closed) == (0, 2, {"takeover": 1, "normal": 1})
    assert (pulsar.connections, pulsar.opened, pulsar.closed) == (1, 1, {})
    assert (processor.stats.connections, processor.stats.connections_total) == (1, 3)


async def test_messages_are_counted_by_protocol(backend: LocalBackend) -> None:
    processor = MessagingProcessor(backend)
    consumer = await processor.subscribe(MQTT, SubscriptionSpec("s", frozenset(["a"])))
    await processor.publish(MQTT, T("a"), Message(b"taken"))
    await processor.publish(MQTT, T("nobody"), Message(b"lost"))
    await processor.publish_batch(
        PULSAR, [(T("a"), Message(b"1")), (T("nobody"), Message(b"2")), (T("b"), Message(b"3"))]
    )
    stats = processor.stats
    # Messages nobody subscribed to are the broker's to count; `$SYS` leaves them out.
    assert (stats.messages_dropped, backend.stats().messages_unrouted) == (0, 3)
    assert stats.protocol("mqtt").messages_received == 2
    assert stats.protocol("pulsar").messages_received == 3
    assert stats.messages_received == 5
    await consumer.close()


async def test_payload_bytes_are_counted_by_protocol_and_summed(backend: LocalBackend) -> None:
    processor = MessagingProcessor(backend)
    await processor.publish(MQTT, T("a"), Message(b"12345"))
    await processor.publish_batch(PULSAR, [(T("a"), Message(b"12")), (T("b"), Message(b"3"))])
    producer = await processor.open_producer(PULSAR, ProducerSpec(topic=T("p"), name="p1"))
    await producer.send(Message(b"4567"))
    processor.stats.protocol("mqtt").record_sent(2, 100, 10)
    stats = processor.stats
    assert stats.protocol("mqtt").payload_bytes_received == 5
    assert stats.protocol("pulsar").payload_bytes_received == 3 + 4
    assert stats.payload_bytes_received == 12
    assert (stats.messages_sent, stats.bytes_sent, stats.payload_bytes_sent) == (2, 100, 10)
    await producer.close()


async def test_the_peak_of_connections_is_the_nodes_and_each_protocols(
    backend: LocalBackend,
) -> None:
    processor = MessagingProcessor(backend)
    mqtt = [
        await processor.open_client(ClientContext(client_id=f"m{n}", protocol="mqtt"))
        for n in range(2)
    ]
    for n, lease in enumerate(mqtt):
        await processor.close_client(ClientContext(client_id=f"m{n}", protocol="mqtt"), lease)
    await processor.open_client(PULSAR)
    stats = processor.stats
    assert stats.protocol("mqtt").connections_peak == 2
    assert stats.protocol("pulsar").connections_peak == 1
    # Never 3 open at once: the node's peak is not the sum of the protocols' peaks.
    assert stats.connections_peak == 2


async def test_internal_publishes_are_not_messages_received(backend: LocalBackend) -> None:
    processor = MessagingProcessor(backend)
    internal = ClientContext(client_id="$SYS", protocol="mqtt", internal=True)
    await processor.publish(internal, T("$SYS/x"), Message(b"1"))
    assert processor.stats.messages_received == 0


async def test_one_publish_call_in_every_n_is_timed(backend: LocalBackend) -> None:
    processor = MessagingProcessor(backend)
    processor.stats.sample_every(2)
    for _ in range(4):
        await processor.publish(MQTT, T("a"), Message(b"x"))
    for _ in range(2):
        await processor.publish_batch(MQTT, [(T("a"), Message(b"x"))] * 5)
    latency = processor.stats.publish_latency
    assert latency.count == 3
    assert 0 < latency.total < 5


async def test_sends_of_a_producer_are_counted_and_timed(backend: LocalBackend) -> None:
    processor = MessagingProcessor(backend)
    processor.stats.sample_every(1)
    producer = await processor.open_producer(PULSAR, ProducerSpec(topic=T("p"), name="p1"))
    outcomes = [producer.send(Message(b"x"), sequence_id=n) for n in range(3)]
    for outcome in outcomes:
        await outcome
    assert processor.stats.protocol("pulsar").messages_received == 3
    assert processor.stats.publish_latency.count == 3
    await producer.close()


async def test_drops_are_counted_by_reason(backend: LocalBackend) -> None:
    processor = MessagingProcessor(backend)
    processor.record_dropped(Drop.DENIED)
    processor.record_dropped(Drop.TOO_LARGE, 2)
    spec = SubscriptionSpec("slow", frozenset(["q"]), max_backlog=1)
    consumer = await processor.subscribe(MQTT, spec)
    await consumer.close()
    for n in range(3):
        await backend.publish(T("q"), Message(str(n).encode()))
    stats = processor.stats
    assert stats.dropped == {"denied": 1, "too_large": 2, "queue_full": 2}
    assert stats.messages_dropped == 5


def test_the_sampling_applies_to_protocols_made_later() -> None:
    stats = ProcessorStats(started_at=0.0)
    stats.sample_every(8)
    assert stats.protocol("mqtt").delivery_latency.every == 8
    assert stats.publish_latency.every == 8
    assert stats.protocol("mqtt") is stats.protocol("mqtt")
