"""MQTT wire data types (spec 1.5) and the MQTT 5 property table (spec 2.2.2).

Readers take a `memoryview` and an offset and return `(value, next_offset)`; writers return bytes.
Properties are one table, id -> field of `Properties`, data type, packet types that allow it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import IntEnum
from types import MappingProxyType
from typing import Any, NamedTuple

from mop.protocols.mqtt.errors import (
    LocalProtocolError,
    MalformedPacket,
    ProtocolViolation,
    RemoteProtocolError,
)
from mop.protocols.mqtt.packets import NO_PROPERTIES, PacketType, Properties
from mop.protocols.mqtt.reason_codes import ReasonCode

MAX_VARINT = 268_435_455
# Property context of the will properties inside CONNECT; no packet type has the value 0.
WILL = 0

# Most varints on the wire are lengths below 128; a fixed table of one-byte objects saves work.
_ONE_BYTE = tuple(bytes((i,)) for i in range(256))


# --- readers -------------------------------------------------------------------------------------


def read_byte(mv: memoryview, pos: int) -> tuple[int, int]:
    if pos >= len(mv):
        raise MalformedPacket("packet ends inside a byte field")
    return mv[pos], pos + 1


def read_u16(mv: memoryview, pos: int) -> tuple[int, int]:
    if pos + 2 > len(mv):
        raise MalformedPacket("packet ends inside a two byte integer")
    return (mv[pos] << 8) | mv[pos + 1], pos + 2


def read_u32(mv: memoryview, pos: int) -> tuple[int, int]:
    if pos + 4 > len(mv):
        raise MalformedPacket("packet ends inside a four byte integer")
    return int.from_bytes(mv[pos : pos + 4], "big"), pos + 4


def read_varint(mv: memoryview, pos: int) -> tuple[int, int]:
    """Read a variable byte integer. Non-minimal encodings are accepted, as most brokers do."""
    value = 0
    shift = 0
    end = len(mv)
    while shift < 28:
        if pos >= end:
            raise MalformedPacket("packet ends inside a variable byte integer")
        byte = mv[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise MalformedPacket("variable byte integer longer than 4 bytes")


def read_utf8(mv: memoryview, pos: int) -> tuple[str, int]:
    """Read a length-prefixed UTF-8 string; invalid UTF-8, surrogates and U+0000 are malformed."""
    if pos + 2 > len(mv):
        raise MalformedPacket("packet ends inside a string length")
    end = pos + 2 + ((mv[pos] << 8) | mv[pos + 1])
    if end > len(mv):
        raise MalformedPacket("string runs past the end of the packet")
    try:
        text = str(mv[pos + 2 : end], "utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedPacket(f"invalid UTF-8 string: {exc.reason}") from None
    if "\x00" in text:
        raise MalformedPacket("UTF-8 string contains U+0000")
    return text, end


def read_binary(mv: memoryview, pos: int) -> tuple[bytes, int]:
    if pos + 2 > len(mv):
        raise MalformedPacket("packet ends inside a binary data length")
    end = pos + 2 + ((mv[pos] << 8) | mv[pos + 1])
    if end > len(mv):
        raise MalformedPacket("binary data runs past the end of the packet")
    return mv[pos + 2 : end].tobytes(), end


def read_pair(mv: memoryview, pos: int) -> tuple[tuple[str, str], int]:
    key, pos = read_utf8(mv, pos)
    value, pos = read_utf8(mv, pos)
    return (key, value), pos


# --- writers -------------------------------------------------------------------------------------


def encode_varint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _ONE_BYTE[value]
    if not 0 <= value <= MAX_VARINT:
        raise LocalProtocolError(f"{value} does not fit a variable byte integer")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_utf8(text: str) -> bytes:
    if "\x00" in text:
        raise LocalProtocolError("MQTT strings must not contain U+0000")
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise LocalProtocolError(f"string is not encodable as UTF-8: {exc.reason}") from None
    if len(data) > 0xFFFF:
        raise LocalProtocolError("MQTT strings are limited to 65535 bytes")
    return len(data).to_bytes(2, "big") + data


def encode_binary(data: bytes) -> bytes:
    if len(data) > 0xFFFF:
        raise LocalProtocolError("MQTT binary data is limited to 65535 bytes")
    return len(data).to_bytes(2, "big") + data


def _write_byte(value: int) -> bytes:
    return _ONE_BYTE[value]


def _write_u16(value: int) -> bytes:
    return value.to_bytes(2, "big")


def _write_u32(value: int) -> bytes:
    return value.to_bytes(4, "big")


def _write_pair(pair: tuple[str, str]) -> bytes:
    return encode_utf8(pair[0]) + encode_utf8(pair[1])


# --- the property table --------------------------------------------------------------------------


class DataType(NamedTuple):
    """One MQTT data type: how to read and write it; `limit` is the largest integer it holds."""

    name: str
    read: Callable[[memoryview, int], tuple[Any, int]]
    write: Callable[[Any], bytes]
    limit: int | None = None


BYTE = DataType("byte", read_byte, _write_byte, 0xFF)
TWO_BYTE_INT = DataType("two byte integer", read_u16, _write_u16, 0xFFFF)
FOUR_BYTE_INT = DataType("four byte integer", read_u32, _write_u32, 0xFFFF_FFFF)
VARINT = DataType("variable byte integer", read_varint, encode_varint, MAX_VARINT)
UTF8 = DataType("UTF-8 string", read_utf8, encode_utf8)
BINARY = DataType("binary data", read_binary, encode_binary)
STRING_PAIR = DataType("UTF-8 string pair", read_pair, _write_pair)


class PropertyId(IntEnum):
    PAYLOAD_FORMAT_INDICATOR = 0x01
    MESSAGE_EXPIRY_INTERVAL = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_IDENTIFIER = 0x0B
    SESSION_EXPIRY_INTERVAL = 0x11
    ASSIGNED_CLIENT_IDENTIFIER = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTHENTICATION_METHOD = 0x15
    AUTHENTICATION_DATA = 0x16
    REQUEST_PROBLEM_INFORMATION = 0x17
    WILL_DELAY_INTERVAL = 0x18
    REQUEST_RESPONSE_INFORMATION = 0x19
    RESPONSE_INFORMATION = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
    SHARED_SUBSCRIPTION_AVAILABLE = 0x2A


class PropertySpec(NamedTuple):
    """A row of the property table.

    `contexts` are the packet types (and `WILL`) that may carry the property. `repeatable_in` are
    the contexts where it may appear more than once; `repeated` properties have a tuple field in
    `Properties`. Integer values must lie in `minimum..maximum` (e.g. topic alias 0 is invalid);
    `maximum` is None for strings and binary data.
    """

    id: PropertyId
    field: str
    kind: DataType
    contexts: frozenset[int]
    minimum: int
    maximum: int | None
    repeatable_in: frozenset[int]
    repeated: bool


def _row(
    ident: PropertyId,
    field: str,
    kind: DataType,
    contexts: frozenset[int],
    *,
    minimum: int = 0,
    maximum: int | None = None,
    repeatable_in: frozenset[int] = frozenset(),
) -> PropertySpec:
    return PropertySpec(
        ident,
        field,
        kind,
        contexts,
        minimum,
        kind.limit if maximum is None else maximum,
        repeatable_in,
        bool(repeatable_in),
    )


_T = PacketType
_P = PropertyId
_PUBLISH_OR_WILL = frozenset({_T.PUBLISH, WILL})
_ANY_WITH_PROPERTIES = frozenset(
    {
        _T.CONNECT,
        _T.CONNACK,
        _T.PUBLISH,
        WILL,
        _T.PUBACK,
        _T.PUBREC,
        _T.PUBREL,
        _T.PUBCOMP,
        _T.SUBSCRIBE,
        _T.SUBACK,
        _T.UNSUBSCRIBE,
        _T.UNSUBACK,
        _T.DISCONNECT,
        _T.AUTH,
    }
)


def _ctx(*types: int) -> frozenset[int]:
    return frozenset(types)


_TABLE = (
    _row(
        _P.PAYLOAD_FORMAT_INDICATOR, "payload_format_indicator", BYTE, _PUBLISH_OR_WILL, maximum=1
    ),
    _row(_P.MESSAGE_EXPIRY_INTERVAL, "message_expiry_interval", FOUR_BYTE_INT, _PUBLISH_OR_WILL),
    _row(_P.CONTENT_TYPE, "content_type", UTF8, _PUBLISH_OR_WILL),
    _row(_P.RESPONSE_TOPIC, "response_topic", UTF8, _PUBLISH_OR_WILL),
    _row(_P.CORRELATION_DATA, "correlation_data", BINARY, _PUBLISH_OR_WILL),
    # Several subscription identifiers may reach a subscriber in one PUBLISH; SUBSCRIBE has one.
    _row(
        _P.SUBSCRIPTION_IDENTIFIER,
        "subscription_identifiers",
        VARINT,
        _ctx(_T.PUBLISH, _T.SUBSCRIBE),
        minimum=1,
        repeatable_in=_ctx(_T.PUBLISH),
    ),
    _row(
        _P.SESSION_EXPIRY_INTERVAL,
        "session_expiry_interval",
        FOUR_BYTE_INT,
        _ctx(_T.CONNECT, _T.CONNACK, _T.DISCONNECT),
    ),
    _row(_P.ASSIGNED_CLIENT_IDENTIFIER, "assigned_client_identifier", UTF8, _ctx(_T.CONNACK)),
    _row(_P.SERVER_KEEP_ALIVE, "server_keep_alive", TWO_BYTE_INT, _ctx(_T.CONNACK)),
    _row(
        _P.AUTHENTICATION_METHOD,
        "authentication_method",
        UTF8,
        _ctx(_T.CONNECT, _T.CONNACK, _T.AUTH),
    ),
    _row(
        _P.AUTHENTICATION_DATA, "authentication_data", BINARY, _ctx(_T.CONNECT, _T.CONNACK, _T.AUTH)
    ),
    _row(
        _P.REQUEST_PROBLEM_INFORMATION,
        "request_problem_information",
        BYTE,
        _ctx(_T.CONNECT),
        maximum=1,
    ),
    _row(_P.WILL_DELAY_INTERVAL, "will_delay_interval", FOUR_BYTE_INT, _ctx(WILL)),
    _row(
        _P.REQUEST_RESPONSE_INFORMATION,
        "request_response_information",
        BYTE,
        _ctx(_T.CONNECT),
        maximum=1,
    ),
    _row(_P.RESPONSE_INFORMATION, "response_information", UTF8, _ctx(_T.CONNACK)),
    _row(_P.SERVER_REFERENCE, "server_reference", UTF8, _ctx(_T.CONNACK, _T.DISCONNECT)),
    _row(
        _P.REASON_STRING,
        "reason_string",
        UTF8,
        _ctx(
            _T.CONNACK,
            _T.PUBACK,
            _T.PUBREC,
            _T.PUBREL,
            _T.PUBCOMP,
            _T.SUBACK,
            _T.UNSUBACK,
            _T.DISCONNECT,
            _T.AUTH,
        ),
    ),
    _row(
        _P.RECEIVE_MAXIMUM, "receive_maximum", TWO_BYTE_INT, _ctx(_T.CONNECT, _T.CONNACK), minimum=1
    ),
    _row(_P.TOPIC_ALIAS_MAXIMUM, "topic_alias_maximum", TWO_BYTE_INT, _ctx(_T.CONNECT, _T.CONNACK)),
    _row(_P.TOPIC_ALIAS, "topic_alias", TWO_BYTE_INT, _ctx(_T.PUBLISH), minimum=1),
    _row(_P.MAXIMUM_QOS, "maximum_qos", BYTE, _ctx(_T.CONNACK), maximum=1),
    _row(_P.RETAIN_AVAILABLE, "retain_available", BYTE, _ctx(_T.CONNACK), maximum=1),
    _row(
        _P.USER_PROPERTY,
        "user_properties",
        STRING_PAIR,
        _ANY_WITH_PROPERTIES,
        repeatable_in=_ANY_WITH_PROPERTIES,
    ),
    _row(
        _P.MAXIMUM_PACKET_SIZE,
        "maximum_packet_size",
        FOUR_BYTE_INT,
        _ctx(_T.CONNECT, _T.CONNACK),
        minimum=1,
    ),
    _row(
        _P.WILDCARD_SUBSCRIPTION_AVAILABLE,
        "wildcard_subscription_available",
        BYTE,
        _ctx(_T.CONNACK),
        maximum=1,
    ),
    _row(
        _P.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        "subscription_identifier_available",
        BYTE,
        _ctx(_T.CONNACK),
        maximum=1,
    ),
    _row(
        _P.SHARED_SUBSCRIPTION_AVAILABLE,
        "shared_subscription_available",
        BYTE,
        _ctx(_T.CONNACK),
        maximum=1,
    ),
)

PROPERTY_SPECS: Mapping[int, PropertySpec] = MappingProxyType({s.id: s for s in _TABLE})
# Precomputed identifier bytes, in table order (which is also the encoding order).
_ENCODING_ORDER = tuple((spec, _ONE_BYTE[spec.id]) for spec in _TABLE)


_REPEATED_FIELDS = tuple(spec.field for spec in _TABLE if spec.repeated)


def context_name(context: int) -> str:
    return "will properties" if context == WILL else PacketType(context).name


def decode_properties(mv: memoryview, pos: int, context: int) -> tuple[Properties, int]:
    """Read a property length and the properties it covers, for a packet type (or `WILL`)."""
    length, pos = read_varint(mv, pos)
    if length == 0:
        return NO_PROPERTIES, pos
    end = pos + length
    if end > len(mv):
        raise MalformedPacket("property length runs past the end of the packet")
    view = mv[:end]  # readers then cannot run into the payload
    values: dict[str, Any] = {}
    while pos < end:
        ident, pos = read_varint(view, pos)
        spec = PROPERTY_SPECS.get(ident)
        if spec is None:
            raise MalformedPacket(f"unknown property identifier 0x{ident:02X}")
        if context not in spec.contexts:
            raise MalformedPacket(
                f"property {spec.field} is not allowed in {context_name(context)}"
            )
        value, pos = spec.kind.read(view, pos)
        if spec.maximum is not None and not spec.minimum <= value <= spec.maximum:
            if ident == PropertyId.TOPIC_ALIAS:
                # Alias 0 is as invalid as one above the maximum: Topic Alias invalid (0x94).
                raise RemoteProtocolError(
                    f"topic alias {value} is invalid", reason_code=ReasonCode.TOPIC_ALIAS_INVALID
                )
            raise ProtocolViolation(f"property {spec.field} has invalid value {value}")
        if ident == PropertyId.RESPONSE_TOPIC and ("+" in value or "#" in value):
            # A topic name, never a filter [MQTT-3.3.2-14].
            raise MalformedPacket(f"response topic {value!r} contains a wildcard")
        if spec.field in values and context not in spec.repeatable_in:
            raise ProtocolViolation(f"property {spec.field} appears more than once")
        if spec.repeated:
            values.setdefault(spec.field, []).append(value)
        else:
            values[spec.field] = value
    for field in _REPEATED_FIELDS:
        if field in values:
            values[field] = tuple(values[field])
    return Properties(**values), pos


def encode_properties(props: Properties, context: int) -> bytes:
    """Encode properties with their length prefix; `b"\\x00"` when there are none."""
    if props is NO_PROPERTIES:
        return b"\x00"
    parts: list[bytes] = []
    for spec, ident in _ENCODING_ORDER:
        value = getattr(props, spec.field)
        if value is None or value == ():
            continue
        if context not in spec.contexts:
            raise LocalProtocolError(
                f"property {spec.field} is not allowed in {context_name(context)}"
            )
        items = value if spec.repeated else (value,)
        if len(items) > 1 and context not in spec.repeatable_in:
            raise LocalProtocolError(
                f"property {spec.field} may appear only once in {context_name(context)}"
            )
        for item in items:
            if spec.maximum is not None and not spec.minimum <= item <= spec.maximum:
                raise LocalProtocolError(f"property {spec.field} has invalid value {item}")
            parts.append(ident)
            parts.append(spec.kind.write(item))
    if not parts:
        return b"\x00"
    body = b"".join(parts)
    return encode_varint(len(body)) + body


__all__ = [
    "BINARY",
    "BYTE",
    "DataType",
    "FOUR_BYTE_INT",
    "MAX_VARINT",
    "PROPERTY_SPECS",
    "PropertyId",
    "PropertySpec",
    "STRING_PAIR",
    "TWO_BYTE_INT",
    "UTF8",
    "VARINT",
    "WILL",
    "context_name",
    "decode_properties",
    "encode_binary",
    "encode_properties",
    "encode_utf8",
    "encode_varint",
    "read_binary",
    "read_byte",
    "read_pair",
    "read_u16",
    "read_u32",
    "read_utf8",
    "read_varint",
]
