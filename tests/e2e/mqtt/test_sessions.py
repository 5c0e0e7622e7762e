"""MQTT sessions end to end: what outlives a connection (subscriptions, queued messages, QoS 1/2
state), how long (expiry), the bound on offline queues, and client takeover."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from paho.mqtt.packettypes import PacketTypes

from mop.protocols.mqtt.packets import (
    Connack,
    Disconnect,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    SubscriptionRequest,
)
from mop.testing.node import RunningNode, node_settings, running_node
from tests.e2e.clients import Client, props
from tests.e2e.raw import RawClient, assert_quiet, recv_publish

pytestmark = [pytest.mark.e2e, pytest.mark.both_modes]

SESSION_TAKEN_OVER = 0x8E
PACKET_IDENTIFIER_NOT_FOUND = 0x92


# -- helpers ---------------------------------------------------------------------------------


def persistent(port: int, client_id: str, *, version: int = 5, expiry: int = 60) -> Client:
    """A client resuming (or starting) a session that outlives its connection."""
    if version == 5:
        return Client(
            port,
            client_id,
            version=5,
            clean=False,
            connect_properties=props(PacketTypes.CONNECT, SessionExpiryInterval=expiry),
        )
    return Client(port, client_id, version=version, clean=False)


RawFactory = Callable[..., tuple[RawClient, Connack]]


@pytest.fixture
def raw(node: RunningNode) -> Iterator[RawFactory]:
    """Open RawClients on the node with a persistent session; all are closed at the end."""
    opened: list[RawClient] = []

    def connect(client_id: str, level: int = 5, **fields: object) -> tuple[RawClient, Connack]:
        client = RawClient(node.mqtt_port, level=level)
        opened.append(client)
        fields.setdefault("clean_start", False)
        if level == 5:
            fields.setdefault("properties", Properties(session_expiry_interval=60))
        connack = client.connect(client_id, **fields)
        assert connack.reason_code == 0, connack
        return client, connack

    yield connect
    for client in opened:
        client.close()


def subscribe(client: RawClient, topic_filter: str, qos: int, packet_id: int = 1) -> None:
    client.send(Subscribe(packet_id, (SubscriptionRequest(topic_filter, qos),)))
    suback = client.recv()
    assert isinstance(suback, Suback) and suback.packet_id == packet_id, suback
    assert suback.reason_codes == (qos,)


# -- session present, clean start, resumed subscriptions -------------------------------------


@pytest.mark.parametrize("version", [4, 5])
def test_session_present_only_when_a_session_is_resumed(node: RunningNode, version: int) -> None:
    first = persistent(node.mqtt_port, f"sp-{version}", version=version)
    assert first.connack is not None and first.connack.session_present is False
    first.disconnect()
    again = persistent(node.mqtt_port, f"sp-{version}", version=version)
    assert again.connack is not None and again.connack.session_present is True
    again.disconnect()
    clean = Client(node.mqtt_port, f"sp-{version}", version=version, clean=True)
    assert clean.connack is not None and clean.connack.session_present is False


@pytest.mark.parametrize("version", [4, 5])
def test_clean_start_discards_the_old_session(node: RunningNode, version: int) -> None:
    sub = persistent(node.mqtt_port, f"cs-{version}", version=version)
    sub.subscribe("cs/t", 1)
    sub.disconnect()
    pub = Client(node.mqtt_port, f"cs-pub-{version}", version=version)
    pub.publish("cs/t", b"queued for the old session", 1)
    clean = Client(node.mqtt_port, f"cs-{version}", version=version, clean=True)
    assert clean.connack is not None and clean.connack.session_present is False
    clean.expect_none(0.5)  # the queued message went with the old session
    pub.publish("cs/t", b"after", 1)
    clean.expect_none(0.3)  # and so did its subscription
    clean.disconnect()
    resumed = persistent(node.mqtt_port, f"cs-{version}", version=version)
    assert resumed.connack is not None and resumed.connack.session_present is False


@pytest.mark.parametrize(
    ("level", "ending"),
    [
        (4, "clean-start"),
        (5, "clean-start"),
        (4, "takeover-by-clean-start"),
        (5, "takeover-by-clean-start"),
        (5, "expiry"),  # a 3.1.1 session expires after `mqtt.default_session_expiry` only
    ],
)
def test_an_ended_session_leaves_no_unacknowledged_message_behind(
    node: RunningNode, level: int, ending: str
) -> None:
    """[MQTT-3.1.2-6] (3.1.1), [MQTT-3.1.2-4] (5.0): when a session ends, all its state goes,
    its unacknowledged messages too; a new session of the same client id subscribing to the
    same topic gets only what is published after."""
    client_id = f"iso-{level}-{ending}"
    expiry = 1 if ending == "expiry" else 60
    first = RawClient(node.mqtt_port, level=level)
    fields: dict[str, object] = {"clean_start": False}
    if level == 5:
        fields["properties"] = Properties(session_expiry_interval=expiry)
    assert not first.connect(client_id, **fields).session_present
    subscribe(first, "iso/t", 1)
    Client(node.mqtt_port, f"{client_id}-pub").publish("iso/t", b"old", 1)
    assert recv_publish(first).payload == b"old"  # and no PUBACK
    if ending == "expiry":
        first.close()
        time.sleep(expiry + 0.5)
    else:
        if ending == "clean-start":
            first.close()
        clean = RawClient(node.mqtt_port, level=level)
        assert not clean.connect(client_id, clean_start=True).session_present
        clean.close()
        first.close()
    again = RawClient(node.mqtt_port, level=level)
    if level == 5:
        fields["properties"] = Properties(session_expiry_interval=60)
    assert not again.connect(client_id, **fields).session_present
    subscribe(again, "iso/t", 1)
    assert_quiet(again)
    Client(node.mqtt_port, f"{client_id}-pub").publish("iso/t", b"new", 1)
    assert recv_publish(again).payload == b"new"
    again.close()


@pytest.mark.parametrize("version", [4, 5])
def test_subscriptions_survive_a_reconnect(node: RunningNode, version: int) -> None:
    sub = persistent(node.mqtt_port, f"sv-{version}", version=version)
    assert sub.subscribe("sv/+/x", 1) == [1]
    sub.disconnect()
    sub = persistent(node.mqtt_port, f"sv-{version}", version=version)
    assert sub.connack is not None and sub.connack.session_present
    Client(node.mqtt_port, f"sv-pub-{version}", version=version).publish("sv/a/x", b"hi", 2)
    [msg] = sub.expect(1)
    assert (msg.topic, msg.payload, msg.qos) == ("sv/a/x", b"hi", 1)


# -- messages for offline sessions -----------------------------------------------------------


@pytest.mark.parametrize("version", [4, 5])
@pytest.mark.parametrize("qos", [1, 2])
def test_offline_messages_are_delivered_in_order_on_reconnect(
    node: RunningNode, version: int, qos: int
) -> None:
    sub = persistent(node.mqtt_port, f"off-{version}-{qos}", version=version)
    sub.subscribe("off/t", 2)
    sub.disconnect()
    pub = Client(node.mqtt_port, f"off-pub-{version}-{qos}", version=version)
    payloads = [f"m{i}".encode() for i in range(10)]
    for payload in payloads:
        pub.publish("off/t", payload, qos)
    sub = persistent(node.mqtt_port, f"off-{version}-{qos}", version=version)
    assert sub.connack is not None and sub.connack.session_present
    got = sub.expect(len(payloads))
    assert [(m.payload, m.qos) for m in got] == [(p, qos) for p in payloads]
    sub.expect_none()


def test_offline_messages_of_mixed_qos_keep_their_order(raw: RawFactory, node: RunningNode) -> None:
    sub, _ = raw("mixed")
    subscribe(sub, "mixed/t", 2)
    sub.close()
    pub = Client(node.mqtt_port, "mixed-pub")
    sent = [(b"a", 1), (b"b", 2), (b"c", 0), (b"d", 2), (b"e", 1)]
    for payload, qos in sent:
        pub.publish("mixed/t", payload, qos)
    pub.publish("barrier", b"", 1)  # every publish above is processed once this is acknowledged
    sub, connack = raw("mixed")
    assert connack.session_present
    got: list[tuple[bytes, int]] = []
    releases = 0
    while len(got) < len(sent) or releases < 2:  # acknowledging as a client does
        packet = sub.recv()
        if isinstance(packet, Pubrel):
            releases += 1
            sub.send(Pubcomp(packet.packet_id))
            continue
        assert isinstance(packet, Publish), packet
        got.append((packet.payload, packet.qos))
        if packet.qos == 1:
            assert packet.packet_id is not None
            sub.send(Puback(packet.packet_id))
        elif packet.qos == 2:
            assert packet.packet_id is not None
            sub.send(Pubrec(packet.packet_id))
    assert got == sent
    assert_quiet(sub)


@pytest.mark.parametrize("version", [4, 5])
def test_qos0_messages_are_queued_for_offline_sessions(node: RunningNode, version: int) -> None:
    sub = persistent(node.mqtt_port, f"q0-{version}", version=version)
    sub.subscribe("q0/t", 1)
    sub.disconnect()
    pub = Client(node.mqtt_port, f"q0-pub-{version}", version=version)
    pub.publish("q0/t", b"a", 0)
    pub.publish("q0/t", b"b", 0)
    pub.publish("q0/t", b"c", 1)
    sub = persistent(node.mqtt_port, f"q0-{version}", version=version)
    got = sub.expect(3)
    assert [(m.payload, m.qos) for m in got] == [(b"a", 0), (b"b", 0), (b"c", 1)]


@pytest.mark.merged_only(
    reason="a proxy cannot bound what the broker keeps for a subscription (max_queued_messages)"
)
@pytest.mark.parametrize("version", [4, 5])
def test_offline_queue_is_bounded_and_drops_qos0_first(version: int) -> None:
    with running_node(node_settings(max_queued_messages=4)) as node:
        sub = persistent(node.mqtt_port, f"bound-{version}", version=version)
        sub.subscribe("bound/t", 2)
        sub.disconnect()
        pub = Client(node.mqtt_port, f"bound-pub-{version}", version=version)
        # With room for 4: b0 a1 c1 d0 fill it; e1 evicts b0 (the oldest qos 0), f1 evicts d0,
        # and g1 finds no qos 0 message left to evict, so g1 itself is dropped.
        for payload, qos in [
            (b"b", 0),
            (b"a", 1),
            (b"c", 1),
            (b"d", 0),
            (b"e", 1),
            (b"f", 1),
            (b"g", 1),
        ]:
            pub.publish("bound/t", payload, qos)
        sub = persistent(node.mqtt_port, f"bound-{version}", version=version)
        got = sub.expect(4)
        assert [(m.payload, m.qos) for m in got] == [(b"a", 1), (b"c", 1), (b"e", 1), (b"f", 1)]
        sub.expect_none(0.5)


@pytest.mark.merged_only(
    reason="a proxy cannot bound what the broker keeps for a subscription (max_queued_messages)"
)
@pytest.mark.parametrize("version", [4, 5])
def test_offline_queue_bound_keeps_the_newest_qos0_messages(version: int) -> None:
    with running_node(node_settings(max_queued_messages=3)) as node:
        sub = persistent(node.mqtt_port, f"bound0-{version}", version=version)
        sub.subscribe("bound0/t", 1)
        sub.disconnect()
        pub = Client(node.mqtt_port, f"bound0-pub-{version}", version=version)
        for i in range(8):
            pub.publish("bound0/t", f"{i}".encode(), 0)
        pub.publish("barrier", b"", 1)
        sub = persistent(node.mqtt_port, f"bound0-{version}", version=version)
        got = sub.expect(3)
        assert [m.payload for m in got] == [b"5", b"6", b"7"]
        sub.expect_none(0.5)


# -- session expiry --------------------------------------------------------------------------


def test_v5_session_expires_after_its_interval(node: RunningNode) -> None:
    short = persistent(node.mqtt_port, "exp-short", expiry=1)
    short.subscribe("exp/t", 1)
    short.disconnect()
    long = persistent(node.mqtt_port, "exp-long", expiry=60)
    long.subscribe("exp/t", 1)
    long.disconnect()
    Client(node.mqtt_port, "exp-pub").publish("exp/t", b"while offline", 1)
    time.sleep(1.5)
    short = persistent(node.mqtt_port, "exp-short", expiry=60)
    assert short.connack is not None and short.connack.session_present is False
    short.expect_none(0.5)
    long = persistent(node.mqtt_port, "exp-long", expiry=60)
    assert long.connack is not None and long.connack.session_present is True
    [msg] = long.expect(1)
    assert msg.payload == b"while offline"


def test_v311_persistent_session_expires_after_the_default_expiry() -> None:
    with running_node(node_settings(default_session_expiry=1)) as node:
        sub = persistent(node.mqtt_port, "exp311", version=4)
        sub.subscribe("exp311/t", 1)
        sub.disconnect()
        Client(node.mqtt_port, "exp311-pub", version=4).publish("exp311/t", b"x", 1)
        time.sleep(1.5)
        sub = persistent(node.mqtt_port, "exp311", version=4)
        assert sub.connack is not None and sub.connack.session_present is False
        sub.expect_none(0.5)


@pytest.mark.parametrize(
    ("connect_expiry", "disconnect_expiry", "offline", "present"),
    [
        pytest.param(60, 0, 0.0, False, id="zero-ends-the-session"),
        pytest.param(60, 1, 1.5, False, id="shorter"),
        pytest.param(1, 60, 1.5, True, id="longer"),
        pytest.param(0, 30, 0.0, False, id="not-after-zero"),
    ],
)
def test_v5_disconnect_sets_a_new_session_expiry(
    node: RunningNode, connect_expiry: int, disconnect_expiry: int, offline: float, present: bool
) -> None:
    client_id = f"dx-{connect_expiry}-{disconnect_expiry}"
    sub = persistent(node.mqtt_port, client_id, expiry=connect_expiry)
    sub.subscribe("dx/t", 1)
    sub.disconnect(
        properties=props(PacketTypes.DISCONNECT, SessionExpiryInterval=disconnect_expiry)
    )
    Client(node.mqtt_port, f"{client_id}-pub").publish("dx/t", b"queued?", 1)
    time.sleep(offline)
    sub = persistent(node.mqtt_port, client_id, expiry=60)
    assert sub.connack is not None and sub.connack.session_present is present
    if present:
        [msg] = sub.expect(1)
        assert msg.payload == b"queued?"
    else:
        sub.expect_none(0.5)


# -- takeover --------------------------------------------------------------------------------


def test_v5_takeover_sends_session_taken_over_and_the_session_continues(node: RunningNode) -> None:
    first = persistent(node.mqtt_port, "twin")
    first.subscribe("twin/t", 1)
    second = persistent(node.mqtt_port, "twin")
    assert second.connack is not None and second.connack.session_present is True
    assert first.disconnects.get(timeout=5) == SESSION_TAKEN_OVER
    Client(node.mqtt_port, "twin-pub").publish("twin/t", b"to the new one", 1)
    [msg] = second.expect(1)
    assert msg.payload == b"to the new one"
    first.expect_none(0.3)


def test_v5_takeover_on_the_wire(raw: RawFactory) -> None:
    first, _ = raw("twin-raw")
    second, connack = raw("twin-raw")
    assert connack.session_present
    packets = first.recv_until_closed(timeout=5)
    assert packets == [Disconnect(reason_code=SESSION_TAKEN_OVER)]
    second.send(Subscribe(1, (SubscriptionRequest("x", 0),)))
    assert isinstance(second.recv(), Suback)  # the new connection is fully served


def test_v311_takeover_closes_the_first_connection(node: RunningNode) -> None:
    first = persistent(node.mqtt_port, "twin311", version=4)
    first.subscribe("twin311/t", 1)
    second = persistent(node.mqtt_port, "twin311", version=4)
    assert second.connack is not None and second.connack.session_present is True
    first.disconnects.get(timeout=5)  # the server closed the first connection
    Client(node.mqtt_port, "twin311-pub", version=4).publish("twin311/t", b"x", 1)
    [msg] = second.expect(1)
    assert msg.payload == b"x"
    first.expect_none(0.3)


def test_takeover_with_clean_start_gets_a_new_session(node: RunningNode) -> None:
    first = persistent(node.mqtt_port, "twin-clean")
    first.subscribe("twin-clean/t", 1)
    second = Client(node.mqtt_port, "twin-clean", clean=True)
    assert second.connack is not None and second.connack.session_present is False
    assert first.disconnects.get(timeout=5) == SESSION_TAKEN_OVER
    Client(node.mqtt_port, "twin-clean-pub").publish("twin-clean/t", b"x", 1)
    second.expect_none(0.5)


# -- QoS 1 and 2 state across reconnects -----------------------------------------------------


@pytest.mark.parametrize("level", [4, 5])
def test_unacknowledged_qos1_is_resent_with_dup_and_the_same_packet_id(
    raw: RawFactory, node: RunningNode, level: int
) -> None:
    sub, _ = raw(f"redo-{level}", level)
    subscribe(sub, "redo/t", 1)
    Client(node.mqtt_port, f"redo-pub-{level}").publish("redo/t", b"ack me", 1)
    first = recv_publish(sub)
    assert (first.payload, first.qos, first.dup) == (b"ack me", 1, False)
    sub.close()  # without PUBACK

    sub, connack = raw(f"redo-{level}", level)
    assert connack.session_present
    again = recv_publish(sub)
    assert (again.payload, again.qos, again.dup) == (b"ack me", 1, True)
    assert again.packet_id == first.packet_id
    assert again.packet_id is not None
    sub.send(Puback(again.packet_id))
    assert_quiet(sub)
    sub.close()

    sub, connack = raw(f"redo-{level}", level)  # acknowledged: never sent again
    assert connack.session_present
    assert_quiet(sub)


@pytest.mark.parametrize("level", [4, 5])
def test_inbound_qos2_is_delivered_exactly_once_across_a_reconnect(
    raw: RawFactory, node: RunningNode, level: int
) -> None:
    sub = Client(node.mqtt_port, f"in2-sub-{level}")
    sub.subscribe("in2/t", 2)
    pub, _ = raw(f"in2-{level}", level)
    pub.send(Publish("in2/t", b"once", qos=2, packet_id=7))
    assert pub.recv() == Pubrec(7)
    [msg] = sub.expect(1)
    assert msg.payload == b"once"
    pub.close()  # before PUBREL

    pub, connack = raw(f"in2-{level}", level)
    assert connack.session_present
    pub.send(Publish("in2/t", b"once", qos=2, dup=True, packet_id=7))
    assert pub.recv() == Pubrec(7)
    sub.expect_none(0.5)
    pub.send(Pubrel(7))
    assert pub.recv() == Pubcomp(7)
    if level == 5:  # the packet id is released: a second PUBREL finds nothing
        pub.send(Pubrel(7))
        assert pub.recv() == Pubcomp(7, PACKET_IDENTIFIER_NOT_FOUND)
    # ...and a new message may use it again.
    pub.send(Publish("in2/t", b"next", qos=2, packet_id=7))
    assert pub.recv() == Pubrec(7)
    [msg] = sub.expect(1)
    assert msg.payload == b"next"


@pytest.mark.parametrize("level", [4, 5])
def test_outbound_qos2_resumes_with_pubrel_after_a_reconnect(
    raw: RawFactory, node: RunningNode, level: int
) -> None:
    sub, _ = raw(f"out2-{level}", level)
    subscribe(sub, "out2/t", 2)
    Client(node.mqtt_port, f"out2-pub-{level}").publish("out2/t", b"two", 2)
    publish = recv_publish(sub)
    assert publish.qos == 2 and publish.packet_id is not None
    pid = publish.packet_id
    sub.send(Pubrec(pid))
    assert sub.recv() == Pubrel(pid)
    sub.close()  # before PUBCOMP

    sub, connack = raw(f"out2-{level}", level)
    assert connack.session_present
    assert sub.recv() == Pubrel(pid)  # the release, not the PUBLISH again
    assert_quiet(sub)
    sub.send(Pubcomp(pid))
    assert_quiet(sub)
    sub.close()

    sub, connack = raw(f"out2-{level}", level)  # completed: nothing left to resume
    assert connack.session_present
    assert_quiet(sub)


def test_receive_maximum_bounds_unacknowledged_messages(raw: RawFactory, node: RunningNode) -> None:
    sub, _ = raw("rm", properties=Properties(session_expiry_interval=60, receive_maximum=2))
    subscribe(sub, "rm/t", 1)
    pub = Client(node.mqtt_port, "rm-pub")
    for i in range(6):
        pub.publish("rm/t", f"{i}".encode(), 1)
    outstanding = [recv_publish(sub), recv_publish(sub)]
    assert [p.payload for p in outstanding] == [b"0", b"1"]
    assert_quiet(sub)  # a third would exceed the client's Receive Maximum
    got = [p.payload for p in outstanding]
    while len(got) < 6:
        done = outstanding.pop(0)
        assert done.packet_id is not None
        sub.send(Puback(done.packet_id))
        outstanding.append(recv_publish(sub))  # one acknowledgement makes room for one more
        got.append(outstanding[-1].payload)
        if len(got) < 6:
            assert_quiet(sub, 0.3)
    assert got == [f"{i}".encode() for i in range(6)]
    for publish in outstanding:
        assert publish.packet_id is not None
        sub.send(Puback(publish.packet_id))
    assert_quiet(sub)


def test_unacknowledged_messages_count_against_receive_maximum_after_reconnect(
    raw: RawFactory, node: RunningNode
) -> None:
    limit = Properties(session_expiry_interval=60, receive_maximum=1)
    sub, _ = raw("rm2", properties=limit)
    subscribe(sub, "rm2/t", 1)
    pub = Client(node.mqtt_port, "rm2-pub")
    pub.publish("rm2/t", b"a", 1)
    pub.publish("rm2/t", b"b", 1)
    first = recv_publish(sub)
    assert first.payload == b"a"
    assert_quiet(sub)
    sub.close()
    sub, _ = raw("rm2", properties=limit)
    again = recv_publish(sub)
    assert (again.payload, again.dup, again.packet_id) == (b"a", True, first.packet_id)
    assert_quiet(sub)
    assert again.packet_id is not None
    sub.send(Puback(again.packet_id))
    second = recv_publish(sub)
    assert (second.payload, second.dup) == (b"b", False)
