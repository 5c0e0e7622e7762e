"""What MQTT clients are told when the node is overloaded: the answer to a connection over a
listener's connection rate (from its first bytes, before any connection state exists), and
which PUBLISHes are refused while the node is over its memory high-water mark."""

from __future__ import annotations

from typing import Final

from mop.protocols.mqtt.encoder import PROTOCOL_NAMES, encode
from mop.protocols.mqtt.packets import Connack
from mop.protocols.mqtt.reason_codes import ReasonCode, v3_connack_code

__all__ = ["rate_refusal", "refused_when_overloaded"]

_CONNECT: Final = 0x10
_RATE_EXCEEDED: Final = {
    level: encode(
        Connack(
            reason_code=ReasonCode.CONNECTION_RATE_EXCEEDED
            if level == 5
            else v3_connack_code(ReasonCode.CONNECTION_RATE_EXCEEDED)
        ),
        level,
    )
    for level in PROTOCOL_NAMES
}


def _protocol_level(first: bytes) -> int | None:
    """The protocol level of the CONNECT that `first` begins (None: not one, or cut short)."""
    if not first or first[0] != _CONNECT:
        return None
    at = 1
    for _ in range(4):  # the remaining length: 1 to 4 bytes, high bit = more
        if at >= len(first):
            return None
        at += 1
        if not first[at - 1] & 0x80:
            break
    else:
        return None
    if at + 2 > len(first):
        return None
    name_length = int.from_bytes(first[at : at + 2], "big")
    level_at = at + 2 + name_length
    if level_at >= len(first):
        return None
    name = first[at + 2 : level_at]
    level = first[level_at]
    if PROTOCOL_NAMES.get(level, "").encode() != name:
        return None
    return level


def rate_refusal(first: bytes) -> bytes:
    """The CONNACK that turns away a connection over its listener's connection rate, for the
    CONNECT that `first` (its first bytes) begins: MQTT 5 gets 0x9F "Connection rate
    exceeded", 3.1 and 3.1.1 return code 3 "Server unavailable". b"" (just close) when
    `first` does not show a CONNECT's protocol level."""
    level = _protocol_level(first)
    return _RATE_EXCEEDED[level] if level is not None else b""


def refused_when_overloaded(protocol_level: int, qos: int) -> bool:
    """Whether a PUBLISH that arrives while the node is over its memory high-water mark is
    refused: an MQTT 5 QoS 1 or 2 one is, answered 0x97 "Quota exceeded" (the client learns it
    was not taken and may send it again). The others are taken, since their acks cannot say
    no (QoS 0 has none, 3.1.1 acks carry no error); either way the connection is not read
    from again until memory is below the low-water mark."""
    return protocol_level == 5 and qos > 0
