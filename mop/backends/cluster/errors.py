"""The BackendError for what the proxy's Pulsar client reports (`DriverError`s)."""

from __future__ import annotations

from typing import Final

from mop.processor.backend import BackendError, ProducerBusy, ProducerFenced, QuotaExceeded
from mop.protocols.pulsar.driver import (
    ClientClosed,
    ConnectionLost,
    DriverError,
    MessageTooLarge,
    ServerRefused,
)
from mop.protocols.pulsar.errors import ServerError

__all__ = ["error_for"]

# ServerError -> BackendError.reason (the ones with a class of their own are below).
_REASONS: Final[dict[ServerError, str]] = {
    ServerError.ConsumerBusy: "consumer_busy",
    ServerError.ServiceNotReady: "unavailable",
    # A broker over its memory high-water mark refuses SENDs for a while.
    ServerError.TooManyRequests: "overloaded",
    ServerError.PersistenceError: "storage_error",
    ServerError.MetadataError: "storage_error",
    ServerError.InvalidTopicName: "invalid_topic",
    ServerError.TopicNotFound: "invalid_topic",
    ServerError.TopicTerminatedError: "closed",
    ServerError.AuthenticationError: "not_authorized",
    ServerError.AuthorizationError: "not_authorized",
    ServerError.SubscriptionNotFound: "not_found",
    ServerError.ConsumerNotFound: "not_found",
    ServerError.NotAllowedError: "not_supported",
}
_QUOTA: Final = frozenset(
    {
        ServerError.ProducerBlockedQuotaExceededError,
        ServerError.ProducerBlockedQuotaExceededException,
    }
)


def error_for(exc: DriverError, what: str) -> BackendError:
    """The BackendError for a failed client operation described by `what`."""
    message = f"{what}: {exc}"
    if isinstance(exc, ServerRefused):
        if exc.error in _QUOTA:
            return QuotaExceeded(message)
        if exc.error is ServerError.ProducerBusy:
            return ProducerBusy(message)
        if exc.error is ServerError.ProducerFenced:
            return ProducerFenced(message)
        return BackendError(message, reason=_REASONS.get(exc.error, "unspecified"))
    if isinstance(exc, ClientClosed):
        return BackendError(message, reason="closed")
    if isinstance(exc, MessageTooLarge):
        return BackendError(message, reason="too_large")
    if isinstance(exc, ConnectionLost):
        return BackendError(message, reason="unavailable")
    return BackendError(message, reason="unavailable")
