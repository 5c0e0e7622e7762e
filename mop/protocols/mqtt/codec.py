"""Sans-IO codec for MQTT 3.1, 3.1.1 and 5.0 (protocol levels 3, 4 and 5).

`PacketDecoder` turns a byte stream into packet dataclasses one at a time; `encode` and the
delivery fast path `encode_publish` turn packets into bytes. No I/O, no concurrency library.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeVar

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
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
    Will,
)
from mop.protocols.mqtt.properties import (
    MAX_VARINT,
    WILL,
    decode_properties,
    encode_binary,
    encode_properties,
    encode_utf8,
    encode_varint,
    read_binary,
    read_byte,
    read_u16,
    read_utf8,
)
from mop.protocols.mqtt.reason_codes import REASON_CODES_BY_PACKET, V3_SUBACK_CODES, v3_connack_code


class NeedData:
    """Type of `NEED_DATA`, returned by `PacketDecoder.next_packet` until a packet is complete."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = NeedData()

# One fixed header byte, up to four remaining-length bytes, and the largest remaining length.
MAX_PACKET_SIZE: Final = MAX_VARINT + 5
PROTOCOL_NAMES: Final = {3: "MQIsdp", 4: "MQTT", 5: "MQTT"}

# Fixed header flags each packet type must carry (spec 2.1.3); PUBLISH carries dup/qos/retain.
_REQUIRED_FLAGS: Final[dict[int, int]] = {
    PacketType.CONNECT: 0, PacketType.CONNACK: 0, PacketType.PUBACK: 0, PacketType.PUBREC: 0,
    PacketType.PUBREL: 2, PacketType.PUBCOMP: 0, PacketType.SUBSCRIBE: 2, PacketType.SUBACK: 0,
    PacketType.UNSUBSCRIBE: 2, PacketType.UNSUBACK: 0, PacketType.PINGREQ: 0,
    PacketType.PINGRESP: 0, PacketType.DISCONNECT: 0, PacketType.AUTH: 0,
}


def _check_fixed_header(packet_type: int, flags: int, level: int) -> None:
    if packet_type == PacketType.PUBLISH:
        if flags & 0x06 == 0x06:
            raise MalformedPacket("PUBLISH with QoS 3")
        if level == 5 and flags & 0x0E == 0x08:
            raise MalformedPacket("PUBLISH with QoS 0 and DUP set")
        return
    required = _REQUIRED_FLAGS.get(packet_type)
    if required is None:
        raise MalformedPacket("reserved packet type 0")
    if packet_type == PacketType.AUTH and level < 5:
        raise MalformedPacket("AUTH exists only in MQTT 5")
    if flags != required:
        raise MalformedPacket(
            f"{PacketType(packet_type).name} with fixed header flags 0b{flags:04b}"
        )


