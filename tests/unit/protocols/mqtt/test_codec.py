"""MQTT codec: byte vectors written from the spec, and one test per rejection rule."""

from __future__ import annotations

import pytest

from mop.protocols.mqtt.codec import (
    NEED_DATA,
    NeedData,
    PacketDecoder,
    encode,
    encode_publish,
)
from mop.protocols.mqtt.errors import (
    LocalProtocolError,
    MalformedPacket,
    PacketTooLarge,
    ProtocolViolation,
    RemoteProtocolError,
    UnsupportedProtocolVersion,
)
from mop.protocols.mqtt.packets import (
    NO_PROPERTIES,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
    Will,
)
from mop.protocols.mqtt.properties import encode_varint, read_varint
from mop.protocols.mqtt.reason_codes import ConnectReturnCode, ReasonCode, v3_connack_code


def h(text: str) -> bytes:
    """Hex with spaces and ASCII in single quotes: h("00 03 'abc'")."""
    out = bytearray()
    for i, chunk in enumerate(text.split("'")):
        out += chunk.encode() if i % 2 else bytes.fromhex(chunk)
    return bytes(out)


def decode_all(data: bytes, level: int) -> list[Packet]:
    decoder = PacketDecoder(protocol_level=level)
    decoder.feed(data)
    packets = []
    while (packet := decoder.next_packet()) is not NEED_DATA:
        assert not isinstance(packet, NeedData)
        packets.append(packet)
    assert decoder.buffered == 0
    return packets


def decode_one(data: bytes, level: int) -> Packet:
    packets = decode_all(data, level)
    assert len(packets) == 1
    return packets[0]


# --- known vectors -------------------------------------------------------------------------------

