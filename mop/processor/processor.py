"""The MessagingProcessor: the one protocol-neutral core every adapter talks to.

It applies what is common to all protocols (connection limits, counters for metrics and `$SYS`)
and delegates storage and routing to exactly one Backend, chosen by `mop.node`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, cast

from mop.counters import Closing, Drop, LatencyHistogram, ProtocolStats, drop_reason
from mop.message import Message
from mop.overload.guard import OverloadGuard
from mop.partitioned import PartitionedTopics
from mop.processor.at_most_once import AtMostOnceConsumer
from mop.processor.backend import (
    Backend,
    BackendCapabilities,
    BackendError,
    BatchPublisher,
    ClientLease,
    Consumer,
    DropNotifier,
    Producer,
    ProducerSpec,
    PublishResult,
    Role,
    SubscriptionSpec,
    Table,
    TopicStats,
)
from mop.processor.drops import DropLog
from mop.processor.stats import ProcessorStats
from mop.processor.tracing import MessageTracing
from mop.schemas.model import Compatibility, SchemaInfo, StoredSchema
from mop.security.authorization import ClientPermissions
from mop.security.gatekeeper import Gatekeeper
from mop.security.identity import ANONYMOUS, Credentials, Principal


@dataclass(frozen=True, slots=True)
class ClientContext:
    """Who is asking: passed with every call so limits, ACLs and metrics can use it."""

    client_id: str
    protocol: str
    peer: str = ""
    username: str | None = None
    # The node itself (e.g. `$SYS` updates): not counted as a message received from a client.
    internal: bool = False
    # Who the client proved to be (`MessagingProcessor.authenticate`).
    principal: Principal = ANONYMOUS


class CountedProducer:
    """A backend producer whose sends count as messages received from clients (and, one in
    `latency.every`, are timed until stored)."""

    def __init__(
        self, producer: Producer, stats: ProtocolStats, latency: LatencyHistogram | None = None
    ) -> None:
        self._producer = producer
        self._stats = stats
        self._latency = latency or LatencyHistogram()

    @property
    def spec(self) -> ProducerSpec:
        return self._producer.spec

    @property
    def ready(self) -> bool:
        return self._producer.ready

    @property
    def topic_epoch(self) -> int | None:
        return self._producer.topic_epoch

    @property
    def last_sequence_id(self) -> int:
        return self._producer.last_sequence_id

    async def wait_ready(self) -> None:
        await self._producer.wait_ready()

    async def wait_fenced(self) -> None:
        await self._producer.wait_fenced()

    def send(
        self, message: Message, *, sequence_id: int = -1, highest_sequence_id: int = -1
    ) -> Awaitable[PublishResult]:
        self._stats.messages_received += message.count
        self._stats.payload_bytes_received += len(message.payload)
        stored = self._producer.send(
            message, sequence_id=sequence_id, highest_sequence_id=highest_sequence_id
        )
        if self._latency.due():
            return _Timed(stored, self._latency, time.perf_counter())
        return stored

    async def close(self) -> None:
        await self._producer.close()


class _Timed:
    """An outcome to await that records, when awaited, how long it took since `start`. Not a
    coroutine: nothing warns when the outcome is never awaited (a producer closed first)."""

    __slots__ = ("_latency", "_outcome", "_start")

    def __init__(
        self, outcome: Awaitable[PublishResult], latency: LatencyHistogram, start: float
    ) -> None:
        self._outcome = outcome
        self._latency = latency
        self._start = start

    def __await__(self) -> Generator[Any, Any, PublishResult]:
        result = yield from self._outcome.__await__()
        self._latency.record(time.perf_counter() - self._start)
        return result


class ConnectionLimitReached(Exception):
    """The node already serves its configured maximum number of clients."""


class MessagingProcessor:
    def __init__(
        self,
        backend: Backend,
        *,
        max_connections: int = 0,
        gatekeeper: Gatekeeper | None = None,
        clock: Callable[[], float] = time.time,
        overload: OverloadGuard | None = None,
        tracing: MessageTracing | None = None,
    ) -> None:
        self.backend = backend
        self.max_connections = max_connections
        # Authentication, ACLs and bans, the same for every adapter; without one, everyone is
        # anonymous and allowed everything.
        self.gatekeeper = gatekeeper or Gatekeeper()
        # Overload protection, the same for every adapter: per-client rates and the memory
        # high-water mark (`mop.overload`); without one, nothing is limited.
        self.overload = overload or OverloadGuard()
        self._clock = clock
        # Traces of messages (publish -> store -> deliver), which the adapters record; None
        # when the node does not trace, so that the message paths pay one None check.
        self.tracing = tracing
        self.stats = ProcessorStats(started_at=time.monotonic())
        # What the backend does beyond the contract's required methods, as it declares it.
        self.capabilities: BackendCapabilities = backend.capabilities
        self._batches: BatchPublisher | None = (
            cast("BatchPublisher", backend) if self.capabilities.publish_batch else None
        )
        self.drop_log = DropLog()
        if self.capabilities.drop_callbacks:
            cast("DropNotifier", backend).on_dropped(self._backend_dropped)

    def authenticate(self, credentials: Credentials) -> Principal:
        """Who `credentials` prove the client is, or AuthenticationError (which says how the
        adapter answers: bad credentials, not authorized, banned, expired)."""
        return self.gatekeeper.admit(credentials, self._clock())

    def permissions(self, ctx: ClientContext) -> ClientPermissions:
        """What the client of `ctx` may do with topics (MQTT-style names and filters; see
        `mop.security.acl`), remembered per topic until the rules change."""
        # Interned: kept for as long as the client stays, one string per client host.
        address = sys.intern(ctx.peer.rpartition(":")[0] or ctx.peer)
        return self.gatekeeper.permissions(ctx.principal, ctx.client_id, address)

    def credential_valid(self, ctx: ClientContext) -> bool:
        """Whether the credential the client connected with still holds (a token's expiry)."""
        return self.gatekeeper.still_valid(ctx.principal, self._clock())

    async def open_client(self, ctx: ClientContext, *, admit: bool = True) -> ClientLease:
        """Admit a client and take its id (fencing an older connection with the same id).

        With `admit` False the connection holds its place (counted as active) but is not yet
        counted as opened: the adapter calls `admit_client` once it has answered the client,
        or `withdraw_client` when it refuses it after all (its session could not be read, say),
        so that a refused connection is counted as refused only."""
        if self.max_connections and self.stats.connections >= self.max_connections:
            raise ConnectionLimitReached(f"the node serves {self.max_connections} clients already")
        stats = self.stats.protocol(ctx.protocol)
        stats.connections += 1
        try:
            lease = await self.backend.open_client(ctx.client_id)
        except BaseException:
            stats.connections -= 1
            raise
        if admit:
            self.admit_client(ctx)
        return lease

    def admit_client(self, ctx: ClientContext) -> None:
        """Count as opened a connection `open_client(ctx, admit=False)` let in."""
        stats = self.stats.protocol(ctx.protocol)
        stats.opened += 1
        stats.connections_peak = max(stats.connections_peak, stats.connections)
        self.stats.note_peak()

    async def withdraw_client(self, ctx: ClientContext, lease: ClientLease) -> None:
        """Give up the client id of a connection `open_client(ctx, admit=False)` let in and
        the adapter then refused: neither opened nor closed, it is counted as refused only,
        by the adapter (as any refused connection)."""
        self.stats.protocol(ctx.protocol).connections -= 1
        await lease.release()

    async def close_client(
        self, ctx: ClientContext, lease: ClientLease, reason: str = Closing.NORMAL
    ) -> None:
        """Give the client id up; `reason` (`mop.counters.Closing`) is counted."""
        self.stats.protocol(ctx.protocol).close(reason)
        await lease.release()

    async def publish(self, ctx: ClientContext, topic: str, message: Message) -> PublishResult:
        stats = self.stats
        if not ctx.internal:
            protocol = stats.protocol(ctx.protocol)
            protocol.messages_received += 1
            protocol.payload_bytes_received += len(message.payload)
        latency = stats.publish_latency
        if latency.due():
            start = time.perf_counter()
            result = await self.backend.publish(topic, message)
            latency.record(time.perf_counter() - start)
        else:
            result = await self.backend.publish(topic, message)
        return result

    async def publish_batch(
        self, ctx: ClientContext, items: Sequence[tuple[str, Message]]
    ) -> list[PublishResult | BackendError]:
        """Publish (topic, message) pairs in order with one wait for durability; one result
        per item, a BackendError for an item that was refused (see `BatchPublisher`)."""
        stats = self.stats
        if not ctx.internal:
            protocol = stats.protocol(ctx.protocol)
            protocol.messages_received += len(items)
            protocol.payload_bytes_received += sum([len(message.payload) for _, message in items])
        latency = stats.publish_latency
        start = time.perf_counter() if latency.due() else 0.0
        results: list[PublishResult | BackendError]
        if self._batches is not None:
            results = await self._batches.publish_batch(items)
        else:
            results = []
            for topic, message in items:
                try:
                    results.append(await self.backend.publish(topic, message))
                except BackendError as exc:
                    results.append(exc)
        if start:
            latency.record(time.perf_counter() - start)
        return results

    async def subscribe(self, ctx: ClientContext, spec: SubscriptionSpec) -> Consumer:
        consumer = await self.backend.subscribe(spec)
        if spec.auto_ack_qos0 and not self.capabilities.auto_acks_qos0:
            return AtMostOnceConsumer(consumer)  # the backend leaves it to us
        return consumer

    async def open_producer(self, ctx: ClientContext, spec: ProducerSpec) -> Producer:
        """Register a producer (see `Backend.open_producer`); its sends are counted."""
        return CountedProducer(
            await self.backend.open_producer(spec),
            self.stats.protocol(ctx.protocol),
            self.stats.publish_latency,
        )

    async def topics(self, ctx: ClientContext, namespace: str) -> list[str]:
        return await self.backend.topics(namespace)

    async def delete_subscription(self, name: str, member: str = "") -> None:
        await self.backend.delete_subscription(name, member)

    def table(self, name: str) -> Table:
        return self.backend.table(name)

    async def topic_stats(self, topic: str) -> TopicStats | None:
        """What the brokers know of `topic` (a full name), for the admin API; None when it
        does not exist."""
        return await self.backend.topic_stats(topic)

    async def delete_topic(self, topic: str, *, force: bool = False) -> bool:
        """Delete `topic` (a full name; see `Backend.delete_topic`), for the admin API."""
        return await self.backend.delete_topic(topic, force=force)

    async def schema(self, topic: str, version: int | None = None) -> StoredSchema | None:
        """Version `version` of `topic`'s schema (None: the latest); None when it has none."""
        return await self.backend.schema(topic, version)

    async def get_or_create_schema(self, topic: str, schema: SchemaInfo) -> int:
        """The version of `schema` for `topic`, registered when new (see
        `Backend.get_or_create_schema`); raises IncompatibleSchema."""
        return await self.backend.get_or_create_schema(topic, schema)

    async def delete_schema(self, topic: str) -> int | None:
        """Delete `topic`'s schema (see `Backend.delete_schema`), for the admin API."""
        return await self.backend.delete_schema(topic)

    async def schema_compatibility(self, namespace: str) -> Compatibility:
        return await self.backend.schema_compatibility(namespace)

    async def set_schema_compatibility(self, namespace: str, rule: Compatibility | None) -> None:
        await self.backend.set_schema_compatibility(namespace, rule)

    def not_ready(self) -> list[str]:
        """Why the backend cannot serve clients now (empty: it can), for `/readyz`."""
        return self.backend.not_ready()

    async def lookup(self, topic: str) -> str:
        return await self.backend.lookup(topic)

    @property
    def partitioned(self) -> PartitionedTopics:
        """The partitioned topics (Pulsar's metadata over ordinary topics; see
        `mop.partitioned`), kept by the backend."""
        return self.backend.partitioned

    async def hold_role(self, name: str) -> Role:
        """Enter this node for a role one node of the deployment holds at a time (see
        `Role`): the adapters' cluster-wide duties, such as the timers of offline sessions."""
        return await self.backend.hold_role(name)

    def record_dropped(self, reason: str = Drop.REFUSED, messages: int = 1) -> None:
        """Count messages an adapter could not publish or deliver, by reason
        (`mop.counters.Drop`)."""
        self.stats.drop(reason, messages)

    def _backend_dropped(self, subscription: str, reason: str, count: int) -> None:
        """Messages the backend dropped for a subscription: counted with the adapters' drops
        (`$SYS/broker/messages/dropped`, metrics) and logged once per interval per subscription."""
        self.stats.drop(drop_reason(reason), count)
        self.drop_log.note(subscription, reason, count)
