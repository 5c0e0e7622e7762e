"""MQTT and Pulsar clients on the same topics (DESIGN.md section 4): an MQTT topic `a/b` is the
Pulsar topic `persistent://public/default/a%2Fb`, in both directions."""

from __future__ import annotations

import pulsar
import pytest

from mop.testing.node import RunningNode
from tests.e2e.clients import Client, props
from tests.e2e.pulsar_support import TIMEOUT_MS, receive_all

pytestmark = pytest.mark.e2e


def pulsar_topic(mqtt_topic: str) -> str:
    return "persistent://public/default/" + mqtt_topic.replace("/", "%2F")


def test_mqtt_publish_reaches_a_pulsar_consumer(node: RunningNode, client: pulsar.Client) -> None:
    consumer = client.subscribe(pulsar_topic("m2p/a/b"), "s")
    mqtt = Client(node.mqtt_port, "mqtt-publisher")
    properties = props(
        ContentType="text/plain", ResponseTopic="replies/1", UserProperty=[("colour", "red")]
    )
    mqtt.publish("m2p/a/b", b"\x00binary\xff", 1, properties=properties)
    message = consumer.receive(timeout_millis=TIMEOUT_MS)
    assert message.data() == b"\x00binary\xff"
    assert message.properties() == {
        "mqtt.content_type": "text/plain",
        "mqtt.response_topic": "replies/1",
        "colour": "red",
    }
    assert message.producer_name() == "mqtt-publisher"
    assert message.publish_timestamp() > 0
    consumer.acknowledge(message)


def test_names_with_spaces_and_escapes_are_one_topic_for_both_protocols(
    node: RunningNode, client: pulsar.Client
) -> None:
    # MoP's encoding writes a space as "+" and an MQTT "+" as "%2B"; both must be usable.
    name = "persistent://public/default/m2p%2Fretained+messages%2F%24count"
    consumer = client.subscribe(name, "s")
    mqtt = Client(node.mqtt_port, "mqtt-spaces")
    mqtt.subscribe("m2p/retained messages/+", qos=1)
    mqtt.publish("m2p/retained messages/$count", b"from mqtt", 1)
    assert consumer.receive(timeout_millis=TIMEOUT_MS).data() == b"from mqtt"
    producer = client.create_producer(name)
    producer.send(b"from pulsar")
    received = mqtt.expect(2)
    assert [(m.topic, m.payload) for m in received] == [
        ("m2p/retained messages/$count", b"from mqtt"),
        ("m2p/retained messages/$count", b"from pulsar"),
    ]


def test_mqtt_retained_publish_reaches_pulsar_marked_retained(
    node: RunningNode, client: pulsar.Client
) -> None:
    consumer = client.subscribe(pulsar_topic("m2p/retained"), "s")
    Client(node.mqtt_port, "retainer").publish("m2p/retained", b"kept", 1, retain=True)
    message = consumer.receive(timeout_millis=TIMEOUT_MS)
    assert (message.data(), message.properties()) == (b"kept", {"mqtt.retain": "1"})
    # MQTT subscribers still get it as the retained message of the topic.
    late = Client(node.mqtt_port, "late")
    late.subscribe("m2p/retained", 1)
    [retained] = late.expect(1)
    assert (retained.payload, retained.retain) == (b"kept", True)


def test_pulsar_message_reaches_mqtt_subscribers_of_the_topic_and_of_wildcards(
    node: RunningNode, client: pulsar.Client
) -> None:
    exact = Client(node.mqtt_port, "exact")
    exact.subscribe("p2m/a/b", 1)
    wildcard = Client(node.mqtt_port, "wildcard")
    wildcard.subscribe("p2m/a/+", 1)
    producer = client.create_producer(pulsar_topic("p2m/a/b"))
    producer.send(b"from pulsar", properties={"colour": "blue"})
    for subscriber in (exact, wildcard):
        [message] = subscriber.expect(1)
        assert (message.topic, message.payload, message.qos) == ("p2m/a/b", b"from pulsar", 1)
        assert message.properties.UserProperty == [("colour", "blue")]


def test_a_pulsar_batch_reaches_mqtt_as_separate_messages(
    node: RunningNode, client: pulsar.Client
) -> None:
    subscriber = Client(node.mqtt_port, "batch-subscriber")
    subscriber.subscribe("p2m/batch", 1)
    producer = client.create_producer(
        pulsar_topic("p2m/batch"),
        batching_enabled=True,
        batching_max_messages=5,
        batching_max_publish_delay_ms=1000,
    )
    for i in range(5):
        producer.send_async(f"b{i}".encode(), None, properties={"i": str(i)})
    producer.flush()
    received = subscriber.expect(5)
    assert [m.payload for m in received] == [f"b{i}".encode() for i in range(5)]
    assert [m.properties.UserProperty for m in received] == [[("i", str(i))] for i in range(5)]
    subscriber.expect_none()


def test_an_offline_mqtt_session_collects_pulsar_messages(
    node: RunningNode, client: pulsar.Client
) -> None:
    session = Client(node.mqtt_port, "offline", version=4, clean=False)
    session.subscribe("p2m/offline/#", 1)
    session.disconnect()
    producer = client.create_producer(pulsar_topic("p2m/offline/x"))
    for i in range(3):
        producer.send(f"o{i}".encode())
    back = Client(node.mqtt_port, "offline", version=4, clean=False)
    assert [m.payload for m in back.expect(3)] == [b"o0", b"o1", b"o2"]


def test_pulsar_and_mqtt_share_subscriber_counts(node: RunningNode, client: pulsar.Client) -> None:
    # An MQTT QoS 1 publish says whether anyone subscribed: a Pulsar subscription counts.
    mqtt = Client(node.mqtt_port, "counter")
    assert mqtt.publish("shared/count", b"x", 1) == 16  # No matching subscribers
    consumer = client.subscribe(pulsar_topic("shared/count"), "s")
    assert mqtt.publish("shared/count", b"y", 1) == 0
    assert [m.data() for m in receive_all(consumer, 1)] == [b"y"]
