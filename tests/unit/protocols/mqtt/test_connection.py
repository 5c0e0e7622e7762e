"""The pure server connection state machine: ordering rules, aliases, limits (no network)."""

from __future__ import annotations

import dataclasses

import pytest

from mop.protocols.mqtt.codec import NEED_DATA, PacketDecoder, encode
from mop.protocols.mqtt.connection import ConnectionLimits, ConnectionState, ServerConnection
from mop.protocols.mqtt.errors import (
    MalformedPacket,
    PacketTooLarge,
    ProtocolViolation,
    RemoteProtocolError,
)
from mop.protocols.mqtt.packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Unsuback,
)
from mop.protocols.mqtt.reason_codes import ReasonCode


def connected(
    level: int = 5, limits: ConnectionLimits | None = None, **props: object
) -> ServerConnection:
    conn = ServerConnection(limits or ConnectionLimits())
    conn.receive_data(
        encode(Connect("c1", protocol_level=level, properties=Properties(**props)), level)
    )  # type: ignore[arg-type]
    assert isinstance(conn.next_event(), Connect)
    return conn


def feed(conn: ServerConnection, packet: object, level: int = 5) -> object:
    conn.receive_data(encode(packet, level))  # type: ignore[arg-type]
    return conn.next_event()


def test_connect_must_come_first() -> None:
    conn = ServerConnection(ConnectionLimits())
    conn.receive_data(encode(Publish("a", b"x"), 5))
    with pytest.raises(ProtocolViolation):
        conn.next_event()


def test_non_connect_refused_from_its_first_byte() -> None:
    conn = ServerConnection(ConnectionLimits())
    conn.receive_data(b"\x30\xff\xff\x1f")  # a PUBLISH announcing ~500 kB, body never sent
    with pytest.raises(ProtocolViolation):
        conn.next_event()


def test_second_connect_is_a_protocol_error() -> None:
    conn = connected()
    with pytest.raises(ProtocolViolation):
        feed(conn, Connect("again", protocol_level=5))


def test_partial_packet_needs_more_data() -> None:
    conn = connected()
    data = encode(Pingreq(), 5)
    conn.receive_data(data[:1])
    assert conn.next_event() is NEED_DATA
    conn.receive_data(data[1:])
    assert isinstance(conn.next_event(), Pingreq)


def test_server_packets_from_a_client_are_refused() -> None:
    conn = connected()
    with pytest.raises(ProtocolViolation):
        feed(conn, Suback(1, (0,)))


def test_inbound_topic_alias_is_resolved() -> None:
    conn = connected(limits=ConnectionLimits(topic_alias_maximum=5))
    first = feed(conn, Publish("a/b", b"1", properties=Properties(topic_alias=2)))
    second = feed(conn, Publish("", b"2", properties=Properties(topic_alias=2)))
    assert isinstance(first, Publish) and isinstance(second, Publish)
    assert first.topic == second.topic == "a/b"
    assert second.properties.topic_alias is None


def test_topic_alias_above_maximum() -> None:
    conn = connected(limits=ConnectionLimits(topic_alias_maximum=2))
    with pytest.raises(RemoteProtocolError) as info:
        feed(conn, Publish("a", b"", properties=Properties(topic_alias=3)))
    assert info.value.reason_code == ReasonCode.TOPIC_ALIAS_INVALID


def test_unknown_topic_alias() -> None:
    conn = connected()
    with pytest.raises(ProtocolViolation):
        feed(conn, Publish("", b"", properties=Properties(topic_alias=1)))


def test_receive_maximum_is_enforced_and_released_by_acks() -> None:
    conn = connected(limits=ConnectionLimits(receive_maximum=2))
    feed(conn, Publish("t", b"", qos=1, packet_id=1))
    feed(conn, Publish("t", b"", qos=1, packet_id=2))
    with pytest.raises(RemoteProtocolError) as info:
        feed(conn, Publish("t", b"", qos=1, packet_id=3))
    assert info.value.reason_code == ReasonCode.RECEIVE_MAXIMUM_EXCEEDED
    conn = connected(limits=ConnectionLimits(receive_maximum=1))
    feed(conn, Publish("t", b"", qos=1, packet_id=1))
    conn.send(Puback(1))
    assert isinstance(feed(conn, Publish("t", b"", qos=1, packet_id=2)), Publish)