VECTORS: list[tuple[str, int, Packet, bytes]] = [
    (
        "connect 3.1",
        3,
        Connect("abc", "MQIsdp", 3),
        h("10 11 00 06 'MQIsdp' 03 02 00 3C 00 03 'abc'"),
    ),
    ("connect 3.1.1", 4, Connect("abc"), h("10 0F 00 04 'MQTT' 04 02 00 3C 00 03 'abc'")),
    (
        "connect 3.1.1 will user password",
        4,
        Connect(
            "c",
            keep_alive=10,
            username="u",
            password=b"p",
            clean_start=False,
            will=Will("w/t", b"bye", qos=1, retain=True),
        ),
        h("10 1D 00 04 'MQTT' 04 EC 00 0A 00 01 'c' 00 03 'w/t' 00 03 'bye' 00 01 'u' 00 01 'p'"),
    ),
    (
        "connect bridge",
        4,
        Connect("b", bridge=True, keep_alive=0),
        h("10 0D 00 04 'MQTT' 84 02 00 00 00 01 'b'"),
    ),
    (
        "connect 5 properties",
        5,
        Connect(
            "abc",
            protocol_level=5,
            username="u",
            password=b"p",
            properties=Properties(session_expiry_interval=10, receive_maximum=20),
        ),
        h(
            "10 1E 00 04 'MQTT' 05 C2 00 3C 08 11 00 00 00 0A 21 00 14 00 03 'abc'"
            " 00 01 'u' 00 01 'p'"
        ),
    ),
    (
        "connect 5 will properties",
        5,
        Connect(
            "", protocol_level=5, will=Will("t", b"", properties=Properties(will_delay_interval=5))
        ),
        h("10 18 00 04 'MQTT' 05 06 00 3C 00 00 00 05 18 00 00 00 05 00 01 't' 00 00"),
    ),
    ("connack 3.1.1", 4, Connack(session_present=True), h("20 02 01 00")),
    ("connack 3.1.1 refused", 4, Connack(reason_code=5), h("20 02 00 05")),
    ("connack 5", 5, Connack(), h("20 03 00 00 00")),
    (
        "connack 5 properties",
        5,
        Connack(
            properties=Properties(
                assigned_client_identifier="id", maximum_qos=1, topic_alias_maximum=10
            )
        ),
        h("20 0D 00 00 0A 12 00 02 'id' 22 00 0A 24 01"),
    ),
    ("publish qos 0", 4, Publish("a/b", b"hi"), h("30 07 00 03 'a/b' 'hi'")),
    (
        "publish qos 1",
        4,
        Publish("a/b", b"hi", qos=1, packet_id=10),
        h("32 09 00 03 'a/b' 00 0A 'hi'"),
    ),
    (
        "publish qos 2 dup retain 3.1",
        3,
        Publish("a", b"", qos=2, retain=True, dup=True, packet_id=0xFFFF),
        h("3D 05 00 01 'a' FF FF"),
    ),
    (
        "publish 5 qos 1",
        5,
        Publish("a/b", b"hi", qos=1, packet_id=10),
        h("32 0A 00 03 'a/b' 00 0A 00 'hi'"),
    ),
    (
        "publish 5 alias",
        5,
        Publish("", b"x", retain=True, properties=Properties(topic_alias=5)),
        h("31 07 00 00 03 23 00 05 'x'"),
    ),
    (
        "publish 5 user properties and subscription ids",
        5,
        Publish(
            "t",
            b"",
            properties=Properties(
                subscription_identifiers=(1, 200), user_properties=(("k", "v"), ("k", "w"))
            ),
        ),
        h("30 17 00 01 't' 13 0B 01 0B C8 01 26 00 01 'k' 00 01 'v' 26 00 01 'k' 00 01 'w'"),
    ),
    ("puback", 4, Puback(10), h("40 02 00 0A")),
    ("puback 5 short", 5, Puback(10), h("40 02 00 0A")),
    ("puback 5 reason", 5, Puback(10, 0x10), h("40 03 00 0A 10")),
    (
        "puback 5 reason string",
        5,
        Puback(10, 0, Properties(reason_string="x")),
        h("40 08 00 0A 00 04 1F 00 01 'x'"),
    ),
    ("pubrec", 4, Pubrec(1), h("50 02 00 01")),
    ("pubrel", 4, Pubrel(1), h("62 02 00 01")),
    ("pubrel 5 not found", 5, Pubrel(1, 0x92), h("62 03 00 01 92")),
    ("pubcomp", 3, Pubcomp(1), h("70 02 00 01")),
    (
        "subscribe",
        4,
        Subscribe(1, (SubscriptionRequest("a/#", 1),)),
        h("82 08 00 01 00 03 'a/#' 01"),
    ),
    (
        "subscribe two filters",
        3,
        Subscribe(2, (SubscriptionRequest("a", 0), SubscriptionRequest("+/b", 2))),
        h("82 0C 00 02 00 01 'a' 00 00 03 '+/b' 02"),
    ),
    (
        "subscribe 5 options",
        5,
        Subscribe(
            1,
            (SubscriptionRequest("a/#", 2, True, True, 2),),
            Properties(subscription_identifiers=(7,)),
        ),
        h("82 0B 00 01 02 0B 07 00 03 'a/#' 2E"),
    ),
    ("suback", 4, Suback(1, (0, 0x80)), h("90 04 00 01 00 80")),
    ("suback 5", 5, Suback(1, (1, 0x8F)), h("90 05 00 01 00 01 8F")),
    ("unsubscribe", 4, Unsubscribe(2, ("a",)), h("A2 05 00 02 00 01 'a'")),
    ("unsubscribe 5", 5, Unsubscribe(2, ("a", "b")), h("A2 09 00 02 00 00 01 'a' 00 01 'b'")),
    ("unsuback", 4, Unsuback(2), h("B0 02 00 02")),
    ("unsuback 5", 5, Unsuback(2, (0x11,)), h("B0 04 00 02 00 11")),
    ("pingreq", 4, Pingreq(), h("C0 00")),
    ("pingresp", 5, Pingresp(), h("D0 00")),
    ("disconnect", 4, Disconnect(), h("E0 00")),
    ("disconnect 5 short", 5, Disconnect(), h("E0 00")),
    ("disconnect 5 with will", 5, Disconnect(0x04), h("E0 01 04")),
    (
        "disconnect 5 properties",
        5,
        Disconnect(0x8B, Properties(server_reference="s")),
        h("E0 06 8B 04 1C 00 01 's'"),
    ),
    ("auth 5 short", 5, Auth(), h("F0 00")),
    (
        "auth 5 continue",
        5,
        Auth(0x18, Properties(authentication_method="m")),
        h("F0 06 18 04 15 00 01 'm'"),
    ),
]


