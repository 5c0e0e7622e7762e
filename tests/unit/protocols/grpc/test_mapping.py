"""gRPC messages <-> protocol-neutral messages, ids and topic names: one mapping with the
Pulsar adapter's, so MQTT 5 properties reach gRPC clients under the documented names."""

from __future__ import annotations

import pytest

from mop.message import ENCRYPTED, Delivery, Message, MessageId
from mop.protocols.grpc.mapping import (
    canonical_topic,
    from_proto_id,
    message_from_send,
    proto_message,
    readable,
    sequence_id_of,
    to_proto_id,
)
from mop.protocols.grpc.proto import mop_grpc_pb2 as pb
from mop.protocols.grpc.status import GrpcError, StatusCode
from mop.protocols.mqtt.mapping import message_properties, publish_to_message
from mop.protocols.mqtt.packets import Properties, Publish


def test_a_send_becomes_a_message_with_its_properties_in_order() -> None:
    send = pb.Send(
        payload=b"p",
        key="k",
        properties=[pb.Property(key="a", value="1"), pb.Property(key="a", value="2")],
        event_time=3,
        deliver_at_time=4,
    )
    message = message_from_send(send, producer="prod", now_ms=10)
    assert message == Message(
        b"p",
        (("a", "1"), ("a", "2")),
        key="k",
        producer="prod",
        publish_time=10,
        event_time=3,
        deliver_at=4,
    )
    assert message_from_send(pb.Send(payload=b""), producer="p", now_ms=1).key is None


def test_the_qos_comes_from_the_properties_as_a_pulsar_messages_does() -> None:
    send = pb.Send(payload=b"p", properties=[pb.Property(key="mop.qos", value="0")])
    assert message_from_send(send, producer="p", now_ms=1).qos == 0
    assert message_from_send(pb.Send(payload=b"p"), producer="p", now_ms=1).qos == 1


def test_a_client_cannot_claim_the_encrypted_mark() -> None:
    marked = pb.Send(payload=b"p", properties=[pb.Property(key=k, value=v) for k, v in [ENCRYPTED]])
    message = message_from_send(marked, producer="p", now_ms=1)
    assert message.properties == () and readable(message)


def test_mqtt5_properties_reach_a_grpc_consumer_under_their_documented_names() -> None:
    properties = Properties(
        content_type="text/plain",
        response_topic="replies",
        correlation_data=b"\x01\x02",
        payload_format_indicator=1,
        user_properties=(("u", "1"),),
    )
    publish = Publish("t", b"x", 1, packet_id=1, properties=properties)
    message = publish_to_message(publish, client_id="mqtt-client", now_ms=5)
    got = proto_message(Delivery("persistent://public/default/t", MessageId(1, 2), message))
    assert [(p.key, p.value) for p in got.properties] == [
        ("mqtt.content_type", "text/plain"),
        ("mqtt.response_topic", "replies"),
        ("mqtt.correlation_data", "AQI="),
        ("mqtt.payload_format", "1"),
        ("u", "1"),
    ]
    assert (got.producer_name, got.publish_time, got.HasField("key")) == ("mqtt-client", 5, False)


def test_a_grpc_send_reaches_an_mqtt5_subscriber_with_its_properties() -> None:
    send = pb.Send(
        payload=b"x",
        properties=[
            pb.Property(key="mqtt.content_type", value="application/json"),
            pb.Property(key="mqtt.correlation_data", value="AQI="),
            pb.Property(key="trace", value="t1"),
        ],
    )
    message = message_from_send(send, producer="g", now_ms=1)
    mqtt = message_properties(message, now_ms=1)
    assert (mqtt.content_type, mqtt.correlation_data, mqtt.user_properties) == (
        "application/json",
        b"\x01\x02",
        (("trace", "t1"),),
    )


def test_a_delivery_round_trips_its_fields() -> None:
    message = Message(b"d", (("a", "b"),), key="k", producer="p", publish_time=7, event_time=6)
    got = proto_message(Delivery("topic", MessageId(3, 4, 2), message, redelivery_count=2))
    assert (got.payload, got.key, got.topic, got.redelivery_count) == (b"d", "k", "topic", 2)
    assert (got.publish_time, got.event_time, got.producer_name) == (7, 6, "p")
    assert from_proto_id(got.message_id) == MessageId(3, 4, 2)


@pytest.mark.parametrize("mid", [MessageId(0, 0), MessageId(5, 9, 3), MessageId(-1, -1)])
def test_message_ids_round_trip(mid: MessageId) -> None:
    assert from_proto_id(to_proto_id(mid)) == mid
    wire = pb.MessageId.FromString(to_proto_id(mid).SerializeToString())
    assert from_proto_id(wire) == mid


def test_encrypted_and_packed_messages_are_not_readable() -> None:
    assert not readable(Message(b"", (ENCRYPTED,)))
    assert not readable(Message(b"", opaque_count=3))


def test_sequence_ids_zero_is_unnumbered_and_above_int64_is_refused() -> None:
    assert sequence_id_of(pb.Send(sequence_id=0)) == -1
    assert sequence_id_of(pb.Send(sequence_id=5)) == 5
    with pytest.raises(GrpcError) as caught:
        sequence_id_of(pb.Send(sequence_id=1 << 63))
    assert caught.value.code is StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("name", "full"),
    [
        ("t", "persistent://acme/ns/t"),
        ("a%2Fb", "persistent://acme/ns/a%2Fb"),
        ("acme/other/t", "persistent://acme/other/t"),
        ("non-persistent://acme/ns/t", "non-persistent://acme/ns/t"),
        ("persistent://acme/ns/t-partition-1", "persistent://acme/ns/t-partition-1"),
    ],
)
def test_topic_names_are_read_as_pulsar_clients_give_them(name: str, full: str) -> None:
    assert canonical_topic(name, tenant="acme", namespace="ns") == full


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("a/b", StatusCode.INVALID_ARGUMENT),
        ("persistent://acme/ns/a/b", StatusCode.INVALID_ARGUMENT),
        ("persistent://acme/ns/a#b", StatusCode.INVALID_ARGUMENT),
        ("ftp://acme/ns/t", StatusCode.INVALID_ARGUMENT),
        ("public/default/t", StatusCode.NOT_FOUND),
    ],
)
def test_names_the_node_does_not_serve_are_refused(name: str, code: StatusCode) -> None:
    with pytest.raises(GrpcError) as caught:
        canonical_topic(name, tenant="acme", namespace="ns")
    assert caught.value.code is code
