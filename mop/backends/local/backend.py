"""`LocalBackend`: the `Backend` of merged mode, which calls straight into the colocated broker
and storage. Waiting (receive, fencing, delayed redelivery) is done here, with trio.

`$SYS` topics are the node's own and skip the broker: a publish goes to the consumers that
follow them, in memory, as on a separated proxy (`mop.backends.node_local`), so that nothing
is stored or kept per topic (client events name a topic per client id).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import trio

from mop.backends.local.consumer import LocalConsumer
from mop.backends.local.errors import translate, translated
from mop.backends.local.lease import LocalLease
from mop.backends.local.partitioned import PARTITIONED_TABLE, LocalPartitionedTopics
from mop.backends.local.pressure import (
    DEFAULT_SUBSCRIBER_MAX_BYTES,
    DEFAULT_SUBSCRIBER_STALL_TIMEOUT,
    SubscriberPressure,
)
from mop.backends.local.producer import LocalProducer
from mop.backends.local.role import LocalRole
from mop.backends.local.stats import topic_stats
from mop.backends.local.table import LocalTable
from mop.backends.node_local import LocalTopics, is_local_selector
from mop.backlog_quota import (
    BacklogQuota,
    BacklogQuotaControl,
    BacklogQuotas,
    QuotaKind,
)
from mop.broker import (
    NON_PERSISTENT,
    Broker,
    BrokerError,
    BrokerStats,
)
from mop.broker.storage import Storage, StorageError
from mop.clock import now_ms
from mop.membership import Membership
from mop.message import Message
from mop.partitioned import OtherMembers, partition_index
from mop.processor.backend import (
    BackendCapabilities,
    BackendError,
    ProducerSpec,
    PublishResult,
    SubscriptionSpec,
    TopicStats,
)
from mop.retention import RetentionControl, RetentionPolicies, RetentionPolicy
from mop.schemas.model import Compatibility, SchemaInfo, StoredSchema
from mop.schemas.registry import (
    DEFAULT_MAX_BYTES as DEFAULT_SCHEMA_MAX_BYTES,
)
from mop.schemas.registry import SCHEMA_POLICIES_TABLE, SCHEMAS_TABLE, SchemaRegistry
from mop.topic_names import mqtt_to_pulsar

if TYPE_CHECKING:
    from mop.processor.backend import (
        Backend,
        BatchPublisher,
        ClientLease,
        Consumer,
        FenceNotifier,
        Producer,
        Table,
    )

__all__ = ["LocalBackend", "open_local_backend"]

# What `lookup` answers when no membership is given.
DEFAULT_URL = "pulsar://127.0.0.1:6650"

# Messages a permit-based consumer may hold unacknowledged before dispatch to it pauses.
MAX_UNACKED_PER_CONSUMER = 50_000


class LocalBackend:
    """The merged-mode backend. Run it with `await nursery.start(backend.serve)` (or use
    `open_local_backend`): `serve` recovers the broker from storage, then runs delayed
    redelivery and trimming until `aclose()`."""

    # `SubscriptionSpec.auto_ack_qos0` is done by the broker, as messages are taken.
    capabilities = BackendCapabilities(
        publish_batch=True, auto_acks_qos0=True, fence_callbacks=True, drop_callbacks=True
    )

    def __init__(
        self,
        storage: Storage,
        *,
        tenant: str = "public",
        namespace: str = "default",
        membership: Membership | None = None,
        receiver_queue: int = 1000,
        fence_timeout: float = 10.0,
        trim_interval: float = 1.0,
        unsubscribed_grace: float = 0.0,
        retention: RetentionPolicies | None = None,
        retention_check: float = 10.0,
        backlog_quotas: BacklogQuotas | None = None,
        schema_compatibility: Compatibility = Compatibility.FULL,
        schema_max_bytes: int = DEFAULT_SCHEMA_MAX_BYTES,
        other_members: OtherMembers | None = None,
        subscriber_max_bytes: int = DEFAULT_SUBSCRIBER_MAX_BYTES,
        subscriber_stall_timeout: float = DEFAULT_SUBSCRIBER_STALL_TIMEOUT,
    ) -> None:
        self.storage = storage
        self.broker = Broker(
            storage,
            tenant=tenant,
            namespace=namespace,
            unsubscribed_grace=unsubscribed_grace,
            retention=retention,
            retention_check=retention_check,
            backlog_quotas=backlog_quotas,
        )
        self.broker.on_scheduled = self._delays_changed
        self.broker.compacted.on_change = self._table_changed
        # This broker's URL, and the members of its cluster (none or one: it owns every topic).
        self.membership = membership or Membership((), DEFAULT_URL)
        self.receiver_queue = receiver_queue
        # Publishers wait for subscribers that keep up, rather than their messages dropping.
        self.pressure = SubscriberPressure(subscriber_max_bytes, subscriber_stall_timeout)
        self.broker.wait_for_subscribers(self.pressure.may_hold_back)
        # `$SYS`: delivered in memory to the consumers that follow it, never stored.
        self.local = LocalTopics(tenant=tenant, namespace=namespace)
        self.fence_timeout = fence_timeout
        self.trim_interval = trim_interval
        self._leases: dict[str, LocalLease] = {}
        self._consumers: set[LocalConsumer] = set()
        self._tables: dict[str, LocalTable] = {}
        # Topics whose record a producer's open is writing: another producer opening one of
        # them syncs too, not to be told the topic exists before its record is durable.
        self._recording: set[str] = set()
        self._table_topics: dict[str, LocalTable] = {}
        self.partitioned = LocalPartitionedTopics(
            lambda: self.table(PARTITIONED_TABLE),
            self.topics,
            lambda topic, force: self.delete_topic(topic, force=force),
            in_use=lambda topic: any(self.broker.topic_users(topic)),
            declare=self._declare_topics,
            owns=self.membership.owns,
            others=other_members,
            delete_schema=lambda topic: self.schemas.delete(topic),
        )
        self._delay_event = trio.Event()
        self._stop = trio.Event()
        self._schema_default = schema_compatibility
        self._schema_max_bytes = schema_max_bytes
        self._schemas: SchemaRegistry | None = None
        self._running = False
        self._closed = False

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Recover, report readiness, and run background work until `aclose()`."""
        if self._running or self._closed:
            raise RuntimeError("LocalBackend.serve() may run only once")
        with translated():
            await self.broker.recover()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._redeliver_delayed)
            nursery.start_soon(self._trim_periodically)
            self._running = True
            task_status.started()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    async def _redeliver_delayed(self) -> None:
        """Return nacked messages after their delay, and release messages held back until
        their `deliver_at` (on the wall clock)."""
        broker = self.broker
        while True:
            self._delay_event = trio.Event()
            due = broker.next_due()
            deadline = float("inf") if due is None else due
            scheduled = broker.next_scheduled()
            if scheduled is not None:
                wait = max(0.0, (scheduled - now_ms()) / 1000.0)
                deadline = min(deadline, trio.current_time() + wait)
            with trio.move_on_at(deadline):
                await self._delay_event.wait()
            broker.release_due(trio.current_time())
            broker.release_scheduled()

    def _delays_changed(self) -> None:
        self._delay_event.set()

    async def _trim_periodically(self) -> None:
        while True:
            await trio.sleep(self.trim_interval)
            with translated():
                self.broker.trim_acknowledged(trio.current_time())

    # -- backlog quotas (`mop.backlog_quota.BacklogQuotaControl`, for the admin API) -------

    async def backlog_quotas(self, namespace: str) -> Mapping[QuotaKind, BacklogQuota]:
        await trio.lowlevel.checkpoint()
        return self.broker.quota.quotas.for_namespace(namespace)

    async def set_backlog_quota(
        self, namespace: str, kind: QuotaKind, quota: BacklogQuota | None
    ) -> None:
        self._check_running()
        with translated():
            await self.broker.set_backlog_quota(namespace, kind, quota)

    # -- retention (`mop.retention.RetentionControl`, for the admin API) -------------------

    async def retention(self, namespace: str) -> RetentionPolicy:
        await trio.lowlevel.checkpoint()
        return self.broker.retention.for_namespace(namespace)

    async def set_retention(self, namespace: str, policy: RetentionPolicy | None) -> None:
        self._check_running()
        with translated():
            await self.broker.set_retention(namespace, policy)

    def _check_running(self) -> None:
        if self._closed:
            raise BackendError("backend is closed", reason="closed")
        if not self._running:
            raise BackendError("backend is not running: start serve() first", reason="closed")

    # -- Backend ---------------------------------------------------------------------------

    async def open_client(self, client_id: str) -> LocalLease:
        self._check_running()
        previous = self._leases.get(client_id)
        lease = self._leases[client_id] = LocalLease(self, client_id)
        if previous is None:
            await trio.lowlevel.checkpoint()
            return lease
        previous.set_fenced()
        try:
            # A holder that does not let go in time loses the id anyway: it is fenced.
            with trio.move_on_after(self.fence_timeout):
                await previous.wait_released()
        except BaseException:
            lease._release_now()
            raise
        return lease

    def _lease_released(self, lease: LocalLease) -> None:
        if self._leases.get(lease.client_id) is lease:
            del self._leases[lease.client_id]

    async def publish(self, topic: str, message: Message) -> PublishResult:
        self._check_running()
        if self.local.owns(topic):
            await trio.lowlevel.checkpoint()
            return self.local.publish(topic, message)
        try:
            published = await self.broker.publish(topic, message)
        except (StorageError, BrokerError) as exc:
            raise translate(exc) from exc
        if message.deliver_at:
            self._delays_changed()
        return PublishResult(published.message_id, published.subscriptions)

    async def publish_batch(
        self, items: Sequence[tuple[str, Message]]
    ) -> list[PublishResult | BackendError]:
        """Store every message in order, then make them durable with one storage sync."""
        try:
            self._check_running()
        except BackendError as exc:
            return [exc] * len(items)
        waits = self.pressure.max_bytes > 0
        if waits:
            self.broker.note_behind()
        try:
            results, durable, delays = self._route_batch(items)
        finally:
            behind = self.broker.take_behind() if waits else None
        if delays:
            self._delays_changed()
        if durable:
            try:
                await self.storage.sync()
            except StorageError as exc:
                error = translate(exc)
                for index in durable:
                    results[index] = error
        if behind:
            # Not read from again until the subscribers these messages queued for took them.
            await self.pressure.wait_for(behind)
        return results

    def _route_batch(
        self, items: Sequence[tuple[str, Message]]
    ) -> tuple[list[PublishResult | BackendError], list[int], bool]:
        """Store and route every message in order: the results, the indexes of those that
        wait for the storage sync, and whether any is held back until its `deliver_at`."""
        store_many = self.broker.store_many
        results: list[PublishResult | BackendError] = []
        durable: list[int] = []  # indexes of the results that wait for the sync
        delays = False
        start, end = 0, len(items)
        while start < end:
            # Consecutive messages of one topic (usually a whole read from one client) are
            # stored and routed together.
            topic = items[start][0]
            stop = start + 1
            while stop < end and items[stop][0] == topic:
                stop += 1
            messages = [message for _, message in items[start:stop]]
            outcomes: list[PublishResult | BackendError]
            if self.local.owns(topic):
                results += [self.local.publish(topic, message) for message in messages]
                start = stop
                continue
            if len(messages) == 1:
                outcomes = [self._store_one(topic, messages[0])]
            else:
                try:
                    ids, count = store_many(topic, messages)
                except (StorageError, BrokerError):
                    # None of them was stored: one at a time, for a result each.
                    outcomes = [self._store_one(topic, message) for message in messages]
                else:
                    outcomes = [PublishResult(message_id, count) for message_id in ids]
            persistent = not topic.startswith(NON_PERSISTENT)
            for index, (message, outcome) in enumerate(zip(messages, outcomes, strict=True)):
                if (message.qos or message.deliver_at) and isinstance(outcome, PublishResult):
                    if message.qos and persistent:
                        durable.append(len(results) + index)
                    if message.deliver_at:
                        delays = True
            results += outcomes
            start = stop
        return results, durable, delays

    def _store_one(self, topic: str, message: Message) -> PublishResult | BackendError:
        try:
            published = self.broker.store(topic, message)
        except (StorageError, BrokerError) as exc:
            return translate(exc)
        return PublishResult(published.message_id, published.subscriptions)

    async def open_producer(self, spec: ProducerSpec) -> LocalProducer:
        self._check_running()
        if self.broker.quota.blocked:
            with translated():
                self.broker.quota.refuse(spec.topic)
        producer = LocalProducer(self, spec)
        # As in Pulsar, the topic exists from its first producer on, sent to or not.
        topic = spec.topic
        try:
            with translated():
                if self.broker.open_topic(topic):
                    self._recording.add(topic)
                    try:
                        await self.storage.sync()
                    finally:
                        self._recording.discard(topic)
                elif topic in self._recording:
                    await self.storage.sync()
        except BaseException:
            await producer.close()
            raise
        await trio.lowlevel.checkpoint()
        return producer

    async def topics(self, namespace: str) -> list[str]:
        await trio.lowlevel.checkpoint()
        return self.broker.topics(namespace)

    async def _declare_topics(self, topics: list[str]) -> None:
        """Make `topics` exist, as a producer opening each would: those this broker owns (in
        a cluster the others' owners make theirs when they are first used)."""
        self._check_running()
        recorded = False
        with translated():
            for topic in topics:
                if self.membership.owns(topic):
                    recorded = self.broker.open_topic(topic) or recorded
                    self.broker.close_topic(topic)
            if recorded:
                await self.storage.sync()
        await trio.lowlevel.checkpoint()

    async def topic_stats(self, topic: str) -> TopicStats | None:
        """The topic's stats from the broker's own state (see `mop.backends.local.stats`)."""
        self._check_running()
        await trio.lowlevel.checkpoint()
        return topic_stats(self.broker, topic, self.broker.now())

    async def delete_topic(self, topic: str, *, force: bool = False) -> bool:
        """See `Broker.delete_topic`: the subscriptions stay, as the contract says."""
        self._check_running()
        await trio.lowlevel.checkpoint()
        with translated():
            deleted = await self.broker.delete_topic(topic, force=force)
        if deleted and partition_index(topic) is None:
            # As Pulsar does: a deleted topic's schema goes with it (a partition's is the
            # partitioned topic's, deleted with that).
            await self.schemas.delete(topic)
        return deleted

    def not_ready(self) -> list[str]:
        if self._closed:
            return ["the broker is closed"]
        if not self._running:
            return ["the broker is recovering its storage"]
        if self.storage.closed:
            return ["the broker's storage is closed"]
        return []

    async def subscribe(self, spec: SubscriptionSpec) -> LocalConsumer:
        self._check_running()
        consumer = LocalConsumer(self, spec)
        with translated():
            att = await self.broker.subscribe(
                self.broker_spec(spec),
                capacity=MAX_UNACKED_PER_CONSUMER if spec.permits else self.receiver_queue,
                on_ready=consumer._on_ready,
                on_active=consumer._on_active,
            )
        consumer._att = att
        consumer._seen_active = consumer._active
        self._delays_changed()
        if self._closed:
            consumer._shutdown()
            raise BackendError("backend is closed", reason="closed")
        self._consumers.add(consumer)
        consumer._follow_local()
        return consumer

    def is_local(self, selector: str) -> bool:
        """Whether `selector` names or matches the node's own topics (`$SYS`)."""
        broker = self.broker
        return is_local_selector(selector, tenant=broker.tenant, namespace=broker.namespace)

    def broker_spec(self, spec: SubscriptionSpec) -> SubscriptionSpec:
        """`spec` as the broker sees it: without the selectors of the node's own topics,
        which it does not hold (an exact one would make it keep the topic)."""
        if not any(self.is_local(selector) for selector in spec.selectors):
            return spec
        selectors = frozenset(s for s in spec.selectors if not self.is_local(s))
        return dataclasses.replace(spec, selectors=selectors)

    async def delete_subscription(self, name: str, member: str = "") -> None:
        self._check_running()
        with translated():
            await self.broker.delete_subscription(name, member)

    def table(self, name: str) -> LocalTable:
        """Table `name`: its compacted topic in the broker (see `LocalTable`)."""
        table = self._tables.get(name)
        if table is None:
            table = LocalTable(self.broker, name, check_running=self._check_running)
            self._tables[name] = self._table_topics[table.topic] = table
        return table

    def _table_changed(
        self, topic: str, key: str, before: Message | None, after: Message | None
    ) -> None:
        table = self._table_topics.get(topic)
        if table is not None:
            table._changed(key, before, after)

    async def lookup(self, topic: str) -> str:
        """The URL of the cluster member that owns `topic` (an MQTT or a full Pulsar name)."""
        await trio.lowlevel.checkpoint()
        membership = self.membership
        if not membership.clustered:
            return membership.advertised_url
        broker = self.broker
        return membership.owner(
            mqtt_to_pulsar(topic, tenant=broker.tenant, namespace=broker.namespace)
        )

    async def hold_role(self, name: str) -> LocalRole:
        """Every role: this node is the only one (see `LocalRole`)."""
        self._check_running()
        await trio.lowlevel.checkpoint()
        return LocalRole(name)

    # -- schemas ---------------------------------------------------------------------------

    @property
    def schemas(self) -> SchemaRegistry:
        """The registry of this broker's topics' schemas, in two of its tables."""
        if self._schemas is None:
            self._schemas = SchemaRegistry(
                self.table(SCHEMAS_TABLE),
                self.table(SCHEMA_POLICIES_TABLE),
                self._schema_default,
                max_bytes=self._schema_max_bytes,
            )
        return self._schemas

    async def schema(self, topic: str, version: int | None = None) -> StoredSchema | None:
        self._check_running()
        await trio.lowlevel.checkpoint()
        return self.schemas.get(topic, version)

    async def get_or_create_schema(self, topic: str, schema: SchemaInfo) -> int:
        self._check_running()
        with translated():
            return await self.schemas.get_or_create(topic, schema)

    async def delete_schema(self, topic: str) -> int | None:
        self._check_running()
        with translated():
            return await self.schemas.delete(topic)

    async def schema_compatibility(self, namespace: str) -> Compatibility:
        self._check_running()
        await trio.lowlevel.checkpoint()
        return self.schemas.compatibility(namespace)

    async def set_schema_compatibility(self, namespace: str, rule: Compatibility | None) -> None:
        self._check_running()
        with translated():
            await self.schemas.set_compatibility(namespace, rule)

    def on_dropped(self, callback: Callable[[str, str, int], None]) -> None:
        """See `DropNotifier`: the broker's `max_backlog` drops, as they happen."""
        self.broker.on_dropped(callback)

    def stats(self) -> BrokerStats:
        """Counts for `$SYS` topics and metrics: topics, subscriptions, messages."""
        return self.broker.stats()

    def largest_backlogs(self, limit: int) -> list[tuple[str, str, int]]:
        """(subscription, topic, messages waiting) of the `limit` largest backlogs."""
        return self.broker.largest_backlogs(limit)

    async def aclose(self) -> None:
        """Close every consumer (a waiting `receive` raises ConsumerClosed), fence every
        lease, stop `serve` and close the storage."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        for consumer in list(self._consumers):
            consumer._shutdown()
        for lease in self._leases.values():
            lease.set_fenced()
        self._stop.set()
        with trio.CancelScope(shield=True), translated():
            if self.partitioned.others is not None:
                await self.partitioned.others.aclose()
            await self.storage.aclose()


@asynccontextmanager
async def open_local_backend(
    storage: Storage,
    *,
    tenant: str = "public",
    namespace: str = "default",
    membership: Membership | None = None,
    receiver_queue: int = 1000,
    fence_timeout: float = 10.0,
    trim_interval: float = 1.0,
    unsubscribed_grace: float = 0.0,
    retention: RetentionPolicies | None = None,
    retention_check: float = 10.0,
    backlog_quotas: BacklogQuotas | None = None,
    subscriber_max_bytes: int = DEFAULT_SUBSCRIBER_MAX_BYTES,
    subscriber_stall_timeout: float = DEFAULT_SUBSCRIBER_STALL_TIMEOUT,
) -> AsyncIterator[LocalBackend]:
    """Run a `LocalBackend` over `storage` for the duration of the block, then close it."""
    backend = LocalBackend(
        storage,
        tenant=tenant,
        namespace=namespace,
        membership=membership,
        receiver_queue=receiver_queue,
        fence_timeout=fence_timeout,
        trim_interval=trim_interval,
        unsubscribed_grace=unsubscribed_grace,
        retention=retention,
        retention_check=retention_check,
        backlog_quotas=backlog_quotas,
        subscriber_max_bytes=subscriber_max_bytes,
        subscriber_stall_timeout=subscriber_stall_timeout,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(backend.serve)
        try:
            yield backend
        finally:
            await backend.aclose()


if TYPE_CHECKING:

    def _conforms(
        backend: LocalBackend,
        consumer: LocalConsumer,
        table: LocalTable,
        lease: LocalLease,
        producer: LocalProducer,
    ) -> tuple[
        Backend,
        BatchPublisher,
        Consumer,
        Table,
        ClientLease,
        FenceNotifier,
        Producer,
        RetentionControl,
        BacklogQuotaControl,
    ]:
        return backend, backend, consumer, table, lease, lease, producer, backend, backend