@pytest.mark.parametrize(
    ("level", "packet", "data"), [v[1:] for v in VECTORS], ids=[v[0] for v in VECTORS]
)
def test_known_vectors(level: int, packet: Packet, data: bytes) -> None:
    assert encode(packet, level) == data
    assert decode_one(data, level) == packet


@pytest.mark.parametrize(
    ("level", "data", "packet"),
    [
        (5, h("40 03 00 0A 00"), Puback(10)),
        (5, h("50 03 00 0A 10"), Pubrec(10, 0x10)),
        (5, h("40 04 00 0A 10 00"), Puback(10, 0x10)),
        (5, h("E0 01 00"), Disconnect()),
        (5, h("E0 02 00 00"), Disconnect()),
        (5, h("F0 01 19"), Auth(0x19)),
        (3, h("38 04 00 01 'a' 'x'"), Publish("a", b"x", dup=True)),  # tolerated in MQTT 3.1
        (
            5,
            h("10 11 00 04 'MQTT' 05 42 00 3C 00 00 01 'c' 00 01 'p'"),
            Connect("c", protocol_level=5, password=b"p"),
        ),
        (5, h("30 04 00 01 't' 00"), Publish("t", b"")),
        (5, h("30 05 00 01 't' 80 00"), Publish("t", b"")),  # non-minimal varint property length
    ],
)
def test_accepted_forms(level: int, data: bytes, packet: Packet) -> None:
    assert decode_one(data, level) == packet


def test_level_3_4_drop_what_they_cannot_express() -> None:
    props = Properties(reason_string="nope")
    assert encode(Puback(1, 0x87, props), 4) == h("40 02 00 01")
    assert encode(Suback(1, (1, 0x87, 0xA2), props), 4) == h("90 05 00 01 01 80 80")
    assert encode(Unsuback(1, (0x11,), props), 4) == h("B0 02 00 01")
    assert encode(Disconnect(0x8B, props), 3) == h("E0 00")
    assert encode(Connack(reason_code=0x86), 4) == h("20 02 00 04")
    assert encode(Connack(reason_code=0x84), 3) == h("20 02 00 01")
    # MQTT 3.1 has no session present flag: the first byte is reserved.
    assert encode(Connack(session_present=True), 3) == h("20 02 00 00")
    aliased = Publish("t", b"", properties=Properties(topic_alias=3))
    assert encode(aliased, 4) == h("30 03 00 01 't'")
    sub = Subscribe(
        1, (SubscriptionRequest("t", 1, True, True, 2),), Properties(subscription_identifiers=(3,))
    )
    assert encode(sub, 4) == h("82 06 00 01 00 01 't' 01")


def test_encode_publish_matches_encode() -> None:
    props = Properties(content_type="text/plain", message_expiry_interval=30)
    packet = Publish("x/y", b"payload", qos=2, retain=True, packet_id=7, properties=props)
    for level in (3, 4, 5):
        assert encode_publish(
            "x/y",
            b"payload",
            qos=2,
            retain=True,
            dup=False,
            packet_id=7,
            properties=props,
            protocol_level=level,
        ) == encode(packet, level)


def test_connect_is_encoded_at_its_own_level() -> None:
    assert encode(Connect("a", protocol_level=3), 5)[2:10] == h("00 06 'MQIsdp'")
    assert encode(Connect("a", protocol_level=5), 4)[8] == 5


def test_varint_helpers() -> None:
    for value, data in [
        (0, "00"),
        (127, "7F"),
        (128, "80 01"),
        (16383, "FF 7F"),
        (16384, "80 80 01"),
        (2097151, "FF FF 7F"),
        (2097152, "80 80 80 01"),
        (268435455, "FF FF FF 7F"),
    ]:
        assert encode_varint(value) == h(data)
        assert read_varint(memoryview(h(data)), 0) == (value, len(h(data)))
    with pytest.raises(LocalProtocolError):
        encode_varint(268435456)
    with pytest.raises(LocalProtocolError):
        encode_varint(-1)


def test_many_packets_in_one_feed() -> None:
    stream = h("C0 00") * 20000 + encode(Publish("t", b"x" * 1000), 4) * 100
    packets = decode_all(stream, 4)
    assert packets[:20000] == [Pingreq()] * 20000
    assert packets[20000:] == [Publish("t", b"x" * 1000)] * 100


