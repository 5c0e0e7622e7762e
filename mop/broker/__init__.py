"""The colocated broker of merged mode: topics, subscriptions with their cursors, dispatch, and
the storage under them. Only `mop.backends.local` uses it."""

from mop.broker.broker import SUBSCRIPTIONS_TABLE, Broker, BrokerStats, Published
from mop.broker.errors import BrokerError, ConsumerBusy, SubscriptionMismatch
from mop.broker.subscription import Attachment, Subscription, SubscriptionType

__all__ = [
    "SUBSCRIPTIONS_TABLE",
    "Attachment",
    "Broker",
    "BrokerError",
    "BrokerStats",
    "ConsumerBusy",
    "Published",
    "Subscription",
    "SubscriptionMismatch",
    "SubscriptionType",
]
