"""Publish/subscribe end to end with paho-mqtt (3.1.1 and 5.0) against a real node."""

from __future__ import annotations

import pytest

from mop.testing.node import RunningNode, node_settings, running_node
from tests.e2e.clients import Client, props

pytestmark = [pytest.mark.e2e, pytest.mark.both_modes]

NOT_AUTHORIZED = 0x87


@pytest.mark.parametrize("version", [3, 4, 5])
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_publish_reaches_subscriber(node: RunningNode, version: int, qos: int) -> None:
    sub = Client(node.mqtt_port, f"sub-{version}-{qos}", version=version)
    assert sub.subscribe("sensors/+/temp", qos) == [qos]
    pub = Client(node.mqtt_port, f"pub-{version}-{qos}", version=version)
    pub.publish("sensors/kitchen/temp", b"21.5", qos)
    [msg] = sub.expect(1)
    assert (msg.topic, msg.payload, msg.qos) == ("sensors/kitchen/temp", b"21.5", qos)
    sub.expect_none()


def test_delivery_qos_is_the_minimum_of_publish_and_grant(node: RunningNode) -> None:
    sub = Client(node.mqtt_port, "s")
    sub.subscribe("t", 1)
    pub = Client(node.mqtt_port, "p")
    pub.publish("t", b"a", 2)
    pub.publish("t", b"b", 0)
    got = sub.expect(2)
    assert [(m.payload, m.qos) for m in got] == [(b"a", 1), (b"b", 0)]


def test_overlapping_subscriptions_deliver_once_with_highest_qos(node: RunningNode) -> None:
    sub = Client(node.mqtt_port, "s", version=4)
    sub.subscribe("a/#", 0)
    sub.subscribe("a/+", 1)
    Client(node.mqtt_port, "p").publish("a/b", b"x", 2)
    [msg] = sub.expect(1)
    assert msg.qos == 1
    sub.expect_none()


def test_subscription_identifiers_for_each_matching_subscription(node: RunningNode) -> None:
    from paho.mqtt.packettypes import PacketTypes

    sub = Client(node.mqtt_port, "s")
    sub.subscribe("a/#", 1, properties=props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=7))
    sub.subscribe("a/+", 1, properties=props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=9))
    Client(node.mqtt_port, "p").publish("a/b", b"x", 1)
    [msg] = sub.expect(1)
    assert sorted(msg.properties.SubscriptionIdentifier) == [7, 9]


def test_dollar_topics_are_not_matched_by_leading_wildcards(node: RunningNode) -> None:
    sub = Client(node.mqtt_port, "s")
    sub.subscribe("#", 0)
    sub.subscribe("+/x", 0)
    sys_sub = Client(node.mqtt_port, "s2")
    sys_sub.subscribe("$SYS/#", 0)
    node.call(lambda: None)
    sub.expect_none()


@pytest.mark.parametrize("version", [4, 5])
def test_clients_publish_to_dollar_topics_that_only_dollar_filters_match(
    node: RunningNode, version: int
) -> None:
    """`$aws/...`-style topics are the clients' (the spec only advises against `$` names), and
    a filter starting with a wildcard does not match them [MQTT-4.7.2-1]."""
    topic = f"$aws/things/t{version}/shadow/update"
    wildcards = Client(node.mqtt_port, f"dw-{version}", version=version)
    assert wildcards.subscribe("#", 1) == [1]
    assert wildcards.subscribe("+/things/#", 1) == [1]
    dollar = Client(node.mqtt_port, f"dd-{version}", version=version)
    assert dollar.subscribe("$aws/#", 1) == [1]
    exact = Client(node.mqtt_port, f"de-{version}", version=version)
    assert exact.subscribe("$aws/things/+/shadow/update", 1) == [1]
    pub = Client(node.mqtt_port, f"dp-{version}", version=version)
    assert pub.publish(topic, b"live", 1) == 0
    assert pub.publish(topic, b"kept", 1, retain=True) == 0
    for client in (dollar, exact):
        assert [(m.topic, m.payload) for m in client.expect(2)] == [
            (topic, b"live"),
            (topic, b"kept"),
        ]
    late = Client(node.mqtt_port, f"dl-{version}", version=version)
    late.subscribe("$aws/things/#", 1)
    [msg] = late.expect(1)
    assert (msg.topic, msg.payload, msg.retain) == (topic, b"kept", True)
    late_wildcard = Client(node.mqtt_port, f"dlw-{version}", version=version)
    late_wildcard.subscribe("#", 1)
    late_wildcard.expect_none(0.3)  # nor the retained message
    wildcards.expect_none(0.3)
    assert pub.client.is_connected()


