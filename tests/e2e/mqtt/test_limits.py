"""Configured limits end to end: connections, subscriptions per client, topic size, the client's
Receive Maximum, queued messages, and a subscriber that stops reading its socket."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from mop.protocols.mqtt.codec import encode
from mop.protocols.mqtt.packets import (
    Connack,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Publish,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Unsubscribe,
)
from mop.settings import LimitsSettings
from mop.testing.node import RunningNode, node_settings, running_node
from tests.e2e.clients import Client
from tests.e2e.raw import RawClient, closed_with

pytestmark = [pytest.mark.e2e, pytest.mark.both_modes]


def subscribe(raw: RawClient, packet_id: int, *filters: str, qos: int = 0) -> tuple[int, ...]:
    raw.send(Subscribe(packet_id, tuple(SubscriptionRequest(f, qos) for f in filters)))
    suback = raw.recv()
    assert isinstance(suback, Suback) and suback.packet_id == packet_id, suback
    return suback.reason_codes


# -- connections ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("level", "refused"), [(5, 0x97), (4, 3), (3, 3)])
def test_max_connections(raws: Callable[..., RawClient], level: int, refused: int) -> None:
    with running_node(node_settings(limits=LimitsSettings(max_connections=3))) as node:
        holders = [raws(node.mqtt_port) for _ in range(3)]
        for index, holder in enumerate(holders):
            assert holder.connect(f"holder-{index}").reason_code == 0
        extra = raws(node.mqtt_port, level)
        connack = extra.connect("extra")
        assert connack.reason_code == refused
        assert extra.recv_until_closed() == []
        # The holders are not disturbed.
        for holder in holders:
            holder.send(Pingreq())
            assert holder.recv() == Pingresp()
        # A slot frees up when a holder leaves (its close is handled asynchronously).
        holders[0].close()
        deadline = time.monotonic() + 5
        while True:
            late = raws(node.mqtt_port, level)
            connack = late.connect("late")
            if connack.reason_code == 0:
                break
            assert connack.reason_code == refused
            assert time.monotonic() < deadline, "the closed connection never freed its slot"
            time.sleep(0.05)


def test_max_connections_with_paho() -> None:
    with running_node(node_settings(limits=LimitsSettings(max_connections=2))) as node:
        first = Client(node.mqtt_port, "first")
        second = Client(node.mqtt_port, "second", version=4)
        third = Client(node.mqtt_port, "third")
        assert third.connack is not None and third.connack.reason_code == 0x97
        third.drop()
        fourth = Client(node.mqtt_port, "fourth", version=4)
        # paho reports the 3.1.1 return code 3 as the equivalent 5.0 code 0x88.
        assert fourth.connack is not None and fourth.connack.reason_code == 0x88
        fourth.drop()
        first.subscribe("still/works", 1)
        second.publish("still/works", b"yes", 1)
        [msg] = first.expect(1)
        assert msg.payload == b"yes"
        first.disconnect()
        second.disconnect()


# -- subscriptions per client ---------------------------------------------------------------------


@pytest.mark.parametrize(("level", "quota"), [(5, 0x97), (4, 0x80)])
def test_max_subscriptions_per_client(
    raws: Callable[..., RawClient], level: int, quota: int
) -> None:
    with running_node(node_settings(max_subscriptions_per_client=2)) as node:
        raw = raws(node.mqtt_port, level)
        raw.connect("subs")
        assert subscribe(raw, 1, "a", "b/+", "c", qos=1) == (1, 1, quota)
        assert subscribe(raw, 2, "a", qos=0) == (0,)  # replacing one is not a new one
        assert subscribe(raw, 3, "d") == (quota,)
        assert subscribe(raw, 4, "$share/g/e") == (quota,)  # shared ones count too
        # Only the granted filters deliver.
        pub = Client(node.mqtt_port, "subs-pub")
        for topic in ("c", "d", "e", "a", "b/x"):
            pub.publish(topic, topic.encode(), 1)
        got = [raw.recv(), raw.recv()]
        assert sorted(p.topic for p in got if isinstance(p, Publish)) == ["a", "b/x"]
        for packet in got:
            if isinstance(packet, Publish) and packet.packet_id is not None:
                raw.send(Puback(packet.packet_id))
        raw.send(Pingreq())
        assert raw.recv() == Pingresp()
        # Unsubscribing makes room again.
        raw.send(Unsubscribe(5, ("a",)))
        raw.recv()
        assert subscribe(raw, 6, "d") == (0,)


# -- topic size -----------------------------------------------------------------------------------


@pytest.fixture
def topic_limits_node() -> Iterator[RunningNode]:
    with running_node(node_settings(max_topic_levels=3, max_topic_length=32)) as running:
        yield running


@pytest.mark.parametrize("topic", ["a/b/c/d", "a/b/c/", "/a/b/c", "x" * 33, "é" * 17])
@pytest.mark.parametrize("level", [4, 5])
def test_publish_topic_over_limits(
    topic_limits_node: RunningNode, raws: Callable[..., RawClient], topic: str, level: int
) -> None:
    node = topic_limits_node
    sub = Client(node.mqtt_port, "watch")
    sub.subscribe("#", 0)
    raw = raws(node.mqtt_port, level)
    raw.connect("long")
    raw.send(Publish("a/b/c", b"ok", 1, packet_id=1))  # three levels are fine
    ack = raw.recv()
    assert isinstance(ack, Puback) and ack.packet_id == 1
    raw.send(Publish(topic, b"too long", 1, packet_id=2))
    closed_with(raw, 0x90 if level == 5 else None)
    [msg] = sub.expect(1)
    assert msg.topic == "a/b/c"
    sub.expect_none(0.2)
    sub.disconnect()


@pytest.mark.parametrize("level", [4, 5])
def test_subscribe_filter_over_limits(
    topic_limits_node: RunningNode, raws: Callable[..., RawClient], level: int
) -> None:
    raw = raws(topic_limits_node.mqtt_port, level)
    raw.connect("long-filter")
    invalid = 0x8F if level == 5 else 0x80
    filters = (
        "a/b/c",  # at the limit
        "a/b/c/d",
        "a/+/+/#",
        "+/+/+",
        "a/b/#",
        "x" * 33,
        "$share/g/a/b/c",  # the level limit applies to the shared filter's inner filter
        "$share/g/a/b/c/d",
    )
    assert subscribe(raw, 1, *filters, qos=1) == (1, invalid, invalid, 1, 1, invalid, 1, invalid)


@pytest.mark.parametrize("level", [4, 5])
def test_invalid_filters(node: RunningNode, raws: Callable[..., RawClient], level: int) -> None:
    raw = raws(node.mqtt_port, level)
    raw.connect("filters")
    invalid = 0x8F if level == 5 else 0x80
    filters = (
        "a/#/b",
        "a+",
        "a/b#",
        "#/a",
        "+a/b",
        "a/+b",
        "ok/+/#",
        "$share/g",
        "$share//t",
        "$share/g+/t",
        "$share/g/a/#/b",
    )
    expected = (invalid,) * 6 + (1,) + (invalid,) * 4
    assert subscribe(raw, 1, *filters, qos=1) == expected
    # The connection stays usable.
    raw.send(Pingreq())
    assert raw.recv() == Pingresp()


# -- the client's Receive Maximum -----------------------------------------------------------------


def test_client_receive_maximum_bounds_inflight(
    node: RunningNode, raws: Callable[..., RawClient]
) -> None:
    raw = raws(node.mqtt_port)
    raw.connect("narrow", properties=Properties(receive_maximum=2))
    assert subscribe(raw, 1, "rm", qos=1) == (1,)
    pub = Client(node.mqtt_port, "rm-pub")
    for index in range(6):
        pub.publish("rm", str(index).encode(), 1)
    first = [raw.recv(), raw.recv()]
    with pytest.raises(AssertionError, match="no packet in time"):
        raw.recv(0.5)  # a third one would exceed the client's Receive Maximum
    got = []
    pending = first
    while pending:
        packet = pending.pop(0)
        assert isinstance(packet, Publish) and packet.packet_id is not None, packet
        got.append(packet.payload)
        raw.send(Puback(packet.packet_id))  # each ack lets exactly one more through
        if len(got) + len(pending) < 6:
            pending.append(raw.recv())
            assert len(pending) <= 2
    assert got == [str(i).encode() for i in range(6)]
    with pytest.raises(AssertionError, match="no packet in time"):
        raw.recv(0.3)


@pytest.mark.merged_only(
    reason="a proxy cannot bound what the broker keeps for a subscription (max_queued_messages)"
)
def test_offline_queue_is_bounded(raws: Callable[..., RawClient]) -> None:
    with running_node(node_settings(max_queued_messages=10)) as node:
        session = Properties(session_expiry_interval=300)
        raw = raws(node.mqtt_port)
        raw.connect("offline", clean_start=False, properties=session)
        assert subscribe(raw, 1, "q", qos=1) == (1,)
        raw.close()
        pub = Client(node.mqtt_port, "q-pub")
        for index in range(50):
            pub.publish("q", str(index).encode(), 1)
        back = raws(node.mqtt_port)
        assert back.connect("offline", clean_start=False, properties=session).session_present
        got: list[bytes] = []
        while True:
            try:
                packet = back.recv(1.0)
            except AssertionError:
                break
            assert isinstance(packet, Publish) and packet.packet_id is not None, packet
            got.append(packet.payload)
            back.send(Puback(packet.packet_id))
        assert 1 <= len(got) <= 10, got
        numbers = [int(p) for p in got]
        assert numbers == sorted(numbers)


# -- slow subscribers -----------------------------------------------------------------------------

FLOOD_MESSAGES = 20_480
FLOOD_WINDOW = 256
FLOOD_TIME_LIMIT = 90.0


def _flood_payload(index: int) -> bytes:
    return b"%08d" % index + b"x" * 1016  # 1 KiB


@pytest.mark.parametrize("qos", [0, 1])
def test_slow_subscriber_does_not_stall_others(
    node: RunningNode, raws: Callable[..., RawClient], qos: int
) -> None:
    """A subscriber that never reads its socket: the publisher and a fast subscriber go on at
    full speed, and the broker drops for the slow one instead of buffering 20 MB for it."""
    slow = raws(node.mqtt_port)
    slow.connect("slow")
    assert subscribe(slow, 1, "flood/#", qos=qos) == (qos,)
    fast = Client(node.mqtt_port, "fast")
    assert fast.subscribe("flood/#", qos) == [qos]
    publisher = raws(node.mqtt_port)
    publisher.connect("flooder")

    start = time.monotonic()
    received: list[bytes] = []
    next_id = 1
    for first in range(0, FLOOD_MESSAGES, FLOOD_WINDOW):
        batch = []
        for index in range(first, min(first + FLOOD_WINDOW, FLOOD_MESSAGES)):
            packet_id = None
            if qos:
                packet_id, next_id = next_id, next_id % 65535 + 1
            batch.append(Publish("flood/data", _flood_payload(index), qos, packet_id=packet_id))
        publisher.send_bytes(b"".join(encode(p, 5) for p in batch) + encode(Pingreq(), 5))
        # The PINGRESP comes after everything before it was handled (and acknowledged).
        acks = 0
        while True:
            remaining = FLOOD_TIME_LIMIT - (time.monotonic() - start)
            assert remaining > 0, "the publisher was held up"
            packet = publisher.recv(remaining)
            if isinstance(packet, Pingresp):
                break
            assert isinstance(packet, Puback) and packet.reason_code == 0, packet
            acks += 1
        assert acks == (len(batch) if qos else 0)
        # The fast subscriber keeps up with every window.
        while len(received) < first + len(batch):
            remaining = FLOOD_TIME_LIMIT - (time.monotonic() - start)
            assert remaining > 0, f"the fast subscriber got only {len(received)} messages"
            received.extend(m.payload for m in fast.expect(1, timeout=remaining))
    elapsed = time.monotonic() - start
    assert elapsed < FLOOD_TIME_LIMIT
    assert received == [_flood_payload(i) for i in range(FLOOD_MESSAGES)]
    fast.expect_none(0.2)

    # The slow subscriber was not disconnected for being slow, and what reaches it now is a
    # bounded remainder in publish order, not the whole 20 MiB flood.
    # Then, once it reads again, it gets new messages after that remainder.
    slow_got: list[int] = []
    drain_deadline = time.monotonic() + 60
    sentinel_sent = False
    while not slow_got or slow_got[-1] != FLOOD_MESSAGES:
        assert time.monotonic() < drain_deadline, f"the slow subscriber got {len(slow_got)}"
        try:
            packet = slow.recv(2.0)
        except AssertionError:
            assert not sentinel_sent, "the message published after the flood never arrived"
            publisher.send(
                Publish(
                    "flood/data",
                    _flood_payload(FLOOD_MESSAGES),
                    qos,
                    packet_id=next_id if qos else None,
                )
            )
            sentinel_sent = True
            continue
        assert packet is not None, "the slow subscriber was disconnected"
        assert isinstance(packet, Publish), packet
        slow_got.append(int(packet.payload[:8]))
        if packet.packet_id is not None:
            slow.send(Puback(packet.packet_id))
    assert sentinel_sent
    assert slow_got == sorted(set(slow_got)), "out of order or duplicated"
    assert len(slow_got) < FLOOD_MESSAGES // 2, len(slow_got)
    fast.disconnect()


def test_connack_announces_limits(node: RunningNode, raws: Callable[..., RawClient]) -> None:
    """A v5 CONNACK announces the limits a client must respect."""
    raw = raws(node.mqtt_port)
    connack = raw.connect("announce")
    assert isinstance(connack, Connack)
    assert connack.properties.receive_maximum == 32
    assert connack.properties.maximum_packet_size == 1_048_576
    assert connack.properties.topic_alias_maximum == 10
