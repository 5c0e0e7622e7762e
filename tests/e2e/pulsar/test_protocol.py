"""The Pulsar adapter on the wire: the handshake, lookups, errors as answers, and hostile input
(garbage, a wrong checksum, an oversize frame, a command before CONNECT), which affects only the
connection that sent it."""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterator

import pulsar
import pytest

from mop.protocols.pulsar.commands import (
    Connected,
    Error,
    GetTopicsOfNamespace,
    GetTopicsOfNamespaceResponse,
    Lookup,
    LookupResponse,
    LookupType,
    PartitionedMetadata,
    PartitionedMetadataResponse,
    Ping,
    Pong,
    Producer,
    ProducerSuccess,
    Send,
    SendError,
    SendReceipt,
    TopicsMode,
)
from mop.protocols.pulsar.errors import ServerError
from mop.protocols.pulsar.frames import DEFAULT_MAX_MESSAGE_SIZE, make_payload
from mop.protocols.pulsar.metadata import MessageMetadata
from mop.settings import ClusterSettings
from mop.testing.node import RunningNode
from tests.e2e.pulsar_support import (
    TIMEOUT_MS,
    RawPulsar,
    pulsar_client,
    pulsar_node,
    pulsar_port,
    pulsar_settings,
    service_url,
)

pytestmark = pytest.mark.e2e


@pytest.fixture
def raw(node: RunningNode) -> Iterator[RawPulsar]:
    client = RawPulsar(pulsar_port(node))
    try:
        yield client
    finally:
        client.close()


def connected(raw: RawPulsar) -> Connected:
    answer = raw.connect()
    assert isinstance(answer, Connected), answer
    return answer


def test_handshake_announces_version_and_limits(raw: RawPulsar) -> None:
    answer = connected(raw)
    assert answer.server_version.startswith("mop")
    assert answer.protocol_version == 20
    assert answer.max_message_size == DEFAULT_MAX_MESSAGE_SIZE
    raw.send(Ping())
    assert isinstance(raw.recv(), Pong)


def test_lookup_answers_connect_with_the_listener_url(node: RunningNode, raw: RawPulsar) -> None:
    connected(raw)
    raw.send(PartitionedMetadata(topic="persistent://public/default/x", request_id=1))
    metadata = raw.recv()
    assert isinstance(metadata, PartitionedMetadataResponse)
    assert (metadata.request_id, metadata.partitions) == (1, 0)
    raw.send(Lookup(topic="persistent://public/default/x", request_id=2))
    lookup = raw.recv()
    assert isinstance(lookup, LookupResponse)
    assert lookup.response is LookupType.Connect
    assert lookup.broker_service_url == service_url(node)
    assert not lookup.proxy_through_service_url


def test_lookup_of_an_unknown_tenant_fails_with_topic_not_found(raw: RawPulsar) -> None:
    connected(raw)
    raw.send(Lookup(topic="persistent://elsewhere/default/x", request_id=7))
    lookup = raw.recv()
    assert isinstance(lookup, LookupResponse)
    assert (lookup.response, lookup.error) == (LookupType.Failed, ServerError.TopicNotFound)
    raw.send(Lookup(topic="persistent://public/default/a#b", request_id=8))
    invalid = raw.recv()
    assert isinstance(invalid, LookupResponse)
    assert invalid.error is ServerError.InvalidTopicName


def test_topics_of_a_namespace_by_mode(node: RunningNode, raw: RawPulsar) -> None:
    with pulsar_client(node) as client:
        client.subscribe("persistent://public/listing/p", "s")
        client.subscribe("non-persistent://public/listing/n", "s")
        connected(raw)
        raw.send(GetTopicsOfNamespace(request_id=1, namespace="public/listing"))
        persistent = raw.recv()
        assert isinstance(persistent, GetTopicsOfNamespaceResponse)
        assert persistent.topics == ("persistent://public/listing/p",)
        raw.send(
            GetTopicsOfNamespace(request_id=2, namespace="public/listing", mode=TopicsMode.ALL)
        )
        both = raw.recv()
        assert isinstance(both, GetTopicsOfNamespaceResponse)
        assert set(both.topics) == {
            "persistent://public/listing/p",
            "non-persistent://public/listing/n",
        }
    raw.send(GetTopicsOfNamespace(request_id=3, namespace="elsewhere/ns"))
    error = raw.recv()
    assert isinstance(error, Error)
    assert (error.request_id, error.error) == (3, ServerError.TopicNotFound)


def _producer(raw: RawPulsar) -> None:
    connected(raw)
    raw.send(Producer(topic="persistent://public/default/raw", producer_id=1, request_id=1))
    assert isinstance(raw.recv(), ProducerSuccess)


