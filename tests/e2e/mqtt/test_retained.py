"""Retained messages end to end: set, replace, clear, delivery on subscribe, the retain flag on
live deliveries, MQTT 5 Retain As Published / Retain Handling, expiry and QoS."""

from __future__ import annotations

import time

import pytest

from mop.protocols.mqtt.codec import encode
from mop.protocols.mqtt.packets import Publish, Suback, Subscribe, SubscriptionRequest
from mop.testing.node import RunningNode
from tests.e2e.clients import Client, props
from tests.e2e.raw import RawClient

pytestmark = [pytest.mark.e2e, pytest.mark.both_modes]


@pytest.mark.parametrize("version", [4, 5])
def test_retained_message_is_set_replaced_and_cleared(node: RunningNode, version: int) -> None:
    pub = Client(node.mqtt_port, f"rp-{version}", version=version)
    pub.publish("rt/state", b"one", 1, retain=True)

    first = Client(node.mqtt_port, f"r1-{version}", version=version)
    first.subscribe("rt/state", 1)
    [msg] = first.expect(1)
    assert (msg.topic, msg.payload, msg.retain) == ("rt/state", b"one", True)

    pub.publish("rt/state", b"two", 1, retain=True)
    second = Client(node.mqtt_port, f"r2-{version}", version=version)
    second.subscribe("rt/state", 1)
    [msg] = second.expect(1)
    assert (msg.payload, msg.retain) == (b"two", True)  # replaced, not added
    second.expect_none()

    pub.publish("rt/state", b"", 1, retain=True)
    third = Client(node.mqtt_port, f"r3-{version}", version=version)
    third.subscribe("rt/state", 1)
    third.expect_none(0.5)  # cleared


@pytest.mark.parametrize("version", [4, 5])
def test_new_subscription_gets_every_matching_retained_message(
    node: RunningNode, version: int
) -> None:
    pub = Client(node.mqtt_port, f"mp-{version}", version=version)
    retained = {"a/x": b"1", "a/y": b"2", "a/b/c": b"3"}
    for topic, payload in retained.items():
        pub.publish(topic, payload, 1, retain=True)
    pub.publish("b/x", b"other", 1, retain=True)
    pub.publish("a/not-retained", b"live only", 1)

    sub = Client(node.mqtt_port, f"ms-{version}", version=version)
    sub.subscribe("a/#", 1)
    got = sub.expect(3)
    assert {m.topic: m.payload for m in got} == retained
    assert all(m.retain for m in got)
    sub.expect_none()


@pytest.mark.parametrize("version", [4, 5])
def test_live_delivery_of_a_retained_publish_has_retain_cleared(
    node: RunningNode, version: int
) -> None:
    sub = Client(node.mqtt_port, f"ls-{version}", version=version)
    sub.subscribe("live/t", 1)
    Client(node.mqtt_port, f"lp-{version}", version=version).publish(
        "live/t", b"now", 1, retain=True
    )
    [msg] = sub.expect(1)
    assert (msg.payload, msg.retain) == (b"now", False)
    sub.expect_none()  # delivered once, not again as a retained message


def test_retain_as_published_keeps_the_flag(node: RunningNode) -> None:
    rap = Client(node.mqtt_port, "rap")
    rap.subscribe("rap/t", 1, retainAsPublished=True)
    plain = Client(node.mqtt_port, "plain")
    plain.subscribe("rap/t", 1)
    pub = Client(node.mqtt_port, "rap-pub")
    pub.publish("rap/t", b"kept", 1, retain=True)
    pub.publish("rap/t", b"not retained", 1)
    assert [(m.payload, m.retain) for m in rap.expect(2)] == [
        (b"kept", True),
        (b"not retained", False),
    ]
    assert [(m.payload, m.retain) for m in plain.expect(2)] == [
        (b"kept", False),
        (b"not retained", False),
    ]


@pytest.mark.parametrize("version", [3, 4, 5])
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_every_subscribe_gets_the_retained_message_again(
    node: RunningNode, version: int, qos: int
) -> None:
    """[MQTT-3.3.1-6], [MQTT-3.8.4-3]: a SUBSCRIBE (Retain Handling 0) delivers the matching
    retained messages, also one that repeats a filter the session has."""
    topic = f"again/{version}/{qos}"
    Client(node.mqtt_port, f"again-pub-{version}-{qos}").publish(topic, b"r", 2, retain=True)
    sub = Client(node.mqtt_port, f"again-{version}-{qos}", version=version)
    for _ in range(3):
        assert sub.subscribe(topic, qos) == [qos]
        [msg] = sub.expect(1)
        assert (msg.payload, msg.retain, msg.qos) == (b"r", True, qos)
    sub.expect_none(0.3)