def test_partial_packets_across_feeds() -> None:
    decoder = PacketDecoder()
    decoder.feed(h("30 07 00 03 'a/"))
    assert decoder.next_packet() is NEED_DATA
    decoder.feed(h("'b' 'hi' C0"))
    assert decoder.next_packet() == Publish("a/b", b"hi")
    assert decoder.next_packet() is NEED_DATA
    assert decoder.buffered == 1
    decoder.feed(h("00"))
    assert decoder.next_packet() == Pingreq()
    assert decoder.next_packet() is NEED_DATA


# --- rejection rules -----------------------------------------------------------------------------

CONNECT_HEAD = "00 04 'MQTT' 04"
REJECTED: list[tuple[str, int, bytes, type[RemoteProtocolError], int]] = [
    ("remaining length of 5 bytes", 4, h("30 FF FF FF FF 01"), MalformedPacket, 0x81),
    ("remaining length continues past 4 bytes", 4, h("30 80 80 80 80"), MalformedPacket, 0x81),
    ("reserved packet type 0", 4, h("00 00"), MalformedPacket, 0x81),
    ("reserved packet type 0 alone", 4, h("00"), MalformedPacket, 0x81),
    ("subscribe flags 0", 4, h("80 06 00 01 00 01 'a' 00"), MalformedPacket, 0x81),
    ("unsubscribe flags 0", 4, h("A0 05 00 01 00 01 'a'"), MalformedPacket, 0x81),
    ("pubrel flags 0", 4, h("60 02 00 01"), MalformedPacket, 0x81),
    ("puback flags 2", 4, h("42 02 00 01"), MalformedPacket, 0x81),
    ("connect flags 1", 4, h("11 00"), MalformedPacket, 0x81),
    ("pingreq flags", 4, h("C8 00"), MalformedPacket, 0x81),
    ("publish qos 3", 4, h("36 05 00 01 'a' 00 01"), MalformedPacket, 0x81),
    ("publish 5 qos 0 dup", 5, h("38 04 00 01 'a' 00"), MalformedPacket, 0x81),
    ("publish 3.1.1 qos 0 dup", 4, h("38 04 00 01 'a' 'x'"), MalformedPacket, 0x81),
    ("subscribe empty filter", 4, h("82 05 00 01 00 00 00"), ProtocolViolation, 0x82),
    ("subscribe 5 empty filter", 5, h("82 06 00 01 00 00 00 00"), ProtocolViolation, 0x82),
    (
        "subscribe empty filter after a valid one",
        4,
        h("82 09 00 01 00 01 'a' 00 00 00 00"),
        ProtocolViolation,
        0x82,
    ),
    ("unsubscribe empty filter", 4, h("A2 04 00 01 00 00"), ProtocolViolation, 0x82),
    ("unsubscribe 5 empty filter", 5, h("A2 05 00 01 00 00 00"), ProtocolViolation, 0x82),
    ("response topic with +", 5, h("30 08 00 01 't' 04 08 00 01 '+'"), MalformedPacket, 0x81),
    (
        "response topic with #",
        5,
        h("30 0A 00 01 't' 06 08 00 03 'a' '/' '#'"),
        MalformedPacket,
        0x81,
    ),
    ("auth before mqtt 5", 4, h("F0 00"), MalformedPacket, 0x81),
    ("topic invalid utf-8", 4, h("30 04 00 02 C3 28"), MalformedPacket, 0x81),
    ("topic with surrogate", 4, h("30 05 00 03 ED A0 80"), MalformedPacket, 0x81),
    ("topic with U+0000", 4, h("30 04 00 02 'a' 00"), MalformedPacket, 0x81),
    (
        "client id with U+0000",
        4,
        h(f"10 0E {CONNECT_HEAD} 02 00 3C 00 02 'a' 00"),
        MalformedPacket,
        0x81,
    ),
    (
        "user property invalid utf-8",
        5,
        h("30 0B 00 01 't' 07 26 00 01 FF 00 01 'v'"),
        MalformedPacket,
        0x81,
    ),
    ("topic longer than packet", 4, h("30 03 00 05 'a'"), MalformedPacket, 0x81),
    ("publish qos 1 without packet id", 4, h("32 03 00 01 'a'"), MalformedPacket, 0x81),
    ("puback trailing byte", 4, h("40 03 00 01 00"), MalformedPacket, 0x81),
    ("puback 5 trailing byte", 5, h("40 05 00 01 00 00 00"), MalformedPacket, 0x81),
    ("pingreq trailing byte", 4, h("C0 01 00"), MalformedPacket, 0x81),
    ("unsuback 3.1.1 payload", 4, h("B0 03 00 01 00"), MalformedPacket, 0x81),
    ("disconnect 3.1.1 payload", 4, h("E0 01 00"), MalformedPacket, 0x81),
    (
        "connect trailing byte",
        4,
        h(f"10 0E {CONNECT_HEAD} 02 00 3C 00 01 'a' 00"),
        MalformedPacket,
        0x81,
    ),
    ("connack 3.1.1 trailing byte", 4, h("20 03 00 00 00"), MalformedPacket, 0x81),
    ("connack reserved flags", 4, h("20 02 02 00"), MalformedPacket, 0x81),
    ("connack 3.1.1 return code 6", 4, h("20 02 00 06"), ProtocolViolation, 0x82),
    ("puback packet id 0", 4, h("40 02 00 00"), ProtocolViolation, 0x82),
    ("publish qos 1 packet id 0", 4, h("32 05 00 01 'a' 00 00"), ProtocolViolation, 0x82),
    ("subscribe packet id 0", 4, h("82 06 00 00 00 01 'a' 00"), ProtocolViolation, 0x82),
    ("duplicate property", 5, h("30 08 00 01 't' 04 01 01 01 01"), ProtocolViolation, 0x82),
    (
        "duplicate topic alias",
        5,
        h("30 0A 00 01 't' 06 23 00 01 23 00 02"),
        ProtocolViolation,
        0x82,
    ),
    (
        "two subscription ids in subscribe",
        5,
        h("82 0B 00 01 04 0B 01 0B 02 00 01 'a' 00"),
        ProtocolViolation,
        0x82,
    ),
    (
        "property not allowed in publish",
        5,
        h("30 09 00 01 't' 05 11 00 00 00 01"),
        MalformedPacket,
        0x81,
    ),
    ("will delay outside will", 5, h("30 09 00 01 't' 05 18 00 00 00 01"), MalformedPacket, 0x81),
    ("property not allowed in puback", 5, h("40 07 00 01 00 03 23 00 01"), MalformedPacket, 0x81),
    ("unknown property id", 5, h("30 06 00 01 't' 02 7F 00"), MalformedPacket, 0x81),
    ("property length past end", 5, h("30 05 00 01 't' 05 01"), MalformedPacket, 0x81),
    ("property value truncated", 5, h("30 06 00 01 't' 02 23 00"), MalformedPacket, 0x81),
    ("topic alias 0", 5, h("30 07 00 01 't' 03 23 00 00"), RemoteProtocolError, 0x94),
    ("subscription id 0", 5, h("82 09 00 01 02 0B 00 00 01 'a' 00"), ProtocolViolation, 0x82),
    ("maximum qos 2", 5, h("20 05 00 00 02 24 02"), ProtocolViolation, 0x82),
    ("receive maximum 0", 5, h("20 06 00 00 03 21 00 00"), ProtocolViolation, 0x82),
    ("payload format indicator 2", 5, h("30 06 00 01 't' 02 01 02"), ProtocolViolation, 0x82),
    ("subscribe without filters", 4, h("82 02 00 01"), ProtocolViolation, 0x82),
    ("subscribe 5 without filters", 5, h("82 03 00 01 00"), ProtocolViolation, 0x82),
    ("unsubscribe without filters", 4, h("A2 02 00 01"), ProtocolViolation, 0x82),
    (
        "subscription option reserved bit 3.1.1",
        4,
        h("82 06 00 01 00 01 'a' 04"),
        MalformedPacket,
        0x81,
    ),
    (
        "subscription option reserved bit 5",
        5,
        h("82 07 00 01 00 00 01 'a' 40"),
        MalformedPacket,
        0x81,
    ),
    ("subscription qos 3", 4, h("82 06 00 01 00 01 'a' 03"), MalformedPacket, 0x81),
    ("subscription filter missing options", 4, h("82 05 00 01 00 01 'a'"), MalformedPacket, 0x81),
    ("retain handling 3", 5, h("82 07 00 01 00 00 01 'a' 30"), ProtocolViolation, 0x82),
    ("suback 3.1.1 code 3", 4, h("90 03 00 01 03"), ProtocolViolation, 0x82),
    ("suback 3.1.1 code 0x87", 4, h("90 03 00 01 87"), ProtocolViolation, 0x82),
    ("suback without codes", 4, h("90 02 00 01"), ProtocolViolation, 0x82),
    ("unsuback 5 without codes", 5, h("B0 03 00 01 00"), ProtocolViolation, 0x82),
    ("puback 5 reason not allowed", 5, h("40 03 00 01 81"), ProtocolViolation, 0x82),
    ("pubrel 5 reason not allowed", 5, h("62 03 00 01 10"), ProtocolViolation, 0x82),
    ("disconnect 5 reason not allowed", 5, h("E0 01 01"), ProtocolViolation, 0x82),
    ("auth reason not allowed", 5, h("F0 01 80"), ProtocolViolation, 0x82),
    ("connack 5 reason not allowed", 5, h("20 03 00 10 00"), ProtocolViolation, 0x82),
    ("connack 5 without properties", 5, h("20 02 00 00"), MalformedPacket, 0x81),
    (
        "connect reserved flag",
        4,
        h(f"10 0D {CONNECT_HEAD} 03 00 3C 00 01 'a'"),
        MalformedPacket,
        0x81,
    ),
    (
        "will qos without will flag",
        4,
        h(f"10 0D {CONNECT_HEAD} 0A 00 3C 00 01 'a'"),
        MalformedPacket,
        0x81,
    ),
    (
        "will retain without will flag",
        4,
        h(f"10 0D {CONNECT_HEAD} 22 00 3C 00 01 'a'"),
        MalformedPacket,
        0x81,
    ),
    (
        "will qos 3",
        4,
        h(f"10 12 {CONNECT_HEAD} 1E 00 3C 00 01 'a' 00 01 't' 00 00"),
        MalformedPacket,
        0x81,
    ),
    (
        "will flag without will",
        4,
        h(f"10 0D {CONNECT_HEAD} 06 00 3C 00 01 'a'"),
        MalformedPacket,
        0x81,
    ),
    (
        "password without user name 3.1.1",
        4,
        h(f"10 10 {CONNECT_HEAD} 42 00 3C 00 01 'a' 00 01 'p'"),
        MalformedPacket,
        0x81,
    ),
    (
        "user name flag without user name",
        4,
        h(f"10 0D {CONNECT_HEAD} 82 00 3C 00 01 'a'"),
        MalformedPacket,
        0x81,
    ),
    ("connect truncated before flags", 4, h(f"10 07 {CONNECT_HEAD}"), MalformedPacket, 0x81),
]