def _send(sequence_id: int, *, checksum_delta: int = 0) -> Send:
    payload = make_payload(
        MessageMetadata(producer_name="raw", sequence_id=sequence_id, publish_time=1), b"data"
    )
    payload = dataclasses.replace(payload, checksum=payload.checksum ^ checksum_delta)
    return Send(producer_id=1, sequence_id=sequence_id, payload=payload)


def test_a_wrong_checksum_fails_that_send_only(raw: RawPulsar) -> None:
    _producer(raw)
    raw.send(_send(0, checksum_delta=1))
    error = raw.recv()
    assert isinstance(error, SendError)
    assert (error.sequence_id, error.error) == (0, ServerError.ChecksumError)
    raw.send(_send(1))
    receipt = raw.recv()
    assert isinstance(receipt, SendReceipt) and receipt.sequence_id == 1


def test_a_send_for_an_unknown_producer_is_refused(raw: RawPulsar) -> None:
    connected(raw)
    raw.send(_send(0))
    error = raw.recv()
    assert isinstance(error, SendError) and error.error is ServerError.NotAllowedError
    raw.send(Ping())
    assert isinstance(raw.recv(), Pong)


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("garbage", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("command before CONNECT", None),
        ("oversize", struct.pack(">I", 64 * 1024 * 1024)),
    ],
)
def test_hostile_input_closes_only_its_connection(
    node: RunningNode, name: str, data: bytes | None
) -> None:
    with pulsar_client(node) as client:
        consumer = client.subscribe("persistent://public/default/hostile", "s")
        producer = client.create_producer("persistent://public/default/hostile")
        bad = RawPulsar(pulsar_port(node))
        try:
            if data is None:
                bad.send(Ping())
            else:
                if name == "oversize":
                    connected(bad)
                bad.send_bytes(data)
            answer = bad.recv()
            assert isinstance(answer, Error), answer
            assert bad.recv() is None, "the connection should be closed"
        finally:
            bad.close()
        producer.send(b"still fine")
        assert consumer.receive(timeout_millis=TIMEOUT_MS).data() == b"still fine"


def test_advertised_url_from_the_settings() -> None:
    settings = dataclasses.replace(
        pulsar_settings(), cluster=ClusterSettings(advertised_url="pulsar://broker.example:6650")
    )
    with pulsar_node(settings) as node:
        raw = RawPulsar(pulsar_port(node))
        try:
            connected(raw)
            raw.send(Lookup(topic="persistent://public/default/x", request_id=1))
            lookup = raw.recv()
            assert isinstance(lookup, LookupResponse)
            assert lookup.broker_service_url == "pulsar://broker.example:6650"
        finally:
            raw.close()


def test_the_asyncio_client_works_too(node: RunningNode) -> None:
    import asyncio

    from pulsar.asyncio import Client as AsyncClient

    async def scenario() -> list[bytes]:
        client = AsyncClient(service_url(node))
        try:
            consumer = await client.subscribe("persistent://public/default/asyncio", "s")
            producer = await client.create_producer("persistent://public/default/asyncio")
            for i in range(3):
                await producer.send(f"a{i}".encode())
            got = []
            for _ in range(3):
                message = await consumer.receive()
                await consumer.acknowledge(message)
                got.append(message.data())
            return got
        finally:
            await client.close()

    assert asyncio.run(scenario()) == [b"a0", b"a1", b"a2"]


def test_sync_client_timeouts_are_not_needed(node: RunningNode) -> None:
    # Every request is answered: a short operation timeout is enough for a whole session.
    with pulsar_client(node, operation_timeout_seconds=2) as client:
        reader = client.create_reader("persistent://public/default/quick", pulsar.MessageId.latest)
        assert not reader.has_message_available()
        client.create_producer("persistent://public/default/quick").send(b"q")
        assert reader.read_next(timeout_millis=TIMEOUT_MS).data() == b"q"


def test_a_connection_reset_is_no_error(
    node: RunningNode, caplog: pytest.LogCaptureFixture
) -> None:
    import socket
    import time

    raw = RawPulsar(pulsar_port(node))
    connected(raw)
    raw.send(Producer(topic="persistent://public/default/reset", producer_id=1, request_id=1))
    assert isinstance(raw.recv(), ProducerSuccess)
    # Close with a TCP reset, as a crashed client would.
    raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    raw.close()
    time.sleep(0.3)
    errors = [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    assert not errors, [r.getMessage() for r in errors]
    with pulsar_client(node) as client:  # the producer name and topic are free again
        client.create_producer("persistent://public/default/reset").send(b"ok")