class PacketDecoder:
    """Incremental decoder: `feed` bytes as they arrive, then call `next_packet` until NEED_DATA.

    `protocol_level` selects the packet layouts after CONNECT; the server sets it from the
    CONNECT it decoded (CONNECT is decodable at any level since it names its own). Once a
    `RemoteProtocolError` is raised the decoder stays failed: every later call raises it again and
    fed bytes are dropped, because the stream can no longer be framed.
    """

    __slots__ = ("_buf", "_error", "_pos", "expect_connect", "max_packet_size", "protocol_level")

    def __init__(
        self,
        *,
        protocol_level: int = 4,
        max_packet_size: int = MAX_PACKET_SIZE,
        expect_connect: bool = False,
    ) -> None:
        self.protocol_level = protocol_level
        self.max_packet_size = max_packet_size
        # A server expecting CONNECT refuses anything else from the first byte, so a peer cannot
        # make it buffer a large bogus packet until the CONNECT timeout.
        self.expect_connect = expect_connect
        self._buf = bytearray()
        self._pos = 0  # start of the first undecoded byte in _buf
        self._error: RemoteProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Number of bytes received but not yet returned as packets."""
        return len(self._buf) - self._pos

    def feed(self, data: bytes) -> None:
        if self._error is not None:
            return
        if self._pos:
            # Drop decoded bytes once per feed, not per packet: many small packets arriving in one
            # read are walked by offset, and deleting from the front of a bytearray is cheap.
            del self._buf[:self._pos]
            self._pos = 0
        self._buf += data

    def next_packet(self) -> Packet | NeedData:
        """Decode and return the next complete packet, or NEED_DATA."""
        if self._error is not None:
            raise self._error
        try:
            return self._next_packet()
        except RemoteProtocolError as exc:
            self._fail(exc)
            raise
        except (IndexError, ValueError, TypeError, OverflowError) as exc:
            # Every check is explicit; this only keeps the promise that a peer's bytes raise
            # nothing but RemoteProtocolError should one be missing.
            error = MalformedPacket(f"undecodable packet ({type(exc).__name__}: {exc})")
            self._fail(error)
            raise error from None

    def _fail(self, error: RemoteProtocolError) -> None:
        self._error = error
        # A fresh buffer: the traceback may still hold views of the old one.
        self._buf = bytearray()
        self._pos = 0

    def _next_packet(self) -> Packet | NeedData:
        buf = self._buf
        pos = self._pos
        size = len(buf)
        if pos >= size:
            return NEED_DATA
        first = buf[pos]
        if self.expect_connect and first >> 4 != PacketType.CONNECT:
            raise ProtocolViolation(f"expected CONNECT, got packet type {first >> 4}")
        _check_fixed_header(first >> 4, first & 0x0F, self.protocol_level)
        remaining = 0
        shift = 0
        i = pos + 1
        while True:
            if i >= size:
                return NEED_DATA
            byte = buf[i]
            i += 1
            remaining |= (byte & 0x7F) << shift
            if byte < 0x80:
                break
            shift += 7
            if shift == 28:
                raise MalformedPacket("remaining length longer than 4 bytes")
        if i - pos + remaining > self.max_packet_size:
            raise PacketTooLarge(
                f"packet of {i - pos + remaining} bytes exceeds the maximum of "
                f"{self.max_packet_size}"
            )
        end = i + remaining
        if end > size:
            return NEED_DATA
        with memoryview(buf) as mv:
            packet = _DECODERS[first >> 4](mv[i:end], first & 0x0F, self.protocol_level)
        self._pos = end
        return packet


# --- decoding ------------------------------------------------------------------------------------

_Decoder = Callable[[memoryview, int, int], Packet]


def _read_packet_id(mv: memoryview, pos: int) -> tuple[int, int]:
    packet_id, pos = read_u16(mv, pos)
    if packet_id == 0:
        raise ProtocolViolation("packet identifier 0")
    return packet_id, pos


def _expect_end(mv: memoryview, pos: int, packet_type: PacketType) -> None:
    if pos != len(mv):
        raise MalformedPacket(f"{len(mv) - pos} unexpected bytes at the end of {packet_type.name}")


def _check_reason(reason: int, packet_type: PacketType) -> None:
    if reason not in REASON_CODES_BY_PACKET[packet_type]:
        raise ProtocolViolation(f"reason code 0x{reason:02X} is not valid in {packet_type.name}")


def _read_reason_and_properties(
    mv: memoryview, pos: int, packet_type: PacketType
) -> tuple[int, Properties]:
    """MQTT 5 acks, DISCONNECT and AUTH may end before the reason code or the properties."""
    end = len(mv)
    if pos == end:
        return 0, NO_PROPERTIES
    reason = mv[pos]
    _check_reason(reason, packet_type)
    if pos + 1 == end:
        return reason, NO_PROPERTIES
    props, pos = decode_properties(mv, pos + 1, packet_type)
    _expect_end(mv, pos, packet_type)
    return reason, props


def _decode_connect(mv: memoryview, flags: int, decoder_level: int) -> Connect:
    name, pos = read_utf8(mv, 0)
    level_byte, pos = read_byte(mv, pos)
    # mosquitto bridges set the top bit of the level byte to announce themselves.
    bridge = bool(level_byte & 0x80)
    level = level_byte & 0x7F
    if PROTOCOL_NAMES.get(level) != name:
        raise UnsupportedProtocolVersion(
            f"unsupported protocol {name!r} level {level}", protocol_level=level
        )
    connect_flags, pos = read_byte(mv, pos)
    if connect_flags & 0x01:
        raise MalformedPacket("CONNECT reserved flag is set")
    has_will = bool(connect_flags & 0x04)
    will_qos = (connect_flags >> 3) & 0x03
    will_retain = bool(connect_flags & 0x20)
    has_password = bool(connect_flags & 0x40)
    has_username = bool(connect_flags & 0x80)
    if will_qos == 3:
        raise MalformedPacket("CONNECT will QoS 3")
    if not has_will and (will_qos or will_retain):
        raise MalformedPacket("CONNECT will QoS or will retain set without the will flag")
    if has_password and not has_username and level < 5:
        raise MalformedPacket("CONNECT password flag set without the user name flag")
    keep_alive, pos = read_u16(mv, pos)
    props = NO_PROPERTIES
    if level == 5:
        props, pos = decode_properties(mv, pos, PacketType.CONNECT)
    client_id, pos = read_utf8(mv, pos)
    will = None
    if has_will:
        will_props = NO_PROPERTIES
        if level == 5:
            will_props, pos = decode_properties(mv, pos, WILL)
        will_topic, pos = read_utf8(mv, pos)
        will_payload, pos = read_binary(mv, pos)
        will = Will(will_topic, will_payload, will_qos, will_retain, will_props)
    username = password = None
    if has_username:
        username, pos = read_utf8(mv, pos)
    if has_password:
        password, pos = read_binary(mv, pos)
    _expect_end(mv, pos, PacketType.CONNECT)
    return Connect(
        client_id, name, level, bool(connect_flags & 0x02), keep_alive, username, password, will,
        bridge, props,
    )


def _decode_connack(mv: memoryview, flags: int, level: int) -> Connack:
    ack_flags, pos = read_byte(mv, 0)
    if ack_flags & 0xFE:
        raise MalformedPacket("CONNACK reserved flags are set")
    reason, pos = read_byte(mv, pos)
    props = NO_PROPERTIES
    if level == 5:
        _check_reason(reason, PacketType.CONNACK)
        props, pos = decode_properties(mv, pos, PacketType.CONNACK)
    elif reason > 5:
        raise ProtocolViolation(f"CONNACK return code {reason}")
    _expect_end(mv, pos, PacketType.CONNACK)
    return Connack(bool(ack_flags), reason, props)


def _decode_publish(mv: memoryview, flags: int, level: int) -> Publish:
    qos = (flags >> 1) & 0x03
    topic, pos = read_utf8(mv, 0)
    packet_id = None
    if qos:
        packet_id, pos = _read_packet_id(mv, pos)
    props = NO_PROPERTIES
    if level == 5:
        props, pos = decode_properties(mv, pos, PacketType.PUBLISH)
    return Publish(
        topic, mv[pos:].tobytes(), qos, bool(flags & 0x01), bool(flags & 0x08), packet_id, props
    )


_Ack = TypeVar("_Ack", Puback, Pubrec, Pubrel, Pubcomp)


def _ack_decoder(
    make: Callable[[int, int, Properties], _Ack], packet_type: PacketType
) -> Callable[[memoryview, int, int], _Ack]:
    def decode(mv: memoryview, flags: int, level: int) -> _Ack:
        packet_id, pos = _read_packet_id(mv, 0)
        if level < 5:
            _expect_end(mv, pos, packet_type)
            return make(packet_id, 0, NO_PROPERTIES)
        reason, props = _read_reason_and_properties(mv, pos, packet_type)
        return make(packet_id, reason, props)

    return decode


def _decode_subscribe(mv: memoryview, flags: int, level: int) -> Subscribe:
    packet_id, pos = _read_packet_id(mv, 0)
    props = NO_PROPERTIES
    if level == 5:
        props, pos = decode_properties(mv, pos, PacketType.SUBSCRIBE)
    # Bits 2-7 are reserved before MQTT 5; MQTT 5 reserves only bits 6-7.
    reserved = 0xC0 if level == 5 else 0xFC
    subscriptions = []
    end = len(mv)
    while pos < end:
        topic_filter, pos = read_utf8(mv, pos)
        options, pos = read_byte(mv, pos)
        if options & reserved:
            raise MalformedPacket("reserved bits set in subscription options")
        if options & 0x03 == 0x03:
            raise MalformedPacket("subscription with QoS 3")
        if options & 0x30 == 0x30:
            raise ProtocolViolation("subscription with retain handling 3")
        subscriptions.append(SubscriptionRequest(
            topic_filter, options & 0x03, bool(options & 0x04), bool(options & 0x08),
            (options >> 4) & 0x03,
        ))
    if not subscriptions:
        raise ProtocolViolation("SUBSCRIBE without topic filters")
    return Subscribe(packet_id, tuple(subscriptions), props)


def _decode_suback(mv: memoryview, flags: int, level: int) -> Suback:
    packet_id, pos = _read_packet_id(mv, 0)
    props = NO_PROPERTIES
    valid = V3_SUBACK_CODES
    if level == 5:
        props, pos = decode_properties(mv, pos, PacketType.SUBACK)
        valid = REASON_CODES_BY_PACKET[PacketType.SUBACK]
    codes = tuple(mv[pos:])
    if not codes:
        raise ProtocolViolation("SUBACK without return codes")
    for code in codes:
        if code not in valid:
            raise ProtocolViolation(f"SUBACK return code 0x{code:02X}")
    return Suback(packet_id, codes, props)


def _decode_unsubscribe(mv: memoryview, flags: int, level: int) -> Unsubscribe:
    packet_id, pos = _read_packet_id(mv, 0)
    props = NO_PROPERTIES
    if level == 5:
        props, pos = decode_properties(mv, pos, PacketType.UNSUBSCRIBE)
    topic_filters = []
    end = len(mv)
    while pos < end:
        topic_filter, pos = read_utf8(mv, pos)
        topic_filters.append(topic_filter)
    if not topic_filters:
        raise ProtocolViolation("UNSUBSCRIBE without topic filters")
    return Unsubscribe(packet_id, tuple(topic_filters), props)


def _decode_unsuback(mv: memoryview, flags: int, level: int) -> Unsuback:
    packet_id, pos = _read_packet_id(mv, 0)
    if level < 5:
        _expect_end(mv, pos, PacketType.UNSUBACK)
        return Unsuback(packet_id)
    props, pos = decode_properties(mv, pos, PacketType.UNSUBACK)
    codes = tuple(mv[pos:])
    if not codes:
        raise ProtocolViolation("UNSUBACK without reason codes")
    for code in codes:
        _check_reason(code, PacketType.UNSUBACK)
    return Unsuback(packet_id, codes, props)


def _empty_decoder(packet: Pingreq | Pingresp, packet_type: PacketType) -> _Decoder:
    def decode(mv: memoryview, flags: int, level: int) -> Packet:
        _expect_end(mv, 0, packet_type)
        return packet

    return decode


def _decode_disconnect(mv: memoryview, flags: int, level: int) -> Disconnect:
    if level < 5:
        _expect_end(mv, 0, PacketType.DISCONNECT)
        return Disconnect()
    return Disconnect(*_read_reason_and_properties(mv, 0, PacketType.DISCONNECT))


def _decode_auth(mv: memoryview, flags: int, level: int) -> Auth:
    return Auth(*_read_reason_and_properties(mv, 0, PacketType.AUTH))


_DECODERS: Final[dict[int, _Decoder]] = {
    PacketType.CONNECT: _decode_connect,
    PacketType.CONNACK: _decode_connack,
    PacketType.PUBLISH: _decode_publish,
    PacketType.PUBACK: _ack_decoder(Puback, PacketType.PUBACK),
    PacketType.PUBREC: _ack_decoder(Pubrec, PacketType.PUBREC),
    PacketType.PUBREL: _ack_decoder(Pubrel, PacketType.PUBREL),
    PacketType.PUBCOMP: _ack_decoder(Pubcomp, PacketType.PUBCOMP),
    PacketType.SUBSCRIBE: _decode_subscribe,
    PacketType.SUBACK: _decode_suback,
    PacketType.UNSUBSCRIBE: _decode_unsubscribe,
    PacketType.UNSUBACK: _decode_unsuback,
    PacketType.PINGREQ: _empty_decoder(Pingreq(), PacketType.PINGREQ),
    PacketType.PINGRESP: _empty_decoder(Pingresp(), PacketType.PINGRESP),
    PacketType.DISCONNECT: _decode_disconnect,
    PacketType.AUTH: _decode_auth,
}


# --- encoding ------------------------------------------------------------------------------------


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
    if "\x00" in topic:
        raise LocalProtocolError("topic must not contain U+0000")
    try:
        topic_bytes = topic.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise LocalProtocolError(f"topic is not encodable as UTF-8: {exc.reason}") from None
    topic_length = len(topic_bytes)
    if topic_length > 0xFFFF:
        raise LocalProtocolError("topic longer than 65535 bytes")
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
    remaining = 2 + topic_length + len(id_bytes) + len(props) + len(payload)
    if remaining > MAX_VARINT:
        raise LocalProtocolError(f"PUBLISH body of {remaining} bytes exceeds the MQTT maximum")
    first = 0x30 | (0x08 if dup else 0) | (qos << 1) | (0x01 if retain else 0)
    return b"".join((
        bytes((first,)), encode_varint(remaining), topic_length.to_bytes(2, "big"), topic_bytes,
        id_bytes, props, payload,
    ))


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
        encode_utf8(name), bytes((level | (0x80 if p.bridge else 0), flags)),
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
    flags = b"\x01" if p.session_present else b"\x00"
    if level == 5:
        return _frame(0x20, [
            flags, _reason_byte(p.reason_code, PacketType.CONNACK),
            encode_properties(p.properties, PacketType.CONNACK),
        ])
    # Levels 3/4 take either a return code 0..5 or an MQTT 5 reason code to translate.
    code = p.reason_code
    if not (0 <= code <= 5 or code in REASON_CODES_BY_PACKET[PacketType.CONNACK]):
        raise LocalProtocolError(f"CONNACK code {code:#04x} has no 3.1.1 equivalent")
    return _frame(0x20, [flags, bytes((v3_connack_code(code),))])


def _encode_publish(p: Publish, level: int) -> bytes:
    return encode_publish(
        p.topic, p.payload, qos=p.qos, retain=p.retain, dup=p.dup, packet_id=p.packet_id,
        properties=p.properties, protocol_level=level,
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
        return _frame(first_byte, [id_bytes, *_encode_reason_tail(
            p.reason_code, p.properties, packet_type
        )])

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
    return _frame(0xB0, [id_bytes, props, *(
        _reason_byte(code, PacketType.UNSUBACK) for code in p.reason_codes
    )])


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


__all__ = [
    "MAX_PACKET_SIZE", "NEED_DATA", "NeedData", "PROTOCOL_NAMES", "PacketDecoder", "encode",
    "encode_publish",
]
