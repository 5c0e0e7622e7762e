"""Errors the broker raises; `reason` is the short cause backends pass on to the processor.
A refused producer is told with the shared `mop.messaging.ProducerBusy` / `ProducerFenced`."""

from __future__ import annotations

__all__ = [
    "BrokerError",
    "ConsumerBusy",
    "SubscriptionMismatch",
]


class BrokerError(Exception):
    reason = "broker_error"


class ConsumerBusy(BrokerError):
    """The subscription (or this member of it) already has a consumer attached."""

    reason = "consumer_busy"


class SubscriptionMismatch(BrokerError):
    """The subscription exists with another type than the one asked for."""

    reason = "subscription_mismatch"
