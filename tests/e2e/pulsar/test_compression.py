"""Compressed messages from pulsar-client (LZ4, ZSTD, SNAPPY; batched or not; its Python API
has no ZLIB, which the unit tests cover) reach every kind of consumer readable: mop's own
client, pulsar-client, and MQTT subscribers of the topic (mop's broker stores them
decompressed); and mop's client reads them compressed as another broker keeps them."""

from __future__ import annotations

from collections.abc import Iterator

import pulsar
import pytest
import trio

from mop.protocols.pulsar.driver import ConsumerConfig, subscribe
from mop.testing.node import RunningNode
from tests.e2e.clients import Client
from tests.e2e.pulsar.driver_support import Inbox, open_driver
from tests.e2e.pulsar_support import LiteBroker, receive_all, service_url

pytestmark = pytest.mark.e2e

CODECS = {
    "lz4": pulsar.CompressionType.LZ4,
    "zstd": pulsar.CompressionType.ZSTD,
    "snappy": pulsar.CompressionType.SNAPPY,
}
# Payloads that compress well, so that the codec is really used.
PAYLOADS = [f"message {i}: ".encode() + b"compressible " * 40 for i in range(6)]


@pytest.mark.parametrize("codec", list(CODECS))
@pytest.mark.parametrize("batching", [True, False], ids=["batched", "single"])
async def test_compressed_messages_reach_every_kind_of_consumer(
    node: RunningNode, client: pulsar.Client, codec: str, batching: bool
) -> None:
    mqtt_topic = f"compressed/{codec}/{'batched' if batching else 'single'}"
    topic = "persistent://public/default/" + mqtt_topic.replace("/", "%2F")
    reference = client.subscribe(topic, "reference")
    mqtt = Client(node.mqtt_port, f"mqtt-{codec}-{batching}")
    mqtt.subscribe(mqtt_topic, qos=1)
    with trio.fail_after(20):
        async with open_driver(service_url(node)) as native:
            inbox = Inbox(ack=True)
            await subscribe(native, topic, "native", inbox, ConsumerConfig())
            producer = client.create_producer(
                topic,
                compression_type=CODECS[codec],
                batching_enabled=batching,
                batching_max_publish_delay_ms=50,
            )
            for payload in PAYLOADS:
                producer.send_async(payload, None)
            producer.flush()
            producer.close()
            await inbox.wait_for(len(PAYLOADS))
            assert inbox.payloads == PAYLOADS
    assert [m.data() for m in receive_all(reference, len(PAYLOADS))] == PAYLOADS
    assert [r.payload for r in mqtt.expect(len(PAYLOADS))] == PAYLOADS
    mqtt.close()
    reference.close()


@pytest.fixture(scope="module")
def lite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiteBroker]:
    """A Pulsar-protocol broker that is not mop: it delivers payloads compressed, as sent."""
    broker = LiteBroker(tmp_path_factory.mktemp("pulsar-lite"))
    broker.start()
    try:
        yield broker
    finally:
        broker.close()


@pytest.mark.parametrize("codec", list(CODECS))
async def test_mops_client_decompresses_what_another_broker_delivers(
    lite: LiteBroker, codec: str
) -> None:
    topic = f"persistent://public/default/compressed-{codec}"
    reference = pulsar.Client(
        lite.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )
    try:
        with trio.fail_after(20):
            async with open_driver(lite.service_url) as native:
                inbox = Inbox(ack=True)
                await subscribe(native, topic, "native", inbox, ConsumerConfig())
                expected = []
                for batching in (True, False):
                    producer = reference.create_producer(
                        topic,
                        compression_type=CODECS[codec],
                        batching_enabled=batching,
                        batching_max_publish_delay_ms=50,
                    )
                    for payload in PAYLOADS:
                        expected.append(b"batched " * batching + payload)
                        producer.send_async(expected[-1], None)
                    producer.flush()
                    producer.close()
                await inbox.wait_for_distinct(len(expected))
                # At least once (this broker may deliver a message again), in order.
                assert list(dict.fromkeys(inbox.payloads)) == expected
    finally:
        reference.close()


async def test_a_message_larger_than_the_brokers_limit_decompressed_is_stored_as_sent(
    node: RunningNode, client: pulsar.Client
) -> None:
    """6 MiB that compress to a few KB (producers check the compressed size against the 5 MiB
    limit): stored and delivered compressed, so that pulsar-client gets it, and mop's client
    (which decompresses only up to the limit) leaves it and goes on. Decompressed, it would
    make a frame larger than clients read: mop's and Java's would drop the connection at
    every delivery of it."""
    topic = "persistent://public/default/compressed-above-the-limit"
    reference = client.subscribe(topic, "reference")
    large = b"large " * (1024 * 1024)
    with trio.fail_after(20):
        async with open_driver(service_url(node)) as native:
            inbox = Inbox(ack=True)
            await subscribe(native, topic, "native", inbox, ConsumerConfig())
            producer = client.create_producer(
                topic, compression_type=pulsar.CompressionType.LZ4, batching_enabled=False
            )
            producer.send(large)
            producer.send(b"after it")
            producer.close()
            await inbox.wait_for(1)
            assert inbox.payloads == [b"after it"]
    assert [m.data() for m in receive_all(reference, 2)] == [large, b"after it"]
    reference.close()
