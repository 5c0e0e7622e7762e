"""Errors the broker raises; `reason` is the short cause backends pass on to the processor."""

from __future__ import annotations

__all__ = [
    "BrokerError",
    "ConsumerBusy",
    "ProducerBusy",
    "ProducerFenced",
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


class ProducerBusy(BrokerError):
    """The producer name is taken, or the topic's access mode leaves no room for the producer."""

    reason = "producer_busy"


class ProducerFenced(BrokerError):
    """An exclusive producer was taken over (fenced) by another one and may not come back."""

    reason = "producer_fenced"