@pytest.mark.parametrize(
    ("level", "data", "error", "reason"), [r[1:] for r in REJECTED], ids=[r[0] for r in REJECTED]
)
def test_rejected(level: int, data: bytes, error: type[RemoteProtocolError], reason: int) -> None:
    decoder = PacketDecoder(protocol_level=level)
    decoder.feed(data)
    with pytest.raises(error) as info:
        decoder.next_packet()
    assert type(info.value) is error
    assert info.value.reason_code == reason
    assert not info.value.message.startswith("undecodable")


@pytest.mark.parametrize(
    ("data", "seen_level"),
    [
        (h("10 0F 00 04 'MQTT' 06 02 00 3C 00 03 'abc'"), 6),
        (h("10 0F 00 04 'MQTT' 03 02 00 3C 00 03 'abc'"), 3),
        (h("10 11 00 06 'MQIsdp' 04 02 00 3C 00 03 'abc'"), 4),
        (h("10 11 00 06 'MQIsdp' 05 02 00 3C 00 03 'abc'"), 5),
        (h("10 0F 00 04 'MQTT' 82 02 00 3C 00 03 'abc'"), 2),
    ],
)
def test_unsupported_protocol(data: bytes, seen_level: int) -> None:
    decoder = PacketDecoder(protocol_level=5)
    decoder.feed(data)
    with pytest.raises(UnsupportedProtocolVersion) as info:
        decoder.next_packet()
    assert info.value.reason_code == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION
    assert info.value.protocol_level == seen_level