@pytest.mark.parametrize("level", [4, 5])
@pytest.mark.parametrize("reason", [0, ReasonCode.NO_MATCHING_SUBSCRIBERS, 0x80, 0x92])
def test_the_acks_of_a_qos2_flow_encode_as_send_does(level: int, reason: int) -> None:
    conn = connected(level)
    pid = 0x1234
    if reason != 0x92:
        assert conn.send_pubrec(pid, reason) == conn.send(Pubrec(pid, reason))
    if reason in (0, 0x92):
        assert conn.send_pubrel(pid, reason) == conn.send(Pubrel(pid, reason))
        assert conn.send_pubcomp(pid, reason) == conn.send(Pubcomp(pid, reason))


def test_the_qos2_acks_that_end_a_flow_release_its_receive_maximum_slot() -> None:
    conn = connected(limits=ConnectionLimits(receive_maximum=1))
    feed(conn, Publish("t", b"", qos=2, packet_id=1))
    conn.send_pubrec(1)  # the flow goes on: PUBREL, PUBCOMP
    with pytest.raises(RemoteProtocolError):
        feed(conn, Publish("t", b"", qos=2, packet_id=2))
    conn = connected(limits=ConnectionLimits(receive_maximum=1))
    feed(conn, Publish("t", b"", qos=2, packet_id=1))
    conn.send_pubcomp(1)
    assert isinstance(feed(conn, Publish("t", b"", qos=2, packet_id=2)), Publish)
    conn.send_pubrec(2, 0x80)  # refused: the flow ends there
    assert isinstance(feed(conn, Publish("t", b"", qos=2, packet_id=3)), Publish)


def test_a_connected_clients_acks_pass_through() -> None:
    conn = connected()
    for packet in (Puback(1), Pubrec(2), Pubrel(3), Pubcomp(4)):
        assert feed(conn, packet) == packet


def test_receive_maximum_does_not_apply_to_level_4_clients() -> None:
    # A 3.1.1 client never learns the server's Receive Maximum, so it cannot be held to it.
    conn = connected(level=4, limits=ConnectionLimits(receive_maximum=2))
    for pid in range(1, 50):
        assert isinstance(feed(conn, Publish("t", b"", qos=2, packet_id=pid), 4), Publish)


def test_invalid_topic_name_in_publish() -> None:
    conn = connected()
    with pytest.raises(RemoteProtocolError) as info:
        feed(conn, Publish("a/+", b""))
    assert info.value.reason_code == ReasonCode.TOPIC_NAME_INVALID


def test_a_subscription_identifier_in_a_client_publish_is_malformed() -> None:
    # Only the server sends subscription identifiers [MQTT-3.3.4-6].
    conn = connected()
    with pytest.raises(MalformedPacket) as info:
        feed(conn, Publish("t", b"", properties=Properties(subscription_identifiers=(1,))))
    assert info.value.reason_code == ReasonCode.MALFORMED_PACKET


def test_topic_levels_limit() -> None:
    conn = connected(limits=ConnectionLimits(max_topic_levels=3))
    with pytest.raises(RemoteProtocolError):
        feed(conn, Publish("a/b/c/d", b""))


def test_outbound_topic_alias_used_when_client_allows() -> None:
    conn = connected(topic_alias_maximum=1)
    first = conn.send_publish(Publish("long/topic", b"1"))
    second = conn.send_publish(Publish("long/topic", b"2"))
    other = conn.send_publish(Publish("other", b"3"))
    decoder = PacketDecoder(protocol_level=5)
    for data in (first, second, other):
        assert data is not None
        decoder.feed(data)
    p1, p2, p3 = decoder.next_packet(), decoder.next_packet(), decoder.next_packet()
    assert isinstance(p1, Publish) and isinstance(p2, Publish) and isinstance(p3, Publish)
    assert (p1.topic, p1.properties.topic_alias) == ("long/topic", 1)
    assert (p2.topic, p2.properties.topic_alias) == ("", 1)
    assert (p3.topic, p3.properties.topic_alias) == ("other", None)


