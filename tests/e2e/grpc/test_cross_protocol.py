"""gRPC clients share topics with MQTT and Pulsar clients, both ways and in both modes: a
message keeps its payload, key, event time and properties (MQTT 5's under their documented
names) whichever protocol produced it and whichever consumes it.

Merged: one node serves the three protocols. Separated: MQTT and gRPC clients use a proxy,
Pulsar clients its broker (the Pulsar adapter runs on brokers)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pulsar
import pytest

from mop.protocols.grpc.proto.mop_grpc_pb2 import Property, Send
from tests.e2e.clients import Client, props
from tests.e2e.conftest import Topology
from tests.e2e.grpc.interop import GrpcClient, Site, grpc_site, pairs
from tests.e2e.pulsar_support import TIMEOUT_MS

pytestmark = [pytest.mark.e2e, pytest.mark.both_modes]

EVENT_TIME = 1_790_000_000_123  # milliseconds since the epoch


def user_properties(message: pulsar.Message) -> dict[str, str]:
    """The properties a Pulsar consumer gets, without the `mop.*` ones a separated proxy adds
    for the fields Pulsar messages have no place for (mop.backends.cluster.messages)."""
    return {k: v for k, v in message.properties().items() if not k.startswith("mop.")}


def producer_of(message: pulsar.Message) -> str:
    """The producer a client named: a separated proxy's own producer carries it as
    `mop.producer`."""
    name: str = message.properties().get("mop.producer") or message.producer_name()
    return name


@pytest.fixture
def site(topology: Topology) -> Iterator[Site]:
    with grpc_site(topology) as running:
        yield running


@pytest.fixture
def name() -> str:
    """An MQTT topic name of the test's own (its Pulsar name is `site.topic(name)`)."""
    return f"x/{uuid.uuid4().hex[:10]}"


def test_grpc_produce_reaches_an_mqtt5_subscriber_with_its_properties(
    site: Site, name: str
) -> None:
    subscriber = Client(site.node.mqtt_port, "from-grpc")
    subscriber.subscribe(name, 1)
    properties = [
        Property(key="mqtt.content_type", value="application/json"),
        Property(key="mqtt.response_topic", value="replies/7"),
        Property(key="colour", value="red"),
        Property(key="colour", value="blue"),
    ]
    with GrpcClient(site.grpc_port) as client:
        [result] = client.produce(
            site.topic(name),
            [Send(payload=b'{"n": 1}', key="k", properties=properties, sequence_id=1)],
        )
    assert result.WhichOneof("result") == "message_id", result

    [received] = subscriber.expect(1)
    assert (received.topic, received.payload) == (name, b'{"n": 1}')
    assert received.properties.ContentType == "application/json"
    assert received.properties.ResponseTopic == "replies/7"
    # User properties keep their order and duplicates; the reserved names are not among them.
    assert received.properties.UserProperty == [("colour", "red"), ("colour", "blue")]


def test_an_mqtt_publish_reaches_a_grpc_consumer(site: Site, name: str) -> None:
    with (
        GrpcClient(site.grpc_port) as client,
        client.consumer(site.topic(name), "g", pulsar_initial_position="earliest") as consumer,
    ):
        publisher = Client(site.node.mqtt_port, "mqtt-to-grpc")
        properties = props(
            ContentType="text/plain",
            ResponseTopic="replies/1",
            UserProperty=[("colour", "red"), ("colour", "green")],
        )
        publisher.publish(name, b"\x00from mqtt\xff", 1, properties=properties)
        message = consumer.receive()
        assert message.payload == b"\x00from mqtt\xff"
        assert pairs(message.properties) == [
            ("mqtt.content_type", "text/plain"),
            ("mqtt.response_topic", "replies/1"),
            ("colour", "red"),
            ("colour", "green"),
        ]
        assert message.producer_name == "mqtt-to-grpc"
        assert message.topic == site.topic(name)
        assert message.publish_time > 0
        assert message.redelivery_count == 0
        consumer.ack([message.message_id])