@pytest.mark.parametrize("name", ["MQTX", "mqtt", "HTTP", ""])
def test_an_unknown_protocol_name_is_no_mqtt_connect(name: str) -> None:
    """[MQTT-3.1.2-1]: not a version we do not speak, but no MQTT at all (closed without a
    CONNACK)."""
    body = len(name).to_bytes(2, "big") + name.encode() + h("04 02 00 3C 00 03 'abc'")
    decoder = PacketDecoder(protocol_level=5)
    decoder.feed(bytes((0x10, len(body))) + body)
    with pytest.raises(ProtocolViolation, match="unknown protocol name"):
        decoder.next_packet()


def test_connect_decodes_at_any_decoder_level() -> None:
    for packet in (Connect("a", "MQIsdp", 3), Connect("a"), Connect("a", protocol_level=5)):
        data = encode(packet, 4)
        for level in (3, 4, 5):
            assert decode_one(data, level) == packet


def test_packet_too_large_before_the_body_arrives() -> None:
    decoder = PacketDecoder(max_packet_size=100)
    decoder.feed(h("30 FF 01"))  # 3 + 255 bytes announced, none of the body sent
    with pytest.raises(PacketTooLarge) as info:
        decoder.next_packet()
    assert info.value.reason_code == 0x95
    # The limit counts the fixed header: 98 + 2 fits, 99 + 2 does not.
    decoder = PacketDecoder(max_packet_size=100)
    decoder.feed(encode(Publish("t", b"x" * 95), 4))
    assert decoder.next_packet() == Publish("t", b"x" * 95)
    decoder.feed(encode(Publish("t", b"x" * 96), 4)[:2])
    with pytest.raises(PacketTooLarge):
        decoder.next_packet()


