"""The words every layer uses about messaging: subscription kinds, start positions, producer
access modes, what a subscription or a producer asks for, and the errors that refuse a request.
The broker, the processor and the adapters all take them from here (pure: no I/O)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from mop.message import MessageId

__all__ = [
    "QUEUE_FULL",
    "BackendError",
    "ProducerAccess",
    "ProducerBusy",
    "ProducerFenced",
    "ProducerSpec",
    "QuotaExceeded",
    "StartPosition",
    "SubscriptionKind",
    "SubscriptionSpec",
    "TopicBusy",
]

# Why a backend drops a message for a subscription (`DropNotifier`): its bounded queue was full.
QUEUE_FULL: Final = "queue full"


class SubscriptionKind(StrEnum):
    EXCLUSIVE = "exclusive"
    SHARED = "shared"
    FAILOVER = "failover"
    KEY_SHARED = "key_shared"


class StartPosition(StrEnum):
    LATEST = "latest"
    EARLIEST = "earliest"


class ProducerAccess(StrEnum):
    """Who else may produce on a topic while a producer is there."""

    SHARED = "shared"  # anyone but an exclusive producer
    EXCLUSIVE = "exclusive"  # no one: refused when the topic has producers
    WAIT_FOR_EXCLUSIVE = "wait_for_exclusive"  # no one: waits until the topic is free
    EXCLUSIVE_WITH_FENCING = "exclusive_with_fencing"  # no one: takes over, fencing the others


class BackendError(Exception):
    """A backend could not do what was asked; `reason` is a short machine-readable cause."""

    def __init__(self, message: str, *, reason: str = "unspecified") -> None:
        super().__init__(message)
        self.reason = reason


class QuotaExceeded(BackendError):
    """Storage or a configured quota refuses more data (disk full, backlog quota, ...)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="quota_exceeded")


class ProducerBusy(BackendError):
    """The producer name is taken, or the topic's producers leave no room for this one."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="producer_busy")


class ProducerFenced(BackendError):
    """Another producer took the topic over (exclusive with fencing); this one may not return."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="producer_fenced")


class TopicBusy(BackendError):
    """A topic to delete has consumers or producers connected (delete it with `force`)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="topic_busy")


@dataclass(frozen=True, slots=True)
class SubscriptionSpec:
    """What a consumer asks for.

    `name` is the subscription (an MQTT client id, a share group, a Pulsar subscription name);
    `member` identifies this consumer among the members of a shared subscription, so that a
    durable member that goes offline keeps its place until it unsubscribes. A durable
    subscription keeps its cursors and keeps collecting messages while no consumer is attached;
    a non-durable one is deleted when its consumer closes. `max_backlog` bounds the messages
    kept for the subscription on each topic (0 = unbounded): past it the oldest qos-0 message is
    dropped first, otherwise the new message is dropped for this subscription.
    """

    name: str
    selectors: frozenset[str]
    kind: SubscriptionKind = SubscriptionKind.EXCLUSIVE
    durable: bool = True
    member: str = ""
    start: StartPosition = StartPosition.LATEST
    max_backlog: int = 0
    # Where a new subscription (or a non-durable one) begins: at this message, inclusive.
    start_at: MessageId | None = None
    # Flow control by permits: the consumer is sent only as many messages as it granted with
    # `Consumer.grant` (a batch uses one per message), instead of filling a receiver queue.
    permits: bool = False
    # Deliver a batch entry as one Delivery (the consumer unpacks `message.batch`) rather
    # than one Delivery per message.
    whole_batches: bool = False
    # The order of the consumers of a failover subscription: the lowest (priority,
    # consumer_name) is the active one. Neither is kept with the subscription.
    priority: int = 0
    consumer_name: str = ""
    # At most once for messages with `qos` 0: they count as acknowledged as soon as `receive`
    # returns them, so the consumer does not acknowledge them and they are never delivered
    # again (by the backend itself, or by the processor for a backend that does not: see
    # `mop.processor.BackendCapabilities.auto_acks_qos0`).
    auto_ack_qos0: bool = False


@dataclass(frozen=True, slots=True)
class ProducerSpec:
    """A producer of one topic. `name` is unique on the topic: a producer reconnecting under
    its name gives a higher `epoch`. `durable_name` says the application chose the name, so
    the producer's last sequence id is kept across restarts (deduplication). `topic_epoch` is
    the fencing token of an exclusive producer that comes back (see `Producer.topic_epoch`)."""

    topic: str
    name: str
    access: ProducerAccess = ProducerAccess.SHARED
    durable_name: bool = False
    epoch: int = 0
    topic_epoch: int | None = None
