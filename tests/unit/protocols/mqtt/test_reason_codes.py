"""Which MQTT reason code answers what a backend refused."""

from __future__ import annotations

from mop.processor import BackendError, QuotaExceeded
from mop.protocols.mqtt.reason_codes import ReasonCode, backend_reason_code


def test_a_quota_refusal_is_answered_quota_exceeded() -> None:
    assert backend_reason_code(QuotaExceeded("disk full")) is ReasonCode.QUOTA_EXCEEDED


def test_any_other_refusal_is_answered_unspecified_error() -> None:
    for reason in ("unspecified", "closed", "storage_error", "not_supported"):
        error = BackendError("no", reason=reason)
        assert backend_reason_code(error) is ReasonCode.UNSPECIFIED_ERROR