@pytest.mark.parametrize("topic", ["$SYS/x", "$SYS", "$share/g/t"])
def test_sys_and_share_topic_names_stay_refused(node: RunningNode, topic: str) -> None:
    assert Client(node.mqtt_port, "dr").publish(topic, b"x", 1) == NOT_AUTHORIZED


@pytest.mark.parametrize("version", [4, 5])
def test_bridge_state_messages_are_taken_and_dropped(node: RunningNode, version: int) -> None:
    """mosquitto lets any client write `$SYS/broker/connection/+/state`, where bridges report
    their state (and put their will): mop takes them, and keeps `$SYS` its own."""
    watcher = Client(node.mqtt_port, f"bs-watch-{version}")
    watcher.subscribe("$SYS/broker/connection/#", 1)
    bridge = Client(
        node.mqtt_port,
        f"bs-{version}",
        version=version,
        will=(f"$SYS/broker/connection/bs-{version}/state", b"0", 1, True),
    )
    assert bridge.connack is not None and bridge.connack.reason_code == 0
    state = f"$SYS/broker/connection/bs-{version}/state"
    assert bridge.publish(state, b"1", 1, retain=True) == 0
    assert bridge.client.is_connected()
    watcher.expect_none(0.3)


def test_dollar_topics_are_refused_when_publish_dollar_topics_is_off() -> None:
    with running_node(node_settings(publish_dollar_topics=False)) as node:
        assert Client(node.mqtt_port, "doff").publish("$aws/x", b"x", 1) == NOT_AUTHORIZED


@pytest.mark.merged_only(reason="a proxy cannot know that no subscription matches (0x10 is a MAY)")
def test_no_matching_subscribers_reason_code(node: RunningNode) -> None:
    pub = Client(node.mqtt_port, "p")
    assert pub.publish("nobody/listens", b"x", 1) == 0x10
    sub = Client(node.mqtt_port, "s")
    sub.subscribe("nobody/listens", 1)
    assert pub.publish("nobody/listens", b"x", 1) == 0


def test_no_local(node: RunningNode) -> None:
    client = Client(node.mqtt_port, "me")
    client.subscribe("chat", 1, noLocal=True)
    other = Client(node.mqtt_port, "other")
    other.subscribe("chat", 1)
    client.publish("chat", b"hello", 1)
    [msg] = other.expect(1)
    assert msg.payload == b"hello"
    client.expect_none()


def test_unsubscribe(node: RunningNode) -> None:
    sub = Client(node.mqtt_port, "s")
    sub.subscribe("t/#", 1)
    assert sub.unsubscribe("t/#") == [0]
    assert sub.unsubscribe("t/#") == [0x11]
    Client(node.mqtt_port, "p").publish("t/x", b"x", 1)
    sub.expect_none()


def test_user_properties_and_mqtt5_fields_pass_through(node: RunningNode) -> None:
    sub = Client(node.mqtt_port, "s")
    sub.subscribe("req", 1)
    pub = Client(node.mqtt_port, "p")
    p = props(
        UserProperty=[("a", "1"), ("a", "2"), ("b", "3")],
        ContentType="application/json",
        ResponseTopic="resp/1",
        CorrelationData=b"\x00\x01",
        PayloadFormatIndicator=1,
        MessageExpiryInterval=60,
    )
    pub.publish("req", b"{}", 1, properties=p)
    [msg] = sub.expect(1)
    got = msg.properties
    assert got.UserProperty == [("a", "1"), ("a", "2"), ("b", "3")]
    assert (got.ContentType, got.ResponseTopic, got.CorrelationData) == (
        "application/json",
        "resp/1",
        b"\x00\x01",
    )
    assert got.PayloadFormatIndicator == 1
    assert 58 <= got.MessageExpiryInterval <= 60
