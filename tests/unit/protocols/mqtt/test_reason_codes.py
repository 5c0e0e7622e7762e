"""Which MQTT reason code answers what a backend refused."""

from __future__ import annotations

from mop.backends.cluster.errors import error_for
from mop.counters import Closing, Refusal
from mop.processor import BackendError, QuotaExceeded
from mop.protocols.mqtt.packets import PacketType
from mop.protocols.mqtt.reason_codes import (
    REASON_CODES_BY_PACKET,
    ReasonCode,
    backend_reason_code,
    closing_of,
    refusal_of_connack,
)
from mop.protocols.pulsar.driver import ServerRefused
from mop.protocols.pulsar.errors import ServerError


def test_a_quota_refusal_is_answered_quota_exceeded() -> None:
    assert backend_reason_code(QuotaExceeded("disk full")) is ReasonCode.QUOTA_EXCEEDED


def test_any_other_refusal_is_answered_unspecified_error() -> None:
    for reason in ("unspecified", "closed", "storage_error", "not_supported"):
        error = BackendError("no", reason=reason)
        assert backend_reason_code(error) is ReasonCode.UNSPECIFIED_ERROR


def test_a_message_too_large_for_the_brokers_is_answered_unspecified_error() -> None:
    """A separated proxy's brokers refuse a message larger than they take (reason
    "too_large"). MQTT 5 has Packet too large (0x95) for CONNACK and DISCONNECT only; a PUBACK
    or PUBREC says Unspecified error (0x80), which the client does not send again."""
    code = backend_reason_code(BackendError("too large", reason="too_large"))
    assert code is ReasonCode.UNSPECIFIED_ERROR
    assert ReasonCode.PACKET_TOO_LARGE not in REASON_CODES_BY_PACKET[PacketType.PUBACK]
    for ack in (PacketType.PUBACK, PacketType.PUBREC):
        assert code in REASON_CODES_BY_PACKET[ack]


def test_a_refused_connack_is_counted_under_its_refusal() -> None:
    assert refusal_of_connack(ReasonCode.BAD_USER_NAME_OR_PASSWORD) is Refusal.BAD_CREDENTIALS
    assert refusal_of_connack(ReasonCode.NOT_AUTHORIZED) is Refusal.NOT_AUTHORIZED
    assert refusal_of_connack(ReasonCode.BANNED) is Refusal.BANNED
    assert refusal_of_connack(ReasonCode.QUOTA_EXCEEDED) is Refusal.LIMIT_REACHED
    assert refusal_of_connack(ReasonCode.SERVER_UNAVAILABLE) is Refusal.UNAVAILABLE
    for code in (ReasonCode.UNSUPPORTED_PROTOCOL_VERSION, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID):
        assert refusal_of_connack(code) is Refusal.PROTOCOL_ERROR


def test_a_closed_connection_is_counted_under_why_the_node_closed_it() -> None:
    assert closing_of(None) is Closing.NORMAL
    assert closing_of(ReasonCode.SESSION_TAKEN_OVER) is Closing.TAKEOVER
    assert closing_of(ReasonCode.KEEP_ALIVE_TIMEOUT) is Closing.KEEP_ALIVE
    assert closing_of(ReasonCode.ADMINISTRATIVE_ACTION) is Closing.ADMINISTRATIVE
    assert closing_of(ReasonCode.RECEIVE_MAXIMUM_EXCEEDED) is Closing.PROTOCOL_ERROR
    assert closing_of(ReasonCode.UNSPECIFIED_ERROR) is Closing.ERROR


def test_a_broker_over_its_memory_mark_is_answered_quota_exceeded() -> None:
    """A separated proxy's broker over its memory high-water mark refuses SENDs with
    TooManyRequests; the proxy's MQTT 5 clients get 0x97, as from an overloaded merged node."""
    error = error_for(ServerRefused(ServerError.TooManyRequests, "over the mark"), "publish")
    assert error.reason == "overloaded"
    assert backend_reason_code(error) is ReasonCode.QUOTA_EXCEEDED
