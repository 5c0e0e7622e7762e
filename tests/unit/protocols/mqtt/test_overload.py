"""What MQTT clients are told when the node is overloaded: the CONNACK for a connection over
the connection rate, read off its first bytes, and which PUBLISHes are refused."""

from __future__ import annotations

import pytest

from mop.protocols.mqtt.codec import PacketDecoder, encode
from mop.protocols.mqtt.overload import rate_refusal, refused_when_overloaded
from mop.protocols.mqtt.packets import Connack, Connect, Pingreq


def connect_bytes(level: int, password: bytes | None = None) -> bytes:
    connect = Connect(client_id="storm", protocol_level=level, username="u", password=password)
    return encode(connect, level)


def decode_connack(data: bytes, level: int) -> Connack:
    decoder = PacketDecoder(protocol_level=level)
    decoder.feed(data)
    packet = decoder.next_packet()
    assert isinstance(packet, Connack), packet
    return packet


@pytest.mark.parametrize(("level", "code"), [(5, 0x9F), (4, 3), (3, 3)])
def test_a_connect_is_answered_at_its_protocol_level(level: int, code: int) -> None:
    answer = rate_refusal(connect_bytes(level))
    connack = decode_connack(answer, level)
    assert connack.reason_code == code
    assert not connack.session_present


def test_a_long_connect_needs_only_its_beginning() -> None:
    # A remaining length of two bytes, and more data after the CONNECT.
    first = connect_bytes(5, password=b"x" * 300) + b"\xc0"
    assert rate_refusal(first) == rate_refusal(connect_bytes(5))


@pytest.mark.parametrize(
    "first",
    [
        b"",
        encode(Pingreq(), 5),  # not a CONNECT
        b"GET / HTTP/1.1\r\n\r\n",
        b"\x10\x80\x80\x80\x80\x01",  # a remaining length of five bytes
        b"\x10\x0e\x00\x04MQTX\x05",  # not MQTT
        b"\x10\x0e\x00\x04MQTT\x07",  # no such level
        b"\x10\x0f\x00\x06MQIsdp\x04",  # the 3.1 name with the 3.1.1 level
    ],
)
def test_anything_else_is_just_closed(first: bytes) -> None:
    assert rate_refusal(first) == b""


def test_every_strict_prefix_of_a_connect_is_just_closed() -> None:
    whole = connect_bytes(5)
    name_ends = 2 + 2 + 4  # fixed header, name length, "MQTT": the level is the next byte
    for end in range(name_ends + 1):
        assert rate_refusal(whole[:end]) == b"", end
    assert rate_refusal(whole[: name_ends + 1]) == rate_refusal(whole)


@pytest.mark.parametrize(
    ("level", "qos", "refused"),
    [(5, 0, False), (5, 1, True), (5, 2, True), (4, 0, False), (4, 1, False), (3, 2, False)],
)
def test_only_mqtt5_acks_refuse_publishes(level: int, qos: int, refused: bool) -> None:
    assert refused_when_overloaded(level, qos) is refused
