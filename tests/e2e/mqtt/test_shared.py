"""Shared subscriptions (`$share/{group}/{filter}`) end to end: each message goes to one member of
each group, unacknowledged messages of a member that leaves go to the others, and groups and
ordinary subscribers do not take messages from each other."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from paho.mqtt.packettypes import PacketTypes

from mop.protocols.mqtt.packets import (
    Disconnect,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Publish,
    Suback,
    Subscribe,
    SubscriptionRequest,
)
from mop.testing.node import RunningNode
from tests.e2e.clients import Client, Received, props
from tests.e2e.raw import RawClient

pytestmark = [pytest.mark.e2e, pytest.mark.both_modes]


def drain(clients: list[Client], total: int, timeout: float = 10.0) -> list[list[Received]]:
    """Collect messages from all `clients` until `total` arrived together (then a short quiet
    period to catch duplicates)."""
    got: list[list[Received]] = [[] for _ in clients]
    deadline = time.monotonic() + timeout
    while sum(map(len, got)) < total:
        assert time.monotonic() < deadline, f"got {[len(g) for g in got]} of {total}"
        for index, client in enumerate(clients):
            while not client.messages.empty():
                got[index].append(client.messages.get_nowait())
        time.sleep(0.01)
    time.sleep(0.3)
    for index, client in enumerate(clients):
        while not client.messages.empty():
            got[index].append(client.messages.get_nowait())
    return got


def payloads(messages: list[Received]) -> list[bytes]:
    return [m.payload for m in messages]


@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize("members", [2, 3])
def test_messages_are_spread_over_the_members(
    node: RunningNode, qos: int, members: int, mode: str
) -> None:
    pub = Client(node.mqtt_port, "pub")
    # The topics exist before the members subscribe (nobody receives these), so that every
    # member takes part from the first message (a proxy finds new topics by polling).
    for index in range(3):
        pub.publish(f"t/{index}", b"before", 1)
    group = [Client(node.mqtt_port, f"member-{i}") for i in range(members)]
    for member in group:
        assert member.subscribe("$share/g/t/#", qos) == [qos]
    # Through a proxy each member is a Pulsar consumer that starts taking part a moment after
    # its SUBACK (the first burst may miss a member entirely, measured 0-9 of 90); the second
    # burst shows how the settled group shares. Every burst goes to exactly one member each.
    bursts = 1 if mode == "merged" else 2
    for burst in range(bursts):
        sent = [f"{burst}{i:03}".encode() for i in range(30 * members)]
        for index, payload in enumerate(sent):
            pub.publish(f"t/{index % 3}", payload, qos)
        got = drain(group, len(sent))
        everything = [p for member in got for p in payloads(member)]
        assert sorted(everything) == sorted(sent), "each message goes to exactly one member"
    for member in got:
        # Every member gets a fair part (merged: round robin; a Pulsar broker dispatches by
        # the members' free permits, which is rougher: measured 19-47 of 90), each topic in
        # order.
        fair = len(sent) // members // (2 if mode == "merged" else 3)
        assert len(member) >= fair, [len(m) for m in got]
        for topic in ("t/0", "t/1", "t/2"):
            numbers = [int(m.payload) for m in member if m.topic == topic]
            assert numbers == sorted(numbers)
        assert all(m.topic.startswith("t/") and m.qos == qos for m in member)


def test_v311_members(node: RunningNode) -> None:
    pub = Client(node.mqtt_port, "pub", version=4)
    pub.publish("v3/x", b"before", 1)  # the topic exists before the members come
    group = [Client(node.mqtt_port, f"old-{i}", version=4) for i in range(2)]
    for member in group:
        assert member.subscribe("$share/legacy/v3/+", 1) == [1]
    sent = [str(i).encode() for i in range(20)]
    for payload in sent:
        pub.publish("v3/x", payload, 1)
    got = drain(group, len(sent))
    assert sorted(p for member in got for p in payloads(member)) == sorted(sent)
    assert all(member for member in got)


def test_two_groups_and_a_plain_subscriber_each_get_everything(node: RunningNode) -> None:
    pub = Client(node.mqtt_port, "pub")
    pub.publish("s/x", b"before", 1)  # the topic exists before the members come
    first = [Client(node.mqtt_port, f"a-{i}") for i in range(2)]
    second = [Client(node.mqtt_port, f"b-{i}") for i in range(3)]
    for member in first:
        member.subscribe("$share/a/s/#", 1)
    for member in second:
        member.subscribe("$share/b/s/+", 1)
    plain = Client(node.mqtt_port, "plain")
    plain.subscribe("s/#", 1)
    sent = [str(i).encode() for i in range(24)]
    for payload in sent:
        pub.publish("s/x", payload, 1)
    for group in (first, second):
        got = drain(group, len(sent))
        assert sorted(p for member in got for p in payloads(member)) == sorted(sent)
        assert all(member for member in got)
    assert payloads(plain.expect(len(sent))) == sent
    plain.expect_none()


def test_one_client_in_a_group_and_subscribed_plainly(node: RunningNode) -> None:
    both = Client(node.mqtt_port, "both")
    both.subscribe("$share/g/d", 1)
    both.subscribe("d", 1)
    other = Client(node.mqtt_port, "other")
    other.subscribe("$share/g/d", 1)
    pub = Client(node.mqtt_port, "pub")
    sent = [str(i).encode() for i in range(20)]
    for payload in sent:
        pub.publish("d", payload, 1)
    got = drain([both, other], len(sent) * 2)
    # `both` gets every message through its plain subscription, plus its share of the group.
    from_group = len(got[0]) - len(sent)
    assert from_group + len(got[1]) == len(sent)
    assert from_group > 0 and got[1]
    assert sorted(payloads(got[0]) + payloads(got[1])) == sorted(sent * 2)


@pytest.mark.parametrize("session_expiry", [0, 300])
def test_unacknowledged_messages_of_a_leaving_member_go_to_the_others(
    node: RunningNode, raws: Callable[..., RawClient], session_expiry: int
) -> None:
    leaver = raws(node.mqtt_port)
    leaver.connect(
        "leaver", clean_start=True, properties=Properties(session_expiry_interval=session_expiry)
    )
    leaver.send(Subscribe(1, (SubscriptionRequest("$share/work/jobs", 1),)))
    assert leaver.recv() == Suback(1, (1,))
    stayer = Client(node.mqtt_port, "stayer")
    stayer.subscribe("$share/work/jobs", 1)
    pub = Client(node.mqtt_port, "pub")
    sent = [str(i).encode() for i in range(20)]
    for payload in sent:
        pub.publish("jobs", payload, 1)
    # The leaver takes its share and never acknowledges it.
    taken: list[bytes] = []
    while True:
        try:
            packet = leaver.recv(0.5)
        except AssertionError:
            break
        assert isinstance(packet, Publish) and packet.qos == 1, packet
        taken.append(packet.payload)
    assert taken, "round robin gave the leaver nothing"
    before = drain([stayer], len(sent) - len(taken))[0]
    assert sorted(payloads(before) + taken) == sorted(sent)
    leaver.close()
    # Everything the leaver held comes to the remaining member, once.
    redelivered = drain([stayer], len(taken))[0]
    assert sorted(payloads(redelivered)) == sorted(taken)
    assert sorted(payloads(before + redelivered)) == sorted(sent)


def test_member_that_acknowledged_keeps_nothing_back(
    node: RunningNode, raws: Callable[..., RawClient]
) -> None:
    """Acknowledged messages are not delivered again when their member leaves."""
    member = raws(node.mqtt_port)
    member.connect("acker")
    member.send(Subscribe(1, (SubscriptionRequest("$share/work/done", 1),)))
    member.recv()
    other = Client(node.mqtt_port, "other")
    other.subscribe("$share/work/done", 1)
    pub = Client(node.mqtt_port, "pub")
    for index in range(10):
        pub.publish("done", str(index).encode(), 1)
    acked = 0
    while True:
        try:
            packet = member.recv(0.5)
        except AssertionError:
            break
        assert isinstance(packet, Publish) and packet.packet_id is not None
        member.send(Puback(packet.packet_id))
        acked += 1
    member.send(Pingreq())
    assert member.recv() == Pingresp()  # the acks were read before the close
    member.close()
    got = drain([other], 10 - acked)[0]
    assert len(got) == 10 - acked
    other.expect_none(0.5)


def test_unsubscribed_member_gets_no_more(node: RunningNode) -> None:
    one = Client(node.mqtt_port, "one")
    two = Client(node.mqtt_port, "two")
    for member in (one, two):
        member.subscribe("$share/g/u", 1)
    assert one.unsubscribe("$share/g/u") == [0]
    pub = Client(node.mqtt_port, "pub")
    for index in range(10):
        pub.publish("u", str(index).encode(), 1)
    assert len(two.expect(10)) == 10
    one.expect_none()


def test_retained_messages_are_not_sent_to_shared_subscriptions(node: RunningNode) -> None:
    pub = Client(node.mqtt_port, "pub")
    pub.publish("r/state", b"on", 1, retain=True)
    member = Client(node.mqtt_port, "member")
    member.subscribe("$share/g/r/#", 1)
    plain = Client(node.mqtt_port, "plain")
    plain.subscribe("r/#", 1)
    [retained] = plain.expect(1)
    assert retained.retain and retained.payload == b"on"
    member.expect_none()
    pub.publish("r/state", b"off", 1)
    [live] = member.expect(1)
    assert live.payload == b"off"
    pub.publish("r/state", b"", 1, retain=True)


def test_no_local_on_a_shared_subscription_is_a_protocol_error(
    node: RunningNode, raws: Callable[..., RawClient]
) -> None:
    raw = raws(node.mqtt_port)
    raw.connect("nolocal")
    raw.send(Subscribe(1, (SubscriptionRequest("$share/g/x", 1, no_local=True),)))
    packets = raw.recv_until_closed()
    assert len(packets) == 1 and isinstance(packets[0], Disconnect), packets
    assert packets[0].reason_code == 0x82


def test_shared_subscription_survives_member_reconnect(node: RunningNode) -> None:
    """A durable member keeps its place while offline; messages meanwhile go to the others."""
    session = props(PacketTypes.CONNECT, SessionExpiryInterval=300)
    durable = Client(node.mqtt_port, "durable", clean=False, connect_properties=session)
    durable.subscribe("$share/g/p", 1)
    other = Client(node.mqtt_port, "other")
    other.subscribe("$share/g/p", 1)
    durable.disconnect()
    pub = Client(node.mqtt_port, "pub")
    for index in range(6):
        pub.publish("p", str(index).encode(), 1)
    assert len(other.expect(6)) == 6
    back = Client(node.mqtt_port, "durable", clean=False, connect_properties=session)
    assert back.connack is not None and back.connack.session_present
    back.expect_none(0.3)
    for index in range(6, 26):
        pub.publish("p", str(index).encode(), 1)
    got = drain([back, other], 20)
    assert got[0] and got[1], [len(g) for g in got]
