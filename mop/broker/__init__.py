"""The colocated broker of merged mode: topics, subscriptions with their cursors, dispatch, and
the storage under them. `mop.backends.local` uses it, and `mop.node` opens its storage for that
backend; no other module imports it (checked by import-linter)."""

from mop.broker.broker import (
    BROKER_TABLE_PREFIX,
    PRODUCERS_TABLE,
    SUBSCRIPTIONS_TABLE,
    TOPICS_TABLE,
    Broker,
    BrokerStats,
    Published,
)
from mop.broker.dispatch import Attachment
from mop.broker.errors import (
    BrokerError,
    ConsumerBusy,
    SubscriptionMismatch,
)
from mop.broker.positions import id_before
from mop.broker.producers import ProducerHandle, Sequenced
from mop.broker.subscription import Subscription
from mop.broker.topic import NON_PERSISTENT

__all__ = [
    "BROKER_TABLE_PREFIX",
    "NON_PERSISTENT",
    "PRODUCERS_TABLE",
    "SUBSCRIPTIONS_TABLE",
    "TOPICS_TABLE",
    "Attachment",
    "Broker",
    "BrokerError",
    "BrokerStats",
    "ConsumerBusy",
    "ProducerHandle",
    "Published",
    "Sequenced",
    "Subscription",
    "SubscriptionMismatch",
    "id_before",
]