@pytest.mark.parametrize("level", [4, 5])
def test_subscribes_in_one_read_each_get_the_retained_message(
    node: RunningNode, level: int
) -> None:
    topic = f"again-raw/{level}"
    Client(node.mqtt_port, f"again-raw-pub-{level}").publish(topic, b"r", 1, retain=True)
    sub = RawClient(node.mqtt_port, level=level)
    sub.connect(f"again-raw-{level}")
    request = (SubscriptionRequest(topic, 1),)
    sub.send_bytes(encode(Subscribe(1, request), level) + encode(Subscribe(2, request), level))
    got = [sub.recv() for _ in range(4)]
    assert [type(p) for p in got] == [Suback, Publish, Suback, Publish], got
    publishes = [p for p in got if isinstance(p, Publish)]
    assert all((p.payload, p.retain) == (b"r", True) for p in publishes)
    assert publishes[0].packet_id != publishes[1].packet_id  # the first is not acknowledged


def test_retain_handling_1_sends_retained_only_for_a_new_subscription(node: RunningNode) -> None:
    Client(node.mqtt_port, "rh1-pub").publish("rh1/t", b"r", 1, retain=True)
    sub = Client(node.mqtt_port, "rh1")
    sub.subscribe("rh1/t", 1, retainHandling=1)
    [msg] = sub.expect(1)
    assert (msg.payload, msg.retain) == (b"r", True)
    sub.subscribe("rh1/t", 1, retainHandling=1)  # exists already: nothing
    sub.expect_none(0.5)
    sub.subscribe("rh1/t", 1, retainHandling=0)  # 0: on every subscribe
    [msg] = sub.expect(1)
    assert (msg.payload, msg.retain) == (b"r", True)


def test_retain_handling_2_never_sends_retained(node: RunningNode) -> None:
    pub = Client(node.mqtt_port, "rh2-pub")
    pub.publish("rh2/t", b"r", 1, retain=True)
    sub = Client(node.mqtt_port, "rh2")
    sub.subscribe("rh2/t", 1, retainHandling=2)
    sub.expect_none(0.5)
    pub.publish("rh2/t", b"live", 1)  # the subscription itself works
    [msg] = sub.expect(1)
    assert msg.payload == b"live"


def test_expired_retained_message_is_not_delivered(node: RunningNode) -> None:
    pub = Client(node.mqtt_port, "ex-pub")
    pub.publish("ex/short", b"s", 1, retain=True, properties=props(MessageExpiryInterval=1))
    pub.publish("ex/long", b"l", 1, retain=True, properties=props(MessageExpiryInterval=60))
    pub.publish("ex/forever", b"f", 1, retain=True)
    time.sleep(1.3)
    sub = Client(node.mqtt_port, "ex-sub")
    sub.subscribe("ex/#", 1)
    got = {m.topic: m for m in sub.expect(2)}
    assert sorted(got) == ["ex/forever", "ex/long"]
    sub.expect_none()
    # The expiry counts down while the message is retained.
    assert 1 <= got["ex/long"].properties.MessageExpiryInterval <= 59
    assert not hasattr(got["ex/forever"].properties, "MessageExpiryInterval")


@pytest.mark.parametrize(
    ("published", "granted", "delivered"), [(2, 1, 1), (1, 0, 0), (1, 2, 1), (0, 2, 0), (2, 2, 2)]
)
def test_retained_qos_is_the_minimum_of_published_and_granted(
    node: RunningNode, published: int, granted: int, delivered: int
) -> None:
    pub = Client(node.mqtt_port, "q-pub")
    pub.publish("rq/t", b"x", published, retain=True)
    pub.publish("rq/barrier", b"", 1)  # the publish above is processed once this is acknowledged
    sub = Client(node.mqtt_port, "q-sub")
    assert sub.subscribe("rq/t", granted) == [granted]
    [msg] = sub.expect(1)
    assert (msg.payload, msg.retain, msg.qos) == (b"x", True, delivered)


def test_shared_subscriptions_get_no_retained_messages(node: RunningNode) -> None:
    pub = Client(node.mqtt_port, "sh-pub")
    pub.publish("sh/t", b"retained", 1, retain=True)
    shared = Client(node.mqtt_port, "sh")
    assert shared.subscribe("$share/g/sh/#", 1) == [1]
    shared.expect_none(0.5)
    normal = Client(node.mqtt_port, "sh-normal")
    normal.subscribe("sh/#", 1)
    [msg] = normal.expect(1)  # the retained message is there for normal subscriptions
    assert msg.payload == b"retained"
    pub.publish("sh/t", b"live", 1)
    [msg] = shared.expect(1)
    assert msg.payload == b"live"


@pytest.mark.parametrize("version", [4, 5])
def test_empty_retained_publish_reaches_current_subscribers(
    node: RunningNode, version: int
) -> None:
    pub = Client(node.mqtt_port, f"e-pub-{version}", version=version)
    pub.publish("er/t", b"v", 1, retain=True)
    sub = Client(node.mqtt_port, f"e-sub-{version}", version=version)
    sub.subscribe("er/t", 1)
    [msg] = sub.expect(1)
    assert msg.retain
    pub.publish("er/t", b"", 1, retain=True)
    [msg] = sub.expect(1)
    assert (msg.payload, msg.retain) == (b"", False)
