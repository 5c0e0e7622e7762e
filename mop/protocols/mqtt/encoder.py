"""Encoding of MQTT packets (levels 3, 4 and 5), including the delivery fast path
`encode_publish`. `mop.protocols.mqtt.codec` is the public entry point and re-exports these.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any, Final

from mop.protocols.mqtt.errors import (
    LocalProtocolError,
)
from mop.protocols.mqtt.packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    PacketType,
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
    Unsuback,
    Unsubscribe,
)
from mop.protocols.mqtt.properties import (
    MAX_VARINT,
    WILL,
    encode_binary,
    encode_properties,
    encode_utf8,
    encode_varint,
)
from mop.protocols.mqtt.reason_codes import REASON_CODES_BY_PACKET, v3_connack_code

# The protocol name each level announces in CONNECT.
PROTOCOL_NAMES: Final = {3: "MQIsdp", 4: "MQTT", 5: "MQTT"}


def _frame(first_byte: int, parts: list[bytes]) -> bytes:
    remaining = sum(map(len, parts))
    if remaining > MAX_VARINT:
        raise LocalProtocolError(f"packet body of {remaining} bytes exceeds the MQTT maximum")
    return b"".join((bytes((first_byte,)), encode_varint(remaining), *parts))


def _packet_id_bytes(packet_id: int | None) -> bytes:
    if packet_id is None or not 0 < packet_id <= 0xFFFF:
        raise LocalProtocolError(f"packet identifier must be 1..65535, not {packet_id}")
    return packet_id.to_bytes(2, "big")


def _reason_byte(reason: int, packet_type: PacketType) -> bytes:
    if reason not in REASON_CODES_BY_PACKET[packet_type]:
        raise LocalProtocolError(f"reason code {reason:#04x} is not valid in {packet_type.name}")
    return bytes((reason,))


def _check_qos(qos: int, what: str) -> None:
    if qos not in (0, 1, 2):
        raise LocalProtocolError(f"{what} QoS must be 0, 1 or 2, not {qos}")


def encode_publish(
    topic: str,
    payload: bytes,
    *,
    qos: int,
    retain: bool,
    dup: bool,
    packet_id: int | None,
    properties: Properties,
    protocol_level: int,
) -> bytes:
    """Encode a PUBLISH without building a `Publish` first: the broker's delivery path.

    The payload is copied exactly once, into the returned bytes.
    """
    topic_field = _topic_field(topic)
    if qos == 0:
        if packet_id is not None or dup:
            raise LocalProtocolError("a QoS 0 PUBLISH has no packet identifier and no DUP flag")
        id_bytes = b""
    elif qos == 1 or qos == 2:
        id_bytes = _packet_id_bytes(packet_id)
    else:
        raise LocalProtocolError(f"PUBLISH QoS must be 0, 1 or 2, not {qos}")
    if protocol_level == 5:
        props = encode_properties(properties, PacketType.PUBLISH)
    elif protocol_level == 4 or protocol_level == 3:
        props = b""
    else:
        raise LocalProtocolError(f"unknown protocol level {protocol_level}")
    remaining = len(topic_field) + len(id_bytes) + len(props) + len(payload)
    if remaining > MAX_VARINT:
        raise LocalProtocolError(f"PUBLISH body of {remaining} bytes exceeds the MQTT maximum")
    first = 0x30 | (0x08 if dup else 0) | (qos << 1) | (0x01 if retain else 0)
    return b"".join(
        (_FIXED_BYTES[first], encode_varint(remaining), topic_field, id_bytes, props, payload)
    )


_FIXED_BYTES: Final = tuple(bytes((value,)) for value in range(256))


@lru_cache(maxsize=4096)
def _topic_field(topic: str) -> bytes:
    """A topic name as a PUBLISH carries it (length and UTF-8), checked: made once per name,
    as the same names go out in message after message."""
    if "\x00" in topic:
        raise LocalProtocolError("topic must not contain U+0000")
    try:
        topic_bytes = topic.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise LocalProtocolError(f"topic is not encodable as UTF-8: {exc.reason}") from None
    if len(topic_bytes) > 0xFFFF:
        raise LocalProtocolError("topic longer than 65535 bytes")
    return len(topic_bytes).to_bytes(2, "big") + topic_bytes


def _encode_connect(p: Connect, level: int) -> bytes:
    # CONNECT announces its own level, whatever level the caller encodes at.
    level = p.protocol_level
    name = PROTOCOL_NAMES.get(level)
    if name is None:
        raise LocalProtocolError(f"unknown protocol level {level}")
    if p.protocol_name not in ("MQTT", name):
        raise LocalProtocolError(f"protocol name {p.protocol_name!r} for level {level}")
    if p.password is not None and p.username is None and level < 5:
        raise LocalProtocolError("a password needs a user name before MQTT 5")
    if not 0 <= p.keep_alive <= 0xFFFF:
        raise LocalProtocolError(f"keep alive must be 0..65535, not {p.keep_alive}")
    flags = (0x02 if p.clean_start else 0) | (0x80 if p.username is not None else 0)
    flags |= 0x40 if p.password is not None else 0
    will = p.will
    if will is not None:
        _check_qos(will.qos, "will")
        flags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
    parts = [
        encode_utf8(name),
        bytes((level | (0x80 if p.bridge else 0), flags)),
        p.keep_alive.to_bytes(2, "big"),
    ]
    if level == 5:
        parts.append(encode_properties(p.properties, PacketType.CONNECT))
    parts.append(encode_utf8(p.client_id))
    if will is not None:
        if level == 5:
            parts.append(encode_properties(will.properties, WILL))
        parts.append(encode_utf8(will.topic))
        parts.append(encode_binary(will.payload))
    if p.username is not None:
        parts.append(encode_utf8(p.username))
    if p.password is not None:
        parts.append(encode_binary(p.password))
    return _frame(0x10, parts)


def _encode_connack(p: Connack, level: int) -> bytes:
    # MQTT 3.1 has no session present flag: its first byte is reserved.
    flags = b"\x01" if p.session_present and level >= 4 else b"\x00"
    if level == 5:
        return _frame(
            0x20,
            [
                flags,
                _reason_byte(p.reason_code, PacketType.CONNACK),
                encode_properties(p.properties, PacketType.CONNACK),
            ],
        )
    # Levels 3/4 take either a return code 0..5 or an MQTT 5 reason code to translate.
    code = p.reason_code
    if not (0 <= code <= 5 or code in REASON_CODES_BY_PACKET[PacketType.CONNACK]):
        raise LocalProtocolError(f"CONNACK code {code:#04x} has no 3.1.1 equivalent")
    return _frame(0x20, [flags, bytes((v3_connack_code(code),))])


def _encode_publish(p: Publish, level: int) -> bytes:
    return encode_publish(
        p.topic,
        p.payload,
        qos=p.qos,
        retain=p.retain,
        dup=p.dup,
        packet_id=p.packet_id,
        properties=p.properties,
        protocol_level=level,
    )


def _encode_reason_tail(reason: int, props: Properties, packet_type: PacketType) -> list[bytes]:
    """The shortest MQTT 5 form: omit properties when empty, and the reason too when 0."""
    reason_byte = _reason_byte(reason, packet_type)
    encoded = encode_properties(props, packet_type)
    if encoded != b"\x00":
        return [reason_byte, encoded]
    return [reason_byte] if reason else []


def _ack_encoder(
    packet_type: PacketType, first_byte: int
) -> Callable[[Puback | Pubrec | Pubrel | Pubcomp, int], bytes]:
    def encode(p: Puback | Pubrec | Pubrel | Pubcomp, level: int) -> bytes:
        id_bytes = _packet_id_bytes(p.packet_id)
        if level < 5:
            return _frame(first_byte, [id_bytes])  # no reason code before MQTT 5
        return _frame(
            first_byte, [id_bytes, *_encode_reason_tail(p.reason_code, p.properties, packet_type)]
        )

    return encode


def _encode_subscribe(p: Subscribe, level: int) -> bytes:
    if not p.subscriptions:
        raise LocalProtocolError("SUBSCRIBE needs at least one topic filter")
    parts = [_packet_id_bytes(p.packet_id)]
    if level == 5:
        parts.append(encode_properties(p.properties, PacketType.SUBSCRIBE))
    for sub in p.subscriptions:
        _check_qos(sub.qos, "subscription")
        options = sub.qos
        if level == 5:
            if sub.retain_handling not in (0, 1, 2):
                raise LocalProtocolError(f"retain handling must be 0..2: {sub.retain_handling}")
            options |= (0x04 if sub.no_local else 0) | (0x08 if sub.retain_as_published else 0)
            options |= sub.retain_handling << 4
        parts.append(encode_utf8(sub.topic_filter))
        parts.append(bytes((options,)))
    return _frame(0x82, parts)


def _encode_suback(p: Suback, level: int) -> bytes:
    if not p.reason_codes:
        raise LocalProtocolError("SUBACK needs at least one reason code")
    parts = [_packet_id_bytes(p.packet_id)]
    valid = REASON_CODES_BY_PACKET[PacketType.SUBACK]
    if any(code not in valid for code in p.reason_codes):
        raise LocalProtocolError(f"invalid SUBACK reason codes {p.reason_codes}")
    if level == 5:
        parts.append(encode_properties(p.properties, PacketType.SUBACK))
        parts.append(bytes(p.reason_codes))
    else:
        # Before MQTT 5 every refusal is the single failure code 0x80.
        parts.append(bytes(code if code < 0x80 else 0x80 for code in p.reason_codes))
    return _frame(0x90, parts)


def _encode_unsubscribe(p: Unsubscribe, level: int) -> bytes:
    if not p.topic_filters:
        raise LocalProtocolError("UNSUBSCRIBE needs at least one topic filter")
    parts = [_packet_id_bytes(p.packet_id)]
    if level == 5:
        parts.append(encode_properties(p.properties, PacketType.UNSUBSCRIBE))
    parts.extend(encode_utf8(topic_filter) for topic_filter in p.topic_filters)
    return _frame(0xA2, parts)


def _encode_unsuback(p: Unsuback, level: int) -> bytes:
    id_bytes = _packet_id_bytes(p.packet_id)
    if level < 5:
        return _frame(0xB0, [id_bytes])
    if not p.reason_codes:
        raise LocalProtocolError("an MQTT 5 UNSUBACK needs one reason code per topic filter")
    props = encode_properties(p.properties, PacketType.UNSUBACK)
    return _frame(
        0xB0,
        [id_bytes, props, *(_reason_byte(code, PacketType.UNSUBACK) for code in p.reason_codes)],
    )


def _encode_disconnect(p: Disconnect, level: int) -> bytes:
    if level < 5:
        return b"\xe0\x00"
    return _frame(0xE0, _encode_reason_tail(p.reason_code, p.properties, PacketType.DISCONNECT))


def _encode_auth(p: Auth, level: int) -> bytes:
    if level < 5:
        raise LocalProtocolError("AUTH exists only in MQTT 5")
    return _frame(0xF0, _encode_reason_tail(p.reason_code, p.properties, PacketType.AUTH))


def _constant(data: bytes) -> Callable[[Any, int], bytes]:
    return lambda packet, level: data


_ENCODERS: Final[dict[type, Callable[[Any, int], bytes]]] = {
    Connect: _encode_connect,
    Connack: _encode_connack,
    Publish: _encode_publish,
    Puback: _ack_encoder(PacketType.PUBACK, 0x40),
    Pubrec: _ack_encoder(PacketType.PUBREC, 0x50),
    Pubrel: _ack_encoder(PacketType.PUBREL, 0x62),
    Pubcomp: _ack_encoder(PacketType.PUBCOMP, 0x70),
    Subscribe: _encode_subscribe,
    Suback: _encode_suback,
    Unsubscribe: _encode_unsubscribe,
    Unsuback: _encode_unsuback,
    Pingreq: _constant(b"\xc0\x00"),
    Pingresp: _constant(b"\xd0\x00"),
    Disconnect: _encode_disconnect,
    Auth: _encode_auth,
}


def encode(packet: Packet, protocol_level: int) -> bytes:
    """Encode one packet for a peer speaking `protocol_level` (3, 4 or 5).

    Levels 3/4 drop what they cannot express: properties, ack reason codes, MQTT 5 subscription
    options. CONNECT is encoded at its own `protocol_level`.
    """
    if protocol_level not in PROTOCOL_NAMES:
        raise LocalProtocolError(f"unknown protocol level {protocol_level}")
    encoder = _ENCODERS.get(type(packet))
    if encoder is None:
        raise LocalProtocolError(f"not an MQTT packet: {packet!r}")
    return encoder(packet, protocol_level)
