"""MQTT reason codes: the 5.0 table, the 3.1/3.1.1 CONNACK return codes and how they map.

Which 5.0 codes each packet type may carry is a table here too; the codec checks it both ways.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from types import MappingProxyType
from typing import TYPE_CHECKING

from mop.counters import Closing, Refusal
from mop.protocols.mqtt.packets import PacketType
from mop.security.identity import AuthFailure

if TYPE_CHECKING:
    from mop.processor import BackendError


class ReasonCode(IntEnum):
    """MQTT 5.0 reason codes (spec section 2.4).

    0x00 has three names in the spec; `ReasonCode(0)` is `SUCCESS`, and `NORMAL_DISCONNECTION` and
    `GRANTED_QOS_0` are aliases of it, usable for readability at the call site.
    """

    SUCCESS = 0x00
    NORMAL_DISCONNECTION = 0x00
    GRANTED_QOS_0 = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    REAUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


class ConnectReturnCode(IntEnum):
    """MQTT 3.1 / 3.1.1 CONNACK return codes."""

    ACCEPTED = 0
    UNACCEPTABLE_PROTOCOL_VERSION = 1
    IDENTIFIER_REJECTED = 2
    SERVER_UNAVAILABLE = 3
    BAD_USER_NAME_OR_PASSWORD = 4
    NOT_AUTHORIZED = 5


_R = ReasonCode

_ACK_CODES = frozenset(
    {
        _R.SUCCESS,
        _R.NO_MATCHING_SUBSCRIBERS,
        _R.UNSPECIFIED_ERROR,
        _R.IMPLEMENTATION_SPECIFIC_ERROR,
        _R.NOT_AUTHORIZED,
        _R.TOPIC_NAME_INVALID,
        _R.PACKET_IDENTIFIER_IN_USE,
        _R.QUOTA_EXCEEDED,
        _R.PAYLOAD_FORMAT_INVALID,
    }
)
_RELEASE_CODES = frozenset({_R.SUCCESS, _R.PACKET_IDENTIFIER_NOT_FOUND})

# Spec sections 3.2.2.2, 3.4.2.1, 3.5.2.1, 3.6.2.1, 3.7.2.1, 3.9.3, 3.11.3, 3.14.2.1, 3.15.2.1.
REASON_CODES_BY_PACKET: Mapping[PacketType, frozenset[int]] = MappingProxyType(
    {
        PacketType.CONNACK: frozenset(
            {
                _R.SUCCESS,
                _R.UNSPECIFIED_ERROR,
                _R.MALFORMED_PACKET,
                _R.PROTOCOL_ERROR,
                _R.IMPLEMENTATION_SPECIFIC_ERROR,
                _R.UNSUPPORTED_PROTOCOL_VERSION,
                _R.CLIENT_IDENTIFIER_NOT_VALID,
                _R.BAD_USER_NAME_OR_PASSWORD,
                _R.NOT_AUTHORIZED,
                _R.SERVER_UNAVAILABLE,
                _R.SERVER_BUSY,
                _R.BANNED,
                _R.BAD_AUTHENTICATION_METHOD,
                _R.TOPIC_NAME_INVALID,
                _R.PACKET_TOO_LARGE,
                _R.QUOTA_EXCEEDED,
                _R.PAYLOAD_FORMAT_INVALID,
                _R.RETAIN_NOT_SUPPORTED,
                _R.QOS_NOT_SUPPORTED,
                _R.USE_ANOTHER_SERVER,
                _R.SERVER_MOVED,
                _R.CONNECTION_RATE_EXCEEDED,
            }
        ),
        PacketType.PUBACK: _ACK_CODES,
        PacketType.PUBREC: _ACK_CODES,
        PacketType.PUBREL: _RELEASE_CODES,
        PacketType.PUBCOMP: _RELEASE_CODES,
        PacketType.SUBACK: frozenset(
            {
                _R.GRANTED_QOS_0,
                _R.GRANTED_QOS_1,
                _R.GRANTED_QOS_2,
                _R.UNSPECIFIED_ERROR,
                _R.IMPLEMENTATION_SPECIFIC_ERROR,
                _R.NOT_AUTHORIZED,
                _R.TOPIC_FILTER_INVALID,
                _R.PACKET_IDENTIFIER_IN_USE,
                _R.QUOTA_EXCEEDED,
                _R.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED,
                _R.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED,
                _R.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED,
            }
        ),
        PacketType.UNSUBACK: frozenset(
            {
                _R.SUCCESS,
                _R.NO_SUBSCRIPTION_EXISTED,
                _R.UNSPECIFIED_ERROR,
                _R.IMPLEMENTATION_SPECIFIC_ERROR,
                _R.NOT_AUTHORIZED,
                _R.TOPIC_FILTER_INVALID,
                _R.PACKET_IDENTIFIER_IN_USE,
            }
        ),
        PacketType.DISCONNECT: frozenset(
            {
                _R.NORMAL_DISCONNECTION,
                _R.DISCONNECT_WITH_WILL,
                _R.UNSPECIFIED_ERROR,
                _R.MALFORMED_PACKET,
                _R.PROTOCOL_ERROR,
                _R.IMPLEMENTATION_SPECIFIC_ERROR,
                _R.NOT_AUTHORIZED,
                _R.SERVER_BUSY,
                _R.SERVER_SHUTTING_DOWN,
                _R.KEEP_ALIVE_TIMEOUT,
                _R.SESSION_TAKEN_OVER,
                _R.TOPIC_FILTER_INVALID,
                _R.TOPIC_NAME_INVALID,
                _R.RECEIVE_MAXIMUM_EXCEEDED,
                _R.TOPIC_ALIAS_INVALID,
                _R.PACKET_TOO_LARGE,
                _R.MESSAGE_RATE_TOO_HIGH,
                _R.QUOTA_EXCEEDED,
                _R.ADMINISTRATIVE_ACTION,
                _R.PAYLOAD_FORMAT_INVALID,
                _R.RETAIN_NOT_SUPPORTED,
                _R.QOS_NOT_SUPPORTED,
                _R.USE_ANOTHER_SERVER,
                _R.SERVER_MOVED,
                _R.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED,
                _R.CONNECTION_RATE_EXCEEDED,
                _R.MAXIMUM_CONNECT_TIME,
                _R.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED,
                _R.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED,
            }
        ),
        PacketType.AUTH: frozenset({_R.SUCCESS, _R.CONTINUE_AUTHENTICATION, _R.REAUTHENTICATE}),
    }
)

# Level 3/4 SUBACK return codes: the granted QoS or 0x80 for failure.
V3_SUBACK_CODES = frozenset({0, 1, 2, 0x80})

_V3_CONNACK: Mapping[int, ConnectReturnCode] = MappingProxyType(
    {
        _R.SUCCESS: ConnectReturnCode.ACCEPTED,
        _R.UNSUPPORTED_PROTOCOL_VERSION: ConnectReturnCode.UNACCEPTABLE_PROTOCOL_VERSION,
        _R.CLIENT_IDENTIFIER_NOT_VALID: ConnectReturnCode.IDENTIFIER_REJECTED,
        _R.BAD_USER_NAME_OR_PASSWORD: ConnectReturnCode.BAD_USER_NAME_OR_PASSWORD,
        _R.NOT_AUTHORIZED: ConnectReturnCode.NOT_AUTHORIZED,
        _R.BANNED: ConnectReturnCode.NOT_AUTHORIZED,
        _R.BAD_AUTHENTICATION_METHOD: ConnectReturnCode.NOT_AUTHORIZED,
    }
)


def v3_connack_code(reason: int) -> int:
    """Map an MQTT 5 CONNACK reason code to the closest 3.1/3.1.1 CONNACK return code.

    Identity, credential and authorization refusals keep their meaning (0x84 -> 1, 0x85 -> 2,
    0x86 -> 4, 0x87/0x8A/0x8C -> 5). Every other refusal, whether the server's condition (busy,
    unavailable, moved, rate limits) or a refusal of what the client asked for (QoS or retain not
    supported, packet too large), becomes 3 "server unavailable": 3.1.1 has no closer code, and 3
    tells the client to retry later rather than that its credentials are wrong. Values 0..5 are
    returned unchanged so that an already-mapped code can be passed again.
    """
    if 0 <= reason <= 5:
        return reason
    return int(_V3_CONNACK.get(reason, ConnectReturnCode.SERVER_UNAVAILABLE))


# BackendError.reason -> the reason code that answers a message or a session the backend
# refused (PUBACK, PUBREC, CONNACK); any other reason answers Unspecified error.
_BACKEND_REASONS: Mapping[str, ReasonCode] = MappingProxyType(
    {
        "quota_exceeded": _R.QUOTA_EXCEEDED,
        "backlog_quota_exceeded": _R.QUOTA_EXCEEDED,
        "overloaded": _R.QUOTA_EXCEEDED,
    }
)


def backend_reason_code(error: BackendError) -> ReasonCode:
    """The reason code that answers what a failed backend call refused."""
    return _BACKEND_REASONS.get(error.reason, _R.UNSPECIFIED_ERROR)


__all__ = [
    "backend_reason_code",
    "ConnectReturnCode",
    "REASON_CODES_BY_PACKET",
    "ReasonCode",
    "V3_SUBACK_CODES",
    "v3_connack_code",
]


# Why the processor refused a client's credentials -> the CONNACK reason code that says so.
_AUTH_FAILURES: Mapping[AuthFailure, ReasonCode] = MappingProxyType(
    {
        AuthFailure.BAD_CREDENTIALS: _R.BAD_USER_NAME_OR_PASSWORD,
        AuthFailure.EXPIRED: _R.BAD_USER_NAME_OR_PASSWORD,
        AuthFailure.NOT_AUTHORIZED: _R.NOT_AUTHORIZED,
        AuthFailure.BANNED: _R.BANNED,
    }
)


def auth_failure_reason(failure: AuthFailure) -> ReasonCode:
    """The CONNACK reason code (MQTT 5; `v3_connack_code` maps it for older clients) for a
    client the processor did not admit."""
    return _AUTH_FAILURES[failure]


# A CONNACK reason code that refuses a client -> the refusal counted in the metrics; any other
# refusal code is the client's mistake (a protocol error).
_REFUSALS: Mapping[int, Refusal] = MappingProxyType(
    {
        _R.BAD_USER_NAME_OR_PASSWORD: Refusal.BAD_CREDENTIALS,
        _R.NOT_AUTHORIZED: Refusal.NOT_AUTHORIZED,
        _R.BANNED: Refusal.BANNED,
        _R.QUOTA_EXCEEDED: Refusal.LIMIT_REACHED,
        _R.SERVER_BUSY: Refusal.LIMIT_REACHED,
        _R.CONNECTION_RATE_EXCEEDED: Refusal.LIMIT_REACHED,
        _R.SERVER_UNAVAILABLE: Refusal.UNAVAILABLE,
        _R.UNSPECIFIED_ERROR: Refusal.UNAVAILABLE,
        _R.USE_ANOTHER_SERVER: Refusal.UNAVAILABLE,
        _R.SERVER_MOVED: Refusal.UNAVAILABLE,
    }
)


def refusal_of_connack(reason: int) -> Refusal:
    """The refusal counted for a CONNACK that refuses with MQTT 5 reason code `reason`."""
    return _REFUSALS.get(reason, Refusal.PROTOCOL_ERROR)


# Why the node ended a connection (the DISCONNECT reason code; None: the client ended it, or
# the connection was lost) -> the closing counted in the metrics.
_CLOSINGS: Mapping[int | None, Closing] = MappingProxyType(
    {
        None: Closing.NORMAL,
        _R.SESSION_TAKEN_OVER: Closing.TAKEOVER,
        _R.KEEP_ALIVE_TIMEOUT: Closing.KEEP_ALIVE,
        _R.NOT_AUTHORIZED: Closing.NOT_AUTHORIZED,
        _R.ADMINISTRATIVE_ACTION: Closing.ADMINISTRATIVE,
        _R.SERVER_SHUTTING_DOWN: Closing.NORMAL,
        _R.MALFORMED_PACKET: Closing.PROTOCOL_ERROR,
        _R.PROTOCOL_ERROR: Closing.PROTOCOL_ERROR,
        _R.RECEIVE_MAXIMUM_EXCEEDED: Closing.PROTOCOL_ERROR,
        _R.TOPIC_ALIAS_INVALID: Closing.PROTOCOL_ERROR,
        _R.PACKET_TOO_LARGE: Closing.PROTOCOL_ERROR,
        _R.TOPIC_NAME_INVALID: Closing.PROTOCOL_ERROR,
        _R.PAYLOAD_FORMAT_INVALID: Closing.PROTOCOL_ERROR,
        _R.RETAIN_NOT_SUPPORTED: Closing.PROTOCOL_ERROR,
        _R.QOS_NOT_SUPPORTED: Closing.PROTOCOL_ERROR,
    }
)


def closing_of(reason: int | None) -> Closing:
    """The closing counted for a connection the node ended with DISCONNECT reason `reason`."""
    return _CLOSINGS.get(reason, Closing.ERROR)
