"""End-to-end encrypted Pulsar messages pass through mop untouched: a consumer with the private
key decrypts them, one without it (`crypto_failure_action=CONSUME`) sees the producer's
encryption metadata, and MQTT subscribers skip them. Merged and separated (Pulsar clients on
the broker node, MQTT through a proxy)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from pulsar.asyncio import Client as AsyncClient

from mop.protocols.pulsar.commands import (
    ConsumerStats,
    ConsumerStatsResponse,
    Flow,
    Message,
    Subscribe,
    SubType,
    Success,
)
from tests.e2e.clients import Client
from tests.e2e.pulsar_support import (
    TIMEOUT_MS,
    Deployment,
    RawPulsar,
    pulsar_client,
    pulsar_node,
    pulsar_port,
    pulsar_settings,
    receive_all,
    service_url,
    topic_for,
)

pytestmark = pytest.mark.e2e

Compression = pulsar.CompressionType
CONSUME = pulsar.ConsumerCryptoFailureAction.CONSUME


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[pulsar.CryptoKeyReader]:
    """A CryptoKeyReader over a fresh RSA key pair (the producer's key "k1" names it)."""
    folder = tmp_path_factory.mktemp("keys")
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private_path, public_path = folder / "private.pem", folder / "public.pem"
    private_path.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    public_path.write_bytes(
        private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    yield pulsar.CryptoKeyReader(str(public_path), str(private_path))


def topic_of(request: pytest.FixtureRequest) -> str:
    return topic_for(request.node.name)


# (compression, messages in a batch: 0 for no batching)
CASES = [(Compression.NONE, 0), (Compression.LZ4, 0), (Compression.NONE, 5), (Compression.ZLib, 5)]


@pytest.mark.parametrize(("compression", "batch"), CASES)
def test_consumers_with_and_without_the_key(
    deployment: Deployment,
    request: pytest.FixtureRequest,
    keys: pulsar.CryptoKeyReader,
    compression: pulsar.CompressionType,
    batch: int,
) -> None:
    topic = topic_of(request)
    payloads = [f"secret {i}".encode() for i in range(batch or 1)]
    with pulsar_client(deployment.pulsar) as client:
        blind = client.subscribe(topic, "blind", crypto_failure_action=CONSUME)
        holder = client.subscribe(topic, "holder", crypto_key_reader=keys)
        producer = client.create_producer(
            topic,
            encryption_key="k1",
            crypto_key_reader=keys,
            compression_type=compression,
            batching_enabled=batch > 0,
            batching_max_messages=max(2, batch),
            batching_max_publish_delay_ms=1000,
        )
        for payload in payloads:
            producer.send_async(payload, None, properties={"kept": "in clear"})
        producer.flush()
        decrypted = receive_all(holder, len(payloads))
        assert [m.data() for m in decrypted] == payloads
        assert all(m.properties() == {"kept": "in clear"} for m in decrypted)
        opaque = blind.receive(timeout_millis=TIMEOUT_MS)
    context = opaque.encryption_context()
    assert context is not None and context.is_decryption_failed()
    encryption_keys = context.keys()
    assert [key.key for key in encryption_keys] == ["k1"]
    assert context.param()  # the producer's initialisation vector
    assert context.compression_type() == compression
    assert context.batch_size() == (batch or -1)
    if compression == Compression.LZ4 and not batch:
        # The size before compression, as the producer announced it.
        assert context.uncompressed_message_size() == len(payloads[0])
    assert opaque.data() not in payloads
    # A single message's properties are not encrypted; a batch's are inside its payload.
    assert opaque.properties() == ({} if batch else {"kept": "in clear"})


def test_the_asyncio_client_decrypts_what_it_encrypted(
    deployment: Deployment, request: pytest.FixtureRequest, keys: pulsar.CryptoKeyReader
) -> None:
    topic = topic_of(request)

    async def scenario() -> list[bytes]:
        client = AsyncClient(service_url(deployment.pulsar))
        try:
            consumer = await client.subscribe(topic, "s", crypto_key_reader=keys)
            producer = await client.create_producer(
                topic,
                encryption_key="k1",
                crypto_key_reader=keys,
                compression_type=Compression.LZ4,
            )
            for i in range(3):
                await producer.send(f"async {i}".encode())
            got = []
            for _ in range(3):
                message = await asyncio.wait_for(consumer.receive(), TIMEOUT_MS / 1000)
                await consumer.acknowledge(message)
                got.append(message.data())
            return got
        finally:
            await client.close()

    assert asyncio.run(scenario()) == [b"async 0", b"async 1", b"async 2"]


def test_mqtt_subscribers_skip_encrypted_messages(
    deployment: Deployment, request: pytest.FixtureRequest, keys: pulsar.CryptoKeyReader
) -> None:
    mqtt_topic = "encrypted/" + request.node.callspec.id
    topic = "persistent://public/default/" + mqtt_topic.replace("/", "%2F")
    subscriber = Client(deployment.mqtt.mqtt_port, "enc-" + request.node.callspec.id)
    subscriber.subscribe(mqtt_topic, qos=1)
    with pulsar_client(deployment.pulsar) as client:
        if deployment.separated:
            # The proxy's subscription is made on the broker when its MQTT client subscribes.
            client.create_producer(topic).close()
        secret = client.create_producer(
            topic, encryption_key="k1", crypto_key_reader=keys, batching_enabled=False
        )
        batched = client.create_producer(
            topic,
            encryption_key="k1",
            crypto_key_reader=keys,
            batching_enabled=True,
            batching_max_publish_delay_ms=1000,
        )
        plain = client.create_producer(topic, batching_enabled=False)
        secret.send(b"single")
        for i in range(3):
            batched.send_async(f"batched {i}".encode(), None)
        batched.flush()
        plain.send(b"in clear")
        received = subscriber.expect(1)
        subscriber.expect_none(0.5)
    assert [(m.topic, m.payload) for m in received] == [(mqtt_topic, b"in clear")]


def test_encrypted_messages_are_stored_as_sent(
    tmp_path: Path, keys: pulsar.CryptoKeyReader
) -> None:
    """What a restart reads back from storage still decrypts, batches included."""
    settings = pulsar_settings(data_dir=str(tmp_path / "data"))
    topic = "persistent://public/default/encrypted-kept"
    with pulsar_node(settings) as node, pulsar_client(node) as client:
        client.subscribe(topic, "later").close()
        producer = client.create_producer(
            topic,
            encryption_key="k1",
            crypto_key_reader=keys,
            compression_type=Compression.ZLib,
            batching_max_publish_delay_ms=1000,
        )
        for i in range(4):
            producer.send_async(f"kept {i}".encode(), None)
        producer.flush()
    with pulsar_node(settings) as node, pulsar_client(node) as client:
        consumer = client.subscribe(topic, "later", crypto_key_reader=keys)
        assert [m.data() for m in receive_all(consumer, 4)] == [
            f"kept {i}".encode() for i in range(4)
        ]


def test_an_encrypted_batch_is_charged_a_permit_per_message(
    deployment: Deployment, request: pytest.FixtureRequest, keys: pulsar.CryptoKeyReader
) -> None:
    """Pulsar consumers give back a permit per message of a batch, encrypted or not: a batch
    charged as one would let the broker send past the receiver queue without bound."""
    topic = topic_of(request)
    raw = RawPulsar(pulsar_port(deployment.pulsar))
    try:
        assert raw.connect() is not None
        raw.send(
            Subscribe(
                topic=topic, subscription="s", sub_type=SubType.Shared, consumer_id=1, request_id=1
            )
        )
        assert raw.recv() == Success(request_id=1)
        raw.send(Flow(consumer_id=1, message_permits=2))
        with pulsar_client(deployment.pulsar) as client:
            producer = client.create_producer(
                topic,
                encryption_key="k1",
                crypto_key_reader=keys,
                batching_enabled=True,
                batching_max_messages=3,
                batching_max_publish_delay_ms=1000,
            )
            for i in range(6):
                producer.send_async(f"sealed {i}".encode(), None)
            producer.flush()
        first = raw.recv()
        assert isinstance(first, Message)
        raw.send(ConsumerStats(request_id=2, consumer_id=1))
        stats = raw.recv()  # the second batch would come first if the first cost one permit
        assert isinstance(stats, ConsumerStatsResponse), stats
        assert stats.available_permits == 0
        assert stats.unacked_messages == 3
    finally:
        raw.close()


def test_a_partly_acknowledged_encrypted_batch_comes_back(
    deployment: Deployment, request: pytest.FixtureRequest, keys: pulsar.CryptoKeyReader
) -> None:
    """Batch-index acknowledgements of some messages of an encrypted batch leave the others
    owed: they come again to the next consumer (the acknowledged ones may come too)."""
    topic = topic_of(request)
    payloads = [f"part {i}".encode() for i in range(4)]
    with pulsar_client(deployment.pulsar) as client:
        consumer = client.subscribe(
            topic, "s", crypto_key_reader=keys, batch_index_ack_enabled=True
        )
        producer = client.create_producer(
            topic,
            encryption_key="k1",
            crypto_key_reader=keys,
            batching_enabled=True,
            batching_max_messages=4,
            batching_max_publish_delay_ms=1000,
        )
        for payload in payloads:
            producer.send_async(payload, None)
        producer.flush()
        received = receive_all(consumer, 4)
        assert [m.data() for m in received] == payloads
        for message in received[:2]:
            consumer.acknowledge(message)
        consumer.close()
        again = client.subscribe(topic, "s", crypto_key_reader=keys, batch_index_ack_enabled=True)
        came_back = set()
        while not {b"part 2", b"part 3"} <= came_back:
            came_back.add(again.receive(timeout_millis=TIMEOUT_MS).data())