def test_errors_are_sticky() -> None:
    decoder = PacketDecoder()
    decoder.feed(h("00 00"))
    with pytest.raises(MalformedPacket) as first:
        decoder.next_packet()
    decoder.feed(h("C0 00"))
    with pytest.raises(MalformedPacket) as second:
        decoder.next_packet()
    assert second.value is first.value
    assert decoder.buffered == 0


def test_protocol_level_is_settable() -> None:
    decoder = PacketDecoder(protocol_level=4)
    decoder.feed(encode(Connect("a", protocol_level=5), 5) + h("40 03 00 01 10"))
    connect = decoder.next_packet()
    assert isinstance(connect, Connect)
    decoder.protocol_level = connect.protocol_level
    assert decoder.next_packet() == Puback(1, 0x10)


def test_error_hierarchy() -> None:
    for cls in (MalformedPacket, ProtocolViolation, PacketTooLarge, UnsupportedProtocolVersion):
        assert issubclass(cls, RemoteProtocolError)
    assert not issubclass(LocalProtocolError, RemoteProtocolError)
    custom = RemoteProtocolError("alias", reason_code=ReasonCode.TOPIC_ALIAS_INVALID)
    assert custom.reason_code == 0x94
    assert "0x94" in repr(custom)
    assert RemoteProtocolError("x").reason_code == 0x80


# --- local errors --------------------------------------------------------------------------------

