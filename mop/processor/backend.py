"""The contract between the messaging processor and the backend that stores and routes messages.

Two backends implement it: `LocalBackend` (merged mode, direct calls into the colocated broker)
and `ClusterBackend` (separated mode, remote brokers through pulsar-client). Topics are canonical
Pulsar names (`persistent://tenant/ns/local`); selectors are MQTT filters over the MQTT form of
those names (see `mop.topic_names`), so one selector can cover topics that do not exist yet.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import trio

from mop.message import Delivery, Message, MessageId, value
from mop.messaging import (
    BackendError,
    ProducerAccess,
    ProducerBusy,
    ProducerFenced,
    ProducerSpec,
    QuotaExceeded,
    StartPosition,
    SubscriptionKind,
    SubscriptionSpec,
    TopicBusy,
)
from mop.partitioned import PartitionedTopics
from mop.schemas.model import Compatibility, SchemaInfo, StoredSchema

# The shared words of `mop.messaging` are part of this contract: importable from here too.
__all__ = [
    "Backend",
    "BackendCapabilities",
    "BackendError",
    "BatchPublisher",
    "ClientLease",
    "Consumer",
    "ConsumerClosed",
    "ConsumerStats",
    "CursorPosition",
    "DropNotifier",
    "FenceNotifier",
    "Producer",
    "ProducerAccess",
    "ProducerBusy",
    "ProducerFenced",
    "ProducerSpec",
    "PublishResult",
    "QuotaExceeded",
    "Role",
    "StartPosition",
    "SubscriptionKind",
    "SubscriptionSpec",
    "SubscriptionStats",
    "Table",
    "TopicBusy",
    "TopicStats",
    "Traffic",
]


class ConsumerClosed(Exception):
    """The consumer was closed (by its owner, by unsubscribe, or because the backend stopped)."""


@value  # one per message published: cheaper to make than a frozen dataclass
class PublishResult:
    message_id: MessageId
    # How many subscriptions took the message; None when the backend cannot tell.
    subscriptions: int | None
    # Not stored again: its producer had sent this sequence id before.
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class CursorPosition:
    """Where a topic ends and where a subscription stands on it."""

    # The topic's last message (its last batch message for a batch); None when it has none.
    last: MessageId | None
    # Every message up to here is acknowledged by the subscription (None: none is).
    mark_delete: MessageId | None


@dataclass(frozen=True, slots=True)
class Traffic:
    """Messages and bytes (payloads) that went one way through a topic or a subscription:
    counted since its broker loaded the topic, and the recent rates per second."""

    messages: int = 0
    bytes: int = 0
    message_rate: float = 0.0
    byte_rate: float = 0.0


@dataclass(frozen=True, slots=True)
class ConsumerStats:
    """A consumer attached to a subscription of a topic."""

    # The consumer's name (a Pulsar consumer's), else its member name (an MQTT client id).
    name: str
    # Messages of the topic sent to it and not acknowledged yet.
    unacked: int = 0
    # Messages it may still be sent (a consumer with permits); None when it has no such count.
    permits: int | None = None


@dataclass(frozen=True, slots=True)
class SubscriptionStats:
    """One subscription as one topic sees it."""

    name: str
    # None when the broker does not say (Apache Pulsar leaves it out while no consumer is
    # attached).
    kind: SubscriptionKind | None
    # Messages of the topic not acknowledged by the subscription (Pulsar's msgBacklog),
    # including those sent to a consumer and not acknowledged yet.
    backlog: int
    consumers: tuple[ConsumerStats, ...] = ()
    # Sent to its consumers from this topic.
    outbound: Traffic = Traffic()
    # Kept while no consumer is attached (see `SubscriptionSpec.durable`).
    durable: bool = True


@dataclass(frozen=True, slots=True)
class TopicStats:
    """What a broker knows of one topic (a Pulsar TopicStats, in protocol-neutral words)."""

    # The full Pulsar name.
    topic: str
    # Published to the topic, and sent from it to every subscription.
    inbound: Traffic = Traffic()
    outbound: Traffic = Traffic()
    # Bytes its stored messages take in the broker's storage.
    storage_size: int = 0
    # The names of the producers registered by clients of the Pulsar protocol (MQTT
    # publishers register none).
    producers: tuple[str, ...] = ()
    subscriptions: tuple[SubscriptionStats, ...] = ()

    @property
    def backlog(self) -> int:
        """Messages not acknowledged, over every subscription."""
        return sum(sub.backlog for sub in self.subscriptions)

    @property
    def consumers(self) -> int:
        return sum(len(sub.consumers) for sub in self.subscriptions)


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

    def ack_through(self, topic: str, message_id: MessageId) -> None:
        """Cumulative acknowledgement: every message of `topic` up to and including
        `message_id`, for the whole subscription."""
        ...

    def grant(self, permits: int) -> None:
        """With `SubscriptionSpec.permits`: allow `permits` more messages to be sent."""
        ...

    async def seek(
        self, topic: str, *, message_id: MessageId | None = None, publish_time: int | None = None
    ) -> None:
        """Reset the subscription on `topic` to `message_id` (inclusive), to the first message
        published at or after `publish_time` (ms), or with neither to the first stored one.
        Later acknowledgements are forgotten; what consumers hold is taken back, uncounted.
        Only messages still stored can be reached."""
        ...

    async def position(self, topic: str) -> CursorPosition: ...

    @property
    def active(self) -> bool:
        """In a failover subscription, whether messages go to this consumer."""
        ...

    async def active_changed(self) -> bool:
        """Wait until `active` differs from what this call last returned (from its value when
        the consumer was made, the first time) and return the new value."""
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


class Producer(Protocol):
    """A registered producer of one topic (see `ProducerSpec` and `ProducerAccess`)."""

    @property
    def spec(self) -> ProducerSpec: ...

    @property
    def ready(self) -> bool:
        """False while a wait-for-exclusive producer waits for the topic."""
        ...

    @property
    def topic_epoch(self) -> int | None:
        """The fencing token of an exclusive producer (None for a shared one)."""
        ...

    @property
    def last_sequence_id(self) -> int:
        """The highest sequence id stored for this producer name on the topic (-1: none)."""
        ...

    async def wait_ready(self) -> None:
        """Return once the producer may send; raises ProducerFenced if it never will."""
        ...

    async def wait_fenced(self) -> None:
        """Return when another producer took the topic over; this one can no longer send."""
        ...

    def send(
        self, message: Message, *, sequence_id: int = -1, highest_sequence_id: int = -1
    ) -> Awaitable[PublishResult]:
        """Store `message` behind those sent before (in call order) and return an awaitable
        that completes once it is durable. A message whose `sequence_id` (>= 0) is not above
        the producer's last one is not stored again (`PublishResult.duplicate`); a batch
        carries the ids `sequence_id`..`highest_sequence_id`. Raises BackendError at once when
        the message cannot be taken (quota, storage, a producer that is not ready)."""
        ...

    async def close(self) -> None: ...


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

    def watch(self, callback: Callable[[str, bytes | None], None]) -> None:
        """Call `callback(key, value)` (None: deleted), on the trio thread, whenever a key is
        changed by another node, or by a Pulsar client that writes the table's topic
        (`mop.topic_names.table_topic`), so that state derived from the table can follow.
        Writes made through this object are not reported."""
        ...


class ClientLease(Protocol):
    """Exclusive ownership of a client id across the deployment."""

    @property
    def client_id(self) -> str: ...

    async def wait_fenced(self) -> None:
        """Return when another connection has taken this client id over."""
        ...

    async def release(self) -> None: ...


class DropNotifier(Protocol):
    """An optional capability of a Backend (`BackendCapabilities.drop_callbacks`): it tells
    of the messages it drops for a subscription (a session that cannot keep up), so that they
    are counted and reported with the drops of the adapters."""

    def on_dropped(self, callback: Callable[[str, str, int], None]) -> None:
        """Call `callback(subscription, reason, count)` on the event loop's thread for the
        messages a subscription drops from now on. One callback per backend."""
        ...


class FenceNotifier(Protocol):
    """An optional capability of a ClientLease (`BackendCapabilities.fence_callbacks`): a
    callback instead of a task waiting in `wait_fenced`, so that a connection that is never
    taken over holds no task for it."""

    def on_fenced(self, callback: Callable[[], None]) -> None:
        """Call `callback` once, on the event loop's thread, when the lease is fenced (at
        once if it is already); a released lease never calls it. One callback per lease."""
        ...


class Role(Protocol):
    """A duty that one node of the deployment performs at a time (the timers of offline MQTT
    sessions, say), held by whichever node the backend chose.

    `Backend.hold_role(name)` enters this node for the role and returns at once, holding it or
    not yet; the backend keeps trying to get it until `release`, and hands it to another node
    when this one releases it, stops or dies. Before it reports a gain (`held` true, `changed`
    returning True), the backend has shown this node every table write the previous holder
    made. A node that loses the role must stop the duty: `held` turns false as soon as the
    backend knows, and `changed` reports it. At most one node holds a role in normal
    operation; each backend documents the windows in which two may overlap.
    """

    @property
    def name(self) -> str: ...

    @property
    def held(self) -> bool:
        """Whether this node holds the role now; cheap enough to ask before each act of the
        duty. It may turn false before `changed` reports the loss."""
        ...

    @property
    def permanent(self) -> bool:
        """True when this node is the whole deployment (merged mode): it holds the role from
        the start and for good, and any state it finds at its start was left by its own
        previous run, not by another live node."""
        ...

    async def changed(self) -> bool:
        """Wait until the role is held or not, unlike what this call last returned (False
        before the first call), and return the new value. A gain and a loss between two calls
        cancel out and are not reported."""
        ...

    async def release(self) -> None:
        """Leave the role (to another node, if one is waiting); `held` is false from now on."""
        ...


@dataclass(frozen=True, slots=True)
class BackendCapabilities:
    """What a backend does beyond the required methods of `Backend`: each backend declares
    its own once, as its `capabilities` attribute, and callers ask nothing else."""

    # It has `publish_batch` (see `BatchPublisher`); without it the processor calls
    # `Backend.publish` once per message.
    publish_batch: bool = False
    # It does `SubscriptionSpec.auto_ack_qos0` itself (cheaper than acknowledging); for any
    # other backend the processor acknowledges those messages right after `receive`
    # (`mop.processor.at_most_once`).
    auto_acks_qos0: bool = False
    # Its leases call back when fenced (see `FenceNotifier`); without it a caller waits in
    # `ClientLease.wait_fenced`.
    fence_callbacks: bool = False
    # It reports the messages it drops for subscriptions (see `DropNotifier`).
    drop_callbacks: bool = False


class Backend(Protocol):
    @property
    def capabilities(self) -> BackendCapabilities:
        """What this backend does beyond the methods below (see `BackendCapabilities`)."""
        ...

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

    async def open_producer(self, spec: ProducerSpec) -> Producer:
        """Register a producer; raises ProducerBusy or ProducerFenced when the topic's access
        rules refuse it. A wait-for-exclusive producer may come back not `ready` yet."""
        ...

    async def topics(self, namespace: str) -> list[str]:
        """The topics of `namespace` ("tenant/namespace"), persistent or not, in full form."""
        ...

    async def delete_subscription(self, name: str, member: str = "") -> None:
        """Remove a member of a subscription that has no consumer attached (e.g. an expired
        offline session); the subscription goes when its last member does. `member` is the
        one it was subscribed with (`SubscriptionSpec.member`)."""
        ...

    async def topic_stats(self, topic: str) -> TopicStats | None:
        """What the brokers know of `topic` (a full name); None when it does not exist."""
        ...

    async def delete_topic(self, topic: str, *, force: bool = False) -> bool:
        """Delete `topic` (a full name): its stored messages and every subscription's position
        on it. Subscriptions themselves stay (a later message to the same name creates the
        topic again, and it reaches the subscriptions whose selectors match it). Raises
        TopicBusy while consumers or producers are connected to it, unless `force`. False
        when there was no such topic."""
        ...

    def not_ready(self) -> list[str]:
        """Why the backend cannot serve clients now (storage closed, brokers unreachable), one
        line each; empty when it can. Cheap: it reads state kept up to date elsewhere."""
        ...

    def table(self, name: str) -> Table: ...

    @property
    def partitioned(self) -> PartitionedTopics:
        """The deployment's partitioned topics (see `mop.partitioned`)."""
        ...

    async def lookup(self, topic: str) -> str:
        """The service URL of the broker that owns `topic`."""
        ...

    async def hold_role(self, name: str) -> Role:
        """Enter this node for the cluster-wide role `name` (see `Role`); returns at once."""
        ...

    # -- schemas (kept by the broker that owns the topic, as Pulsar brokers keep them) -------

    async def schema(self, topic: str, version: int | None = None) -> StoredSchema | None:
        """Version `version` of `topic`'s schema (None: the latest); None when it has none."""
        ...

    async def get_or_create_schema(self, topic: str, schema: SchemaInfo) -> int:
        """The version of `schema` among `topic`'s schemas, added when it is new and its
        namespace's compatibility rule lets it follow them; raises IncompatibleSchema."""
        ...

    async def delete_schema(self, topic: str) -> int | None:
        """Delete every version of `topic`'s schema; the latest version it had, None when it
        had none."""
        ...

    async def schema_compatibility(self, namespace: str) -> Compatibility:
        """The compatibility rule of `namespace` ("tenant/namespace")."""
        ...

    async def set_schema_compatibility(self, namespace: str, rule: Compatibility | None) -> None:
        """Set the rule of `namespace` (None: back to the brokers' default)."""
        ...

    async def aclose(self) -> None: ...


class BatchPublisher(Protocol):
    """An optional capability of a Backend (`BackendCapabilities.publish_batch`): publish
    several messages with one wait for durability (one group commit) instead of one wait each.
    The processor falls back to `Backend.publish` per message for a backend without it."""

    async def publish_batch(
        self, items: Sequence[tuple[str, Message]]
    ) -> list[PublishResult | BackendError]:
        """Store and route the (topic, message) pairs in order, as if `publish` were called for
        each in turn, and return once every stored message with `qos` >= 1 is durable.

        One result per item, in order: its PublishResult, or the BackendError that refused it
        (at once, or because the write that was to make it durable failed). A refused item
        does not stop the items after it; messages with `qos` 0 never wait for durability.
        A backend may also return only once subscribers that the messages had to queue for
        took them (the merged node does, `limits.subscriber_backlog_bytes`): its caller does
        not read more from the publisher meanwhile, so that TCP pushes back on it.
        """
        ...
