"""Errors of the MQTT codec, named after whose fault they are (the h11 convention).

`RemoteProtocolError` means the peer sent something invalid and carries the MQTT 5 reason code to
answer with; `LocalProtocolError` means our own code asked the codec to produce something invalid.
"""

from __future__ import annotations

from mop.protocols.mqtt.reason_codes import ReasonCode


class MqttError(Exception):
    """Base of every error raised by the MQTT codec."""


class RemoteProtocolError(MqttError):
    """The peer broke the protocol; the connection cannot continue.

    `reason_code` is the MQTT 5 reason code for the DISCONNECT (or CONNACK, while connecting) that
    the server sends before closing. Level 3/4 peers get no DISCONNECT, only a closed connection.
    """

    reason_code: int = ReasonCode.UNSPECIFIED_ERROR

    def __init__(self, message: str, *, reason_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if reason_code is not None:
            self.reason_code = reason_code

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, reason_code=0x{self.reason_code:02X})"


class MalformedPacket(RemoteProtocolError):
    """The bytes do not parse as the packet they claim to be (reason 0x81)."""

    reason_code = ReasonCode.MALFORMED_PACKET


class ProtocolViolation(RemoteProtocolError):
    """The packet parses but breaks a rule of the protocol (reason 0x82)."""

    reason_code = ReasonCode.PROTOCOL_ERROR


class PacketTooLarge(RemoteProtocolError):
    """A packet above a maximum (reason 0x95): one whose fixed header announces more than the
    server takes, or one the server would send above the client's Maximum Packet Size."""

    reason_code = ReasonCode.PACKET_TOO_LARGE


class UnsupportedProtocolVersion(RemoteProtocolError):
    """CONNECT names a protocol or level we do not speak (reason 0x84).

    `protocol_level` is the level byte as received (bridge bit removed), so the server can answer
    a level 3/4 client with the 3.1.1 CONNACK return code 1 instead of a 5.0 CONNACK.
    """

    reason_code = ReasonCode.UNSUPPORTED_PROTOCOL_VERSION

    def __init__(self, message: str, *, protocol_level: int) -> None:
        super().__init__(message)
        self.protocol_level = protocol_level


class LocalProtocolError(MqttError):
    """Our own code asked the codec to encode something the protocol does not allow."""


__all__ = [
    "LocalProtocolError",
    "MalformedPacket",
    "MqttError",
    "PacketTooLarge",
    "ProtocolViolation",
    "RemoteProtocolError",
    "UnsupportedProtocolVersion",
]