LOCAL_ERRORS: list[tuple[str, Packet, int]] = [
    ("publish qos 1 without packet id", Publish("t", b"", qos=1), 4),
    ("publish packet id 0", Publish("t", b"", qos=1, packet_id=0), 4),
    ("publish packet id 65536", Publish("t", b"", qos=2, packet_id=65536), 5),
    ("publish qos 3", Publish("t", b"", qos=3, packet_id=1), 4),
    ("publish qos 0 with packet id", Publish("t", b"", packet_id=1), 4),
    ("publish qos 0 dup", Publish("t", b"", dup=True), 5),
    ("publish topic with U+0000", Publish("a\x00", b""), 4),
    ("publish topic with surrogate", Publish("\ud800", b""), 4),
    ("publish topic too long", Publish("a" * 65536, b""), 4),
    ("publish topic alias 0", Publish("t", b"", properties=Properties(topic_alias=0)), 5),
    (
        "publish property not allowed",
        Publish("t", b"", properties=Properties(session_expiry_interval=1)),
        5,
    ),
    ("puback packet id 0", Puback(0), 4),
    ("puback reason not allowed", Puback(1, 0x81), 5),
    ("puback property not allowed", Puback(1, properties=Properties(topic_alias=1)), 5),
    ("subscribe empty", Subscribe(1, ()), 4),
    ("subscribe qos 3", Subscribe(1, (SubscriptionRequest("a", 3),)), 4),
    (
        "subscribe retain handling 3",
        Subscribe(1, (SubscriptionRequest("a", 0, False, False, 3),)),
        5,
    ),
    (
        "subscribe two subscription ids",
        Subscribe(1, (SubscriptionRequest("a"),), Properties(subscription_identifiers=(1, 2))),
        5,
    ),
    ("suback empty", Suback(1, ()), 4),
    ("suback invalid code", Suback(1, (3,)), 4),
    ("unsubscribe empty", Unsubscribe(1, ()), 4),
    ("unsuback 5 without codes", Unsuback(1), 5),
    ("unsuback 5 invalid code", Unsuback(1, (0x10,)), 5),
    ("connack 3.1.1 code without equivalent", Connack(reason_code=0x10), 4),
    ("connack 5 reason not allowed", Connack(reason_code=0x8E), 5),
    ("connect password without user name", Connect("a", password=b"p"), 4),
    ("connect unknown level", Connect("a", protocol_level=6), 4),
    ("connect wrong protocol name", Connect("a", protocol_name="MQIsdp", protocol_level=4), 4),
    ("connect will qos 3", Connect("a", will=Will("t", b"", qos=3)), 4),
    ("connect keep alive too big", Connect("a", keep_alive=65536), 4),
    ("auth before mqtt 5", Auth(), 4),
    ("disconnect reason not allowed", Disconnect(0x01), 5),
    ("unknown level", Pingreq(), 6),
]


@pytest.mark.parametrize(
    ("packet", "level"), [e[1:] for e in LOCAL_ERRORS], ids=[e[0] for e in LOCAL_ERRORS]
)
def test_local_errors(packet: Packet, level: int) -> None:
    with pytest.raises(LocalProtocolError):
        encode(packet, level)


def test_encode_rejects_non_packets() -> None:
    with pytest.raises(LocalProtocolError):
        encode(object(), 4)  # type: ignore[arg-type]


def test_encode_publish_rejects_bad_level() -> None:
    with pytest.raises(LocalProtocolError):
        encode_publish(
            "t",
            b"",
            qos=0,
            retain=False,
            dup=False,
            packet_id=None,
            properties=NO_PROPERTIES,
            protocol_level=2,
        )


# --- reason codes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "code"),
    [
        (0x00, ConnectReturnCode.ACCEPTED),
        (0x84, ConnectReturnCode.UNACCEPTABLE_PROTOCOL_VERSION),
        (0x85, ConnectReturnCode.IDENTIFIER_REJECTED),
        (0x86, ConnectReturnCode.BAD_USER_NAME_OR_PASSWORD),
        (0x87, ConnectReturnCode.NOT_AUTHORIZED),
        (0x8A, ConnectReturnCode.NOT_AUTHORIZED),
        (0x8C, ConnectReturnCode.NOT_AUTHORIZED),
        (0x88, ConnectReturnCode.SERVER_UNAVAILABLE),
        (0x89, ConnectReturnCode.SERVER_UNAVAILABLE),
        (0x9F, ConnectReturnCode.SERVER_UNAVAILABLE),
        (0x80, ConnectReturnCode.SERVER_UNAVAILABLE),
        (0x9B, ConnectReturnCode.SERVER_UNAVAILABLE),
        (4, 4),
    ],
)
def test_v3_connack_code(reason: int, code: int) -> None:
    assert v3_connack_code(reason) == code


def test_reason_code_aliases() -> None:
    assert ReasonCode(0) is ReasonCode.SUCCESS
    for alias in ("NORMAL_DISCONNECTION", "GRANTED_QOS_0"):
        assert ReasonCode[alias] is ReasonCode.SUCCESS
    assert [int(code) for code in ReasonCode][-1] == 0xA2
    assert len(ReasonCode) == 43
