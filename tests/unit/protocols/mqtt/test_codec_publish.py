"""The decoder's shortcut for PUBLISH below MQTT 5 gives the packets, and the errors, of the
general decoding path."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mop.protocols.mqtt.codec import NEED_DATA, PacketDecoder, _decode_publish
from mop.protocols.mqtt.errors import RemoteProtocolError
from mop.protocols.mqtt.packets import Publish


def _decode_all(data: bytes, level: int = 4, max_packet_size: int = 1 << 20) -> list[object]:
    decoder = PacketDecoder(protocol_level=level, max_packet_size=max_packet_size)
    decoder.feed(data)
    packets: list[object] = []
    while True:
        try:
            packet = decoder.next_packet()
        except RemoteProtocolError as exc:
            packets.append((type(exc), str(exc)))
            return packets
        if packet is NEED_DATA:
            return packets
        packets.append(packet)


def _general(first: int, body: bytes, level: int = 4) -> object:
    """What the general path makes of one PUBLISH body."""
    try:
        return _decode_publish(memoryview(body), first & 0x0F, level)
    except RemoteProtocolError as exc:
        return (type(exc), str(exc))


def _packet(first: int, body: bytes) -> bytes:
    assert len(body) < 0x80
    return bytes((first, len(body))) + body


@pytest.mark.parametrize(
    ("first", "body", "expected"),
    [
        (0x30, b"\x00\x03a/b" + b"hello", Publish("a/b", b"hello")),
        (0x31, b"\x00\x01t", Publish("t", b"", retain=True)),
        (0x32, b"\x00\x01t\x12\x34x", Publish("t", b"x", qos=1, packet_id=0x1234)),
        (0x3C, b"\x00\x01t\x00\x07", Publish("t", b"", qos=2, dup=True, packet_id=7)),
    ],
)
def test_well_formed_publishes(first: int, body: bytes, expected: Publish) -> None:
    assert _decode_all(_packet(first, body)) == [expected]
    assert _general(first, body) == expected


@pytest.mark.parametrize(
    ("first", "body", "error"),
    [
        (0x30, b"\x00\x02\xff\xfe", "invalid UTF-8"),
        (0x30, b"\x00\x02a\x00", "U+0000"),
        (0x32, b"\x00\x01t\x00\x00", "packet identifier 0"),
        (0x30, b"\x00\x09ab", "past the end"),
        (0x32, b"\x00\x01t\x01", "two byte integer"),
        (0x30, b"\x00", "string length"),
        (0x36, b"\x00\x01t", "QoS 3"),
        (0x38, b"\x00\x01t", "QoS 0 and DUP"),
    ],
)
def test_malformed_publishes_fail_as_before(first: int, body: bytes, error: str) -> None:
    [(kind, message)] = _decode_all(_packet(first, body))  # type: ignore[misc]
    assert issubclass(kind, RemoteProtocolError)
    assert error in message


def test_a_packet_above_the_maximum_fails_before_its_body_arrives() -> None:
    [(_, message)] = _decode_all(bytes((0x30, 100)), max_packet_size=50)  # type: ignore[misc]
    assert "exceeds the maximum" in message


def test_many_publishes_in_one_feed_and_split_ones() -> None:
    packets = [_packet(0x30, b"\x00\x01t" + bytes([n])) for n in range(50)]
    stream = b"".join(packets)
    assert _decode_all(stream) == [Publish("t", bytes([n])) for n in range(50)]
    decoder = PacketDecoder(protocol_level=4)
    got: list[object] = []
    for byte in stream:
        decoder.feed(bytes((byte,)))
        packet = decoder.next_packet()
        if packet is not NEED_DATA:
            got.append(packet)
    assert got == [Publish("t", bytes([n])) for n in range(50)]


@given(
    flags=st.integers(0, 15),
    body=st.binary(max_size=40),
    level=st.sampled_from([3, 4]),
)
def test_any_body_decodes_like_the_general_path(flags: int, body: bytes, level: int) -> None:
    first = 0x30 | flags
    got = _decode_all(_packet(first, body), level)
    if flags & 0x06 == 0x06:
        assert len(got) == 1 and isinstance(got[0], tuple) and "QoS 3" in got[0][1]
        return
    if flags & 0x0E == 0x08 and level == 4:
        assert len(got) == 1 and isinstance(got[0], tuple) and "DUP" in got[0][1]
        return
    assert got == [_general(first, body, level)]