def test_oversize_outbound_publish_is_dropped() -> None:
    conn = connected(maximum_packet_size=64)
    assert conn.send_publish(Publish("t", b"x" * 10)) is not None
    assert conn.send_publish(Publish("t", b"x" * 100)) is None


def decoded(data: bytes) -> object:
    decoder = PacketDecoder(protocol_level=5)
    decoder.feed(data)
    return decoder.next_packet()


WORDY = Properties(reason_string="r" * 40, user_properties=(("k", "v" * 40),))


@pytest.mark.parametrize(
    "packet",
    [
        Connack(False, ReasonCode.NOT_AUTHORIZED, WORDY),
        Puback(1, 0x10, WORDY),
        Pubrec(1, 0x10, WORDY),
        Pubrel(1, 0x92, WORDY),
        Pubcomp(1, 0x92, WORDY),
        Suback(1, (0, 1), WORDY),
        Unsuback(1, (0, 0x11), WORDY),
        Disconnect(0x93, WORDY),
        Auth(0x18, Properties(authentication_method="JWT", reason_string="r" * 40)),
    ],
    ids=lambda packet: type(packet).__name__,
)
def test_packets_lose_reason_strings_and_user_properties_to_fit_the_client(
    packet: Connack,
) -> None:
    """[MQTT-3.1.2-24]: nothing above the client's Maximum Packet Size is sent."""
    conn = connected(maximum_packet_size=40, authentication_method="JWT")
    data = conn.send(packet)
    assert len(data) <= 40
    sent = decoded(data)
    assert type(sent) is type(packet)
    assert sent.properties.reason_string is None  # type: ignore[attr-defined]
    assert sent.properties.user_properties == ()  # type: ignore[attr-defined]
    assert sent == dataclasses.replace(
        packet,
        properties=dataclasses.replace(packet.properties, reason_string=None, user_properties=()),
    )


def test_a_packet_that_cannot_fit_the_client_closes_the_connection() -> None:
    conn = connected(maximum_packet_size=20)
    assert conn.fits(Suback(1, (0,) * 10))
    assert not conn.fits(Suback(1, (0,) * 20))
    with pytest.raises(PacketTooLarge):
        conn.send(Suback(1, (0,) * 20))
    assert conn.state is ConnectionState.CLOSED


def test_a_disconnect_that_cannot_fit_is_not_sent() -> None:
    conn = connected(maximum_packet_size=2)
    assert conn.send(Disconnect(0x95)) == b""


def test_packets_that_fit_are_sent_whole() -> None:
    conn = connected(maximum_packet_size=200)
    data = conn.send(Puback(1, 0x10, WORDY))
    assert decoded(data) == Puback(1, 0x10, WORDY)


def test_no_problem_information_strips_reason_strings() -> None:
    conn = connected(request_problem_information=0)
    data = conn.send(Puback(1, 0x10, Properties(reason_string="nobody")))
    decoder = PacketDecoder(protocol_level=5)
    decoder.feed(data)
    ack = decoder.next_packet()
    assert isinstance(ack, Puback) and ack.properties.reason_string is None
    # CONNACK and DISCONNECT keep them.
    data = conn.send(Disconnect(0x80, Properties(reason_string="bye")))
    decoder.feed(data)
    bye = decoder.next_packet()
    assert isinstance(bye, Disconnect) and bye.properties.reason_string == "bye"


def test_level_4_encodes_without_properties() -> None:
    conn = connected(level=4)
    data = conn.send(Connack(True, 0, Properties(reason_string="ignored")))
    assert data == b"\x20\x02\x01\x00"


def test_disconnect_closes_the_state() -> None:
    conn = connected()
    conn.send(Disconnect(ReasonCode.SERVER_SHUTTING_DOWN))
    assert conn.state is ConnectionState.CLOSED
