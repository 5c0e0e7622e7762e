"""Sans-IO codec for MQTT 3.1, 3.1.1 and 5.0 (protocol levels 3, 4 and 5).

`PacketDecoder` turns a byte stream into packet dataclasses one at a time; `encode` and the
delivery fast path `encode_publish` turn packets into bytes. No I/O, no concurrency library.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeVar

# Encoding lives in its own module; this codec is the one public entry point for both ways.
# Encoding lives in its own module; this codec is the one public entry point for both ways.
from mop.protocols.mqtt.encoder import PROTOCOL_NAMES, encode, encode_publish
from mop.protocols.mqtt.errors import (
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
    read_binary,
    read_byte,
    read_u16,
    read_utf8,
)
from mop.protocols.mqtt.reason_codes import REASON_CODES_BY_PACKET, V3_SUBACK_CODES
from mop.protocols.receive_buffer import ReceiveBuffer


class NeedData:
    """Type of `NEED_DATA`, returned by `PacketDecoder.next_packet` until a packet is complete."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = NeedData()

# One fixed header byte, up to four remaining-length bytes, and the largest remaining length.
MAX_PACKET_SIZE: Final = MAX_VARINT + 5

# Fixed header flags each packet type must carry (spec 2.1.3); PUBLISH carries dup/qos/retain.
_REQUIRED_FLAGS: Final[dict[int, int]] = {
    PacketType.CONNECT: 0,
    PacketType.CONNACK: 0,
    PacketType.PUBACK: 0,
    PacketType.PUBREC: 0,
    PacketType.PUBREL: 2,
    PacketType.PUBCOMP: 0,
    PacketType.SUBSCRIBE: 2,
    PacketType.SUBACK: 0,
    PacketType.UNSUBSCRIBE: 2,
    PacketType.UNSUBACK: 0,
    PacketType.PINGREQ: 0,
    PacketType.PINGRESP: 0,
    PacketType.DISCONNECT: 0,
    PacketType.AUTH: 0,
}


def _check_fixed_header(packet_type: int, flags: int, level: int) -> None:
    if packet_type == PacketType.PUBLISH:
        if flags & 0x06 == 0x06:
            raise MalformedPacket("PUBLISH with QoS 3")
        # [MQTT-3.3.1-2]: 3.1.1 and 5.0; MQTT 3.1 left it open.
        if level >= 4 and flags & 0x0E == 0x08:
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


class PacketDecoder(ReceiveBuffer):
    """Incremental decoder: `feed` bytes as they arrive, then call `next_packet` until NEED_DATA.

    `protocol_level` selects the packet layouts after CONNECT; the server sets it from the
    CONNECT it decoded (CONNECT is decodable at any level since it names its own). Once a
    `RemoteProtocolError` is raised the decoder stays failed: every later call raises it again and
    fed bytes are dropped, because the stream can no longer be framed.
    """

    __slots__ = ("expect_connect", "max_packet_size", "protocol_level")

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
        super().__init__()

    def next_packet(self) -> Packet | NeedData:
        """Decode and return the next complete packet, or NEED_DATA."""
        if self._error is not None:
            raise self._error
        buf, pos = self._buf, self._pos
        if (
            pos + 1 < len(buf)
            and buf[pos] >> 4 == PacketType.PUBLISH
            and self.protocol_level != 5
            and not self.expect_connect
        ):
            # A whole PUBLISH below MQTT 5 with a one-byte length: most packets most servers
            # read, decoded here without the calls of the general path. This cannot raise:
            # anything unusual is left to the general path, which says what is wrong.
            first = buf[pos]
            remaining = buf[pos + 1]
            end = pos + 2 + remaining
            if (
                remaining < 0x80
                and first & 0x06 != 0x06
                and first & 0x0E != 0x08
                and remaining + 2 <= self.max_packet_size
                and end <= len(buf)
            ):
                publish = _publish_below_v5(buf, pos + 2, end, first)
                if publish is not None:
                    self._pos = end
                    return publish
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


# The protocol names of the MQTT versions (whatever their level byte says).
_KNOWN_PROTOCOL_NAMES: Final = frozenset(PROTOCOL_NAMES.values())


def _decode_connect(mv: memoryview, flags: int, decoder_level: int) -> Connect:
    name, pos = read_utf8(mv, 0)
    level_byte, pos = read_byte(mv, pos)
    # mosquitto bridges set the top bit of the level byte to announce themselves.
    bridge = bool(level_byte & 0x80)
    level = level_byte & 0x7F
    if name not in _KNOWN_PROTOCOL_NAMES:
        # Not MQTT at all: no CONNACK answers it, the connection is closed ([MQTT-3.1.2-1];
        # 5.0 lets the server just disconnect too).
        raise ProtocolViolation(f"unknown protocol name {name!r}")
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
        client_id,
        name,
        level,
        bool(connect_flags & 0x02),
        keep_alive,
        username,
        password,
        will,
        bridge,
        props,
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


def _publish_below_v5(buf: bytearray, start: int, end: int, first: int) -> Publish | None:
    """The PUBLISH (level 3 or 4, QoS below 3) in `buf[start:end]` if it is well formed, else
    None: `_decode_publish` then decodes it again and says what is wrong. Made for the
    common case: it reads the buffer directly, without the views and helpers of the rest."""
    topic_end = start + 2 + ((buf[start] << 8) | buf[start + 1]) if start + 2 <= end else end + 1
    qos = (first >> 1) & 0x03
    body = topic_end + 2 if qos else topic_end
    if body > end:
        return None
    try:
        topic = str(buf[start + 2 : topic_end], "utf-8")
    except UnicodeDecodeError:
        return None
    if "\x00" in topic:
        return None
    packet_id = None
    if qos:
        packet_id = (buf[topic_end] << 8) | buf[topic_end + 1]
        if not packet_id:
            return None
    return Publish(
        topic, bytes(buf[body:end]), qos, bool(first & 0x01), bool(first & 0x08), packet_id
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
        if not topic_filter:  # [MQTT-4.7.3-1]: the connection closes
            raise ProtocolViolation("SUBSCRIBE with an empty topic filter")
        options, pos = read_byte(mv, pos)
        if options & reserved:
            raise MalformedPacket("reserved bits set in subscription options")
        if options & 0x03 == 0x03:
            raise MalformedPacket("subscription with QoS 3")
        if options & 0x30 == 0x30:
            raise ProtocolViolation("subscription with retain handling 3")
        subscriptions.append(
            SubscriptionRequest(
                topic_filter,
                options & 0x03,
                bool(options & 0x04),
                bool(options & 0x08),
                (options >> 4) & 0x03,
            )
        )
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
        if not topic_filter:  # [MQTT-4.7.3-1]
            raise ProtocolViolation("UNSUBSCRIBE with an empty topic filter")
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


__all__ = [
    "MAX_PACKET_SIZE",
    "NEED_DATA",
    "NeedData",
    "PROTOCOL_NAMES",
    "PacketDecoder",
    "encode",
    "encode_publish",
]
