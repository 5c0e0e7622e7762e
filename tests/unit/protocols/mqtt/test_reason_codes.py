"""Which MQTT reason code answers what a backend refused."""

from __future__ import annotations

from mop.backends.cluster.errors import error_for
from mop.processor import BackendError, QuotaExceeded
from mop.protocols.mqtt.packets import PacketType
from mop.protocols.mqtt.reason_codes import REASON_CODES_BY_PACKET, ReasonCode, backend_reason_code
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


def test_a_broker_over_its_memory_mark_is_answered_quota_exceeded() -> None:
    """A separated proxy's broker over its memory high-water mark refuses SENDs with
    TooManyRequests; the proxy's MQTT 5 clients get 0x97, as from an overloaded merged node."""
    error = error_for(ServerRefused(ServerError.TooManyRequests, "over the mark"), "publish")
    assert error.reason == "overloaded"
    assert backend_reason_code(error) is ReasonCode.QUOTA_EXCEEDED