def test_a_pulsar_producer_reaches_a_grpc_consumer_with_key_properties_and_event_time(
    site: Site, name: str
) -> None:
    pulsar_client = site.pulsar_client()
    try:
        producer = pulsar_client.create_producer(
            site.topic(name), producer_name="pulsar-to-grpc", batching_enabled=False
        )
        sent_id = producer.send(
            b"from pulsar",
            properties={"colour": "blue", "size": "9"},
            partition_key="the-key",
            event_timestamp=EVENT_TIME,
        )
        with (
            GrpcClient(site.grpc_port) as client,
            client.consumer(site.topic(name), "g", pulsar_initial_position="earliest") as consumer,
        ):
            message = consumer.receive()
            consumer.ack([message.message_id])
    finally:
        pulsar_client.close()

    assert message.payload == b"from pulsar"
    assert message.key == "the-key"
    assert sorted(pairs(message.properties)) == [("colour", "blue"), ("size", "9")]
    assert message.event_time == EVENT_TIME
    assert message.producer_name == "pulsar-to-grpc"
    assert (message.message_id.ledger_id, message.message_id.entry_id) == (
        sent_id.ledger_id(),
        sent_id.entry_id(),
    )


def test_grpc_produce_reaches_a_pulsar_consumer_with_key_properties_and_event_time(
    site: Site, name: str
) -> None:
    pulsar_client = site.pulsar_client()
    try:
        consumer = pulsar_client.subscribe(site.topic(name), "p")
        with GrpcClient(site.grpc_port) as client:
            results = client.produce(
                site.topic(name),
                [
                    Send(
                        payload=f"g{n}".encode(),
                        key=f"key-{n}",
                        properties=[Property(key="n", value=str(n))],
                        event_time=EVENT_TIME + n,
                        sequence_id=n + 1,
                    )
                    for n in range(3)
                ],
                pulsar_producer_name="grpc-to-pulsar",
            )
        received = [consumer.receive(timeout_millis=TIMEOUT_MS) for _ in range(3)]
        for message in received:
            consumer.acknowledge(message)
    finally:
        pulsar_client.close()

    assert [m.data() for m in received] == [b"g0", b"g1", b"g2"]
    assert [m.partition_key() for m in received] == ["key-0", "key-1", "key-2"]
    assert [user_properties(m) for m in received] == [{"n": "0"}, {"n": "1"}, {"n": "2"}]
    assert [m.event_timestamp() for m in received] == [EVENT_TIME + n for n in range(3)]
    assert {producer_of(m) for m in received} == {"grpc-to-pulsar"}
    assert [(m.message_id().ledger_id(), m.message_id().entry_id()) for m in received] == [
        (r.message_id.ledger_id, r.message_id.entry_id) for r in results
    ]


def test_grpc_send_and_consume_round_trip_with_acks(site: Site, name: str) -> None:
    """gRPC both ways, with an MQTT subscriber on the side: acknowledged messages are not
    delivered again to the subscription, unacknowledged ones are."""
    with GrpcClient(site.grpc_port) as client:
        for n in range(4):
            result = client.send(site.topic(name), Send(payload=f"s{n}".encode()))
            assert result.WhichOneof("result") == "message_id", result
        with client.consumer(
            site.topic(name), "round", pulsar_initial_position="earliest"
        ) as consumer:
            first = consumer.receive_many(4)
            assert [m.payload for m in first] == [b"s0", b"s1", b"s2", b"s3"]
            consumer.ack([m.message_id for m in first[:2]])
        with client.consumer(site.topic(name), "round") as again:
            redelivered = again.receive_many(2)
            assert [m.payload for m in redelivered] == [b"s2", b"s3"]
            assert all(m.redelivery_count >= 1 for m in redelivered), redelivered
            again.ack([m.message_id for m in redelivered])
            again.expect_nothing()


def test_a_pulsar_consumer_sees_grpc_sends_in_order_with_ids_matching_results(
    site: Site, name: str
) -> None:
    """Results come back in the order of the sends, and a Pulsar reader finds the messages at
    exactly the ids the results carry."""
    count = 50
    with GrpcClient(site.grpc_port) as client:
        results = client.produce(
            site.topic(name),
            [Send(payload=f"o{n}".encode(), sequence_id=n + 1) for n in range(count)],
        )
    assert [r.sequence_id for r in results] == list(range(1, count + 1))
    pulsar_client = site.pulsar_client()
    try:
        reader = pulsar_client.create_reader(site.topic(name), pulsar.MessageId.earliest)
        read = [reader.read_next(timeout_millis=TIMEOUT_MS) for _ in range(count)]
    finally:
        pulsar_client.close()
    assert [m.data() for m in read] == [f"o{n}".encode() for n in range(count)]
    assert [(m.message_id().ledger_id(), m.message_id().entry_id()) for m in read] == [
        (r.message_id.ledger_id, r.message_id.entry_id) for r in results
    ]
