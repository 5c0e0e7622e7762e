"""The contract between the messaging processor and the backend that stores and routes messages.

Two backends implement it: `LocalBackend` (merged mode, direct calls into the colocated broker)
and `ClusterBackend` (separated mode, remote brokers through pulsar-client). Topics are canonical
Pulsar names (`persistent://tenant/ns/local`); selectors are MQTT filters over the MQTT form of
those names (see `mop.topic_names`), so one selector can cover topics that do not exist yet.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import trio

from mop.message import Delivery, Message, MessageId


class SubscriptionKind(StrEnum):
    EXCLUSIVE = "exclusive"
    SHARED = "shared"
    FAILOVER = "failover"
    KEY_SHARED = "key_shared"


class StartPosition(StrEnum):
    LATEST = "latest"
    EARLIEST = "earliest"


class BackendError(Exception):
    """A backend could not do what was asked; `reason` is a short machine-readable cause."""

    def __init__(self, message: str, *, reason: str = "unspecified") -> None:
        super().__init__(message)
        self.reason = reason


class QuotaExceeded(BackendError):
    """Storage or a configured quota refuses more data (disk full, backlog quota, ...)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="quota_exceeded")


class ConsumerClosed(Exception):
    """The consumer was closed (by its owner, by unsubscribe, or because the backend stopped)."""


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


@dataclass(frozen=True, slots=True)
class PublishResult:
    message_id: MessageId
    # How many subscriptions took the message; None when the backend cannot tell.
    subscriptions: int | None


class Consumer(Protocol):
    """Messages for one subscription, across every topic its selectors match."""

    @property
    def spec(self) -> SubscriptionSpec: ...

    async def receive(self, max_messages: int) -> list[Delivery]:
        """Wait until at least one message is available and return up to `max_messages`.

        Raises ConsumerClosed once the consumer is closed.
        """
        ...

    def ack(self, deliveries: Iterable[Delivery]) -> None:
        """Acknowledge messages; they will not be delivered to this subscription again."""
        ...

    def nack(self, deliveries: Iterable[Delivery], delay: float = 0.0) -> None:
        """Hand messages back for redelivery (to any member) after `delay` seconds."""
        ...

    async def add_selector(self, selector: str) -> None:
        """Start receiving messages published from now on to topics matching `selector`."""
        ...

    async def remove_selector(self, selector: str) -> None:
        """Stop receiving from topics that match no remaining selector; drop their backlog."""
        ...

    async def close(self) -> None:
        """Detach; unacknowledged messages go back to the subscription."""
        ...

    async def unsubscribe(self) -> None:
        """Leave the subscription for good (delete it when this was its last member)."""
        ...


class Table(Protocol):
    """A durable key -> value map (a compacted system topic in Pulsar terms)."""

    @property
    def name(self) -> str: ...

    def get(self, key: str) -> bytes | None: ...

    def items(self) -> Iterator[tuple[str, bytes]]:
        """A snapshot of every key and its latest value."""
        ...

    async def put(self, key: str, value: bytes | None) -> None:
        """Set (or with None delete) a key; durable when it returns."""
        ...


class ClientLease(Protocol):
    """Exclusive ownership of a client id across the deployment."""

    @property
    def client_id(self) -> str: ...

    async def wait_fenced(self) -> None:
        """Return when another connection has taken this client id over."""
        ...

    async def release(self) -> None: ...


class Backend(Protocol):
    async def serve(self, *, task_status: trio.TaskStatus[None]) -> None:
        """Connect or recover, report readiness, then run background work until `aclose()`."""
        ...

    async def open_client(self, client_id: str) -> ClientLease:
        """Take the client id, fencing (and waiting for the release of) any current holder."""
        ...

    async def publish(self, topic: str, message: Message) -> PublishResult:
        """Store and route a message; returns once it is durable when `message.qos` >= 1."""
        ...

    async def subscribe(self, spec: SubscriptionSpec) -> Consumer: ...

    async def delete_subscription(self, name: str, member: str = "") -> None:
        """Remove a member of a subscription that has no consumer attached (e.g. an expired
        offline session); the subscription goes when its last member does."""
        ...

    def table(self, name: str) -> Table: ...

    async def lookup(self, topic: str) -> str:
        """The service URL of the broker that owns `topic`."""
        ...

    async def aclose(self) -> None: ...
