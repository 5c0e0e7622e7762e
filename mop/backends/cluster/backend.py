"""`ClusterBackend`: the `Backend` of separated mode, over remote brokers through the Pulsar
protocol.

One `PulsarClient` per process (mop's own, on trio: `mop.protocols.pulsar.driver`) does lookups,
keeps one connection per broker for every producer and consumer, batches and reconnects; this
module maps the processor contract onto Pulsar, through the other modules of
`mop.backends.cluster`:

- publish: a cached producer per topic (`producers`), message fields as in `messages`;
- subscribe: a consumer per topic (`patterns`, `consumers`), the topics of MQTT
  filters found by one poller per namespace (`discovery`); non-durable exclusive subscriptions
  share one reader per topic per proxy instead (`fanout`);
- `$SYS` topics: this proxy's own, kept in memory and never sent to the brokers
  (`mop.backends.node_local`);
- tables: compacted topics in `{tenant}/__mop`, read into memory (`tables`);
- client ids: one presence table per namespace that every proxy follows (`leases`);
- roles held by one proxy at a time: an exclusive subscription per role topic (`roles`);
- topic lists and owners: short binary-protocol calls (`admin`);
- topic stats and deletion: the brokers' HTTP admin, Pulsar's REST API (`topic_admin`);
- readiness: a connection to some broker, checked every second (`health`).

Those parts never see the backend: they are given the `ClusterContext` that `serve` makes
(`context`) and the callbacks they need.

What a proxy cannot do: bound a durable subscription's backlog (`SubscriptionSpec.max_backlog`:
the broker keeps it), register producers of the Pulsar adapter (`open_producer`), tell a failover
consumer whether it is active, reposition one topic of a pattern consumer.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio

from mop.backends.cluster import admin
from mop.backends.cluster.consumers import ClusterConsumer
from mop.backends.cluster.context import ClusterContext
from mop.backends.cluster.discovery import NamespaceDiscovery
from mop.backends.cluster.errors import error_for
from mop.backends.cluster.fanout import FanOut, fans_out
from mop.backends.cluster.fanout_consumer import FanOutConsumer
from mop.backends.cluster.health import BrokerHealth
from mop.backends.cluster.leases import PRESENCE_TABLE, ClusterLease, Frontier, Presence
from mop.backends.cluster.namespace_admin import NamespaceAdmin
from mop.backends.cluster.options import ConsumerOptions, ProducerOptions
from mop.backends.cluster.partitioned import ClusterPartitionedTopics
from mop.backends.cluster.patterns import matching_selectors
from mop.backends.cluster.producers import NO_ID, ProducerCache, Receipt
from mop.backends.cluster.roles import ClusterRole, ClusterRoles
from mop.backends.cluster.schemas import BrokerSchemas
from mop.backends.cluster.tables import REGISTRY_TABLE, ClusterTable, SubscriptionRegistry
from mop.backends.cluster.timing import Delays
from mop.backends.cluster.topic_admin import BrokerAdmin, admin_urls
from mop.backends.node_local import LocalTopics
from mop.clock import now_ms
from mop.exception_groups import leaves
from mop.message import Message
from mop.processor.backend import (
    BackendCapabilities,
    BackendError,
    ProducerSpec,
    PublishResult,
    StartPosition,
    SubscriptionKind,
    SubscriptionSpec,
    TopicStats,
)
from mop.protocols.pulsar.client import NO_AUTH, ClientAuth
from mop.protocols.pulsar.driver import ClientOptions, DriverError, PulsarClient
from mop.protocols.pulsar.driver.errors import NoBrokerAnswers
from mop.protocols.pulsar.driver.stats import LinkStats
from mop.schemas.model import Compatibility, SchemaInfo, StoredSchema
from mop.version import VERSION

if TYPE_CHECKING:
    from mop.processor.backend import (
        Backend,
        BatchPublisher,
        ClientLease,
        Consumer,
        Producer,
        Table,
    )

__all__ = ["ClusterBackend", "open_cluster_backend"]

log = logging.getLogger("mop.cluster")

# While the brokers cannot be reached at start-up, a line says so this often (seconds).
CONNECT_PROGRESS_EVERY = 2.0


class ClusterBackend:
    """The separated-mode backend. Run it with `await nursery.start(backend.serve)` (or use
    `open_cluster_backend`); `serve` loads the tables in `tables` (plus the backend's own),
    reports readiness and runs background work until `aclose()`."""

    # Its leases call back when fenced (no task per connection to watch them).
    capabilities = BackendCapabilities(
        publish_batch=True, drop_callbacks=True, fence_callbacks=True
    )

    def __init__(
        self,
        service_url: str,
        *,
        tenant: str = "public",
        namespace: str = "default",
        tables: Iterable[str] = (),
        operation_timeout: float = 30.0,
        connect_timeout: float = 10.0,
        fence_timeout: float = 10.0,
        producers: ProducerOptions | None = None,
        consumers: ConsumerOptions | None = None,
        auth: ClientAuth = NO_AUTH,
        admin_url: str | None = None,
    ) -> None:
        self.service_url = service_url
        # The brokers' HTTP admin (`topic_admin`), for topic stats and deletion.
        try:
            self._admin = (
                None
                if admin_url is None
                else BrokerAdmin(admin_urls(admin_url), auth=auth, timeout=operation_timeout)
            )
        except ValueError as exc:
            raise BackendError(f"admin URL: {exc}", reason="invalid_url") from None
        self.health = BrokerHealth(service_url)
        self.auth = auth
        self.tenant = tenant
        self.namespace = namespace
        self.operation_timeout = operation_timeout
        self.connect_timeout = connect_timeout
        self.fence_timeout = fence_timeout
        self.producer_options = producers or ProducerOptions()
        self.consumer_options = consumers or ConsumerOptions()
        self._preload = [REGISTRY_TABLE, PRESENCE_TABLE, *dict.fromkeys(tables)]
        self._client: PulsarClient | None = None
        self.partitioned = ClusterPartitionedTopics(
            self._partition_count,
            self._topic_admin,
            self.topics,
            lambda topic, force: self.delete_topic(topic, force=force),
        )
        self._producers: ProducerCache | None = None
        self._nursery: trio.Nursery | None = None
        self.delays = Delays()
        # What the backend's clients count about their links to the brokers (the metrics).
        self.links = LinkStats()
        self.local = LocalTopics(tenant=tenant, namespace=namespace)
        self.discovery = NamespaceDiscovery(
            lambda: admin.TopicLister(service_url, seconds=operation_timeout, auth=auth),
            self.consumer_options.pattern_discovery,
        )
        self._tables: dict[str, ClusterTable] = {}
        self._presence: Presence | None = None  # made by `serve` (it needs the context)
        self._roles: ClusterRoles | None = None  # made by `serve` (it needs the context)
        self._consumers: set[ClusterConsumer] = set()
        # Told of each message a fan-out consumer drops (`DropNotifier`), once set.
        self.dropped_callback: Callable[[str, str, int], None] | None = None
        self._fanout: FanOut | None = None  # made on first use
        self._context: ClusterContext | None = None  # made by `serve`
        self.registry: SubscriptionRegistry
        self._stop = trio.Event()
        self._client_done = trio.Event()
        self._running = False
        self._closed = False

    # -- what the parts are given ----------------------------------------------------------

    @property
    def context(self) -> ClusterContext:
        """What the parts share (see `ClusterContext`), once `serve` runs."""
        if self._context is None:
            raise BackendError("backend is not running: start serve() first", reason="closed")
        return self._context

    def _current_client(self) -> PulsarClient:
        if self._client is None:
            raise BackendError("backend is not running: start serve() first", reason="closed")
        return self._client

    @property
    def producers(self) -> ProducerCache:
        if self._producers is None:
            raise BackendError("backend is not running: start serve() first", reason="closed")
        return self._producers

    def _consumer(self, spec: SubscriptionSpec, since: dict[str, int]) -> ClusterConsumer:
        return ClusterConsumer(
            self.context,
            spec,
            since,
            registry=self.registry,
            gone=self._consumer_gone,
            leave_topics=self.leave_topics,
        )

    def _consumer_gone(self, consumer: ClusterConsumer) -> None:
        self._consumers.discard(consumer)

    def _report_dropped(self, subscription: str, reason: str, count: int) -> None:
        report = self.dropped_callback
        if report is not None:
            report(subscription, reason, count)

    async def catch_up_tables(self) -> None:
        """Read every loaded table up to its topic's end (after a takeover, say)."""
        async with trio.open_nursery() as nursery:
            for table in self._tables.values():
                if table.loaded.is_set():
                    nursery.start_soon(table.catch_up)

    def tables_written(self) -> Frontier | None:
        """Where this proxy's last confirmed write to each table is; None when a write may
        have landed somewhere unknown (the reader of a frontier then reads to the end)."""
        # The presence table is no part of a frontier (a release is read in its own order).
        tables = {name: t for name, t in self._tables.items() if name != PRESENCE_TABLE}
        if any(table.written_unknown for table in tables.values()):
            return None
        return {
            name: table.written_through
            for name, table in tables.items()
            if table.written_through is not None
        }

    async def read_tables_through(self, frontier: Frontier) -> None:
        """Read each table up to its position in `frontier` (one another proxy wrote)."""
        for name, position in frontier.items():
            table = self._tables.get(name)
            if table is not None and table.loaded.is_set():
                await table.read_through(position)

    # -- lifecycle -------------------------------------------------------------------------

    def make_client(self) -> PulsarClient:
        """A new Pulsar client with this backend's settings, not yet running: the backend's own,
        or one for connections of its own (`ClusterContext.new_client`, for `roles`)."""
        try:
            return PulsarClient(
                self.service_url,
                ClientOptions(
                    f"mop-proxy/{VERSION}",
                    operation_timeout=self.operation_timeout,
                    connect_timeout=self.connect_timeout,
                    auth=self.auth,
                    stats=self.links,
                ),
            )
        except ValueError as exc:
            raise BackendError(f"{self.service_url}: {exc}", reason="invalid_url") from None

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Create the client, load the tables, report readiness, and run background work
        (idle producers, delayed nacks, table readers) until `aclose()` or cancellation. The
        client stays usable until `aclose()` (connections still closing may need it)."""
        if self._running or self._closed:
            raise RuntimeError("ClusterBackend.serve() may run only once")
        self._running = True
        client = self._client = self.make_client()
        producers = self._producers = ProducerCache(client, self.producer_options)
        started = False

        def report_started() -> None:
            nonlocal started
            started = True
            task_status.started()

        try:
            await self._run(client, producers, report_started)
        except BaseException:
            if not started:
                # Nobody owns a backend that never started: its client, a system task, must
                # not outlive the failed start.
                with trio.CancelScope(shield=True):
                    await self._shutdown_client()
            raise

    async def _run(
        self, client: PulsarClient, producers: ProducerCache, report_started: Callable[[], None]
    ) -> None:
        """What `serve` does with the client it made: start it, load the tables, report
        readiness, run until stopped."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                # The client outlives a cancellation of `serve` (the node stopping) until
                # `aclose`: connections that are closing save their sessions through it.
                running = trio.Event()
                trio.lowlevel.spawn_system_task(self._run_client, client, running)
                await running.wait()
                if client.closed:
                    raise BackendError("the Pulsar client did not start", reason="unavailable")
                await self._reach_brokers(client)
                context = self._context = ClusterContext(
                    tenant=self.tenant,
                    namespace=self.namespace,
                    operation_timeout=self.operation_timeout,
                    fence_timeout=self.fence_timeout,
                    consumer_options=self.consumer_options,
                    client=self._current_client,
                    new_client=self.make_client,
                    nursery=nursery,
                    delays=self.delays,
                    producers=producers,
                    local=self.local,
                    discovery=self.discovery,
                )
                self._roles = ClusterRoles(context, catch_up=self.catch_up_tables)
                # Made before its table loads: it follows the table's whole history.
                presence = self._presence = Presence(
                    context,
                    self._table(PRESENCE_TABLE),
                    catch_up=self.catch_up_tables,
                    written=self.tables_written,
                    read_through=self.read_tables_through,
                )
                nursery.start_soon(producers.serve_idle_closer)
                nursery.start_soon(self.delays.serve)
                nursery.start_soon(self.health.serve, client.reach)
                await nursery.start(self.discovery.serve)
                with trio.fail_after(self.operation_timeout + self.connect_timeout):
                    # The backend's own, those asked for, and any `table()` made before now.
                    for name in dict.fromkeys([*self._preload, *self._tables]):
                        await nursery.start(self._table(name).serve, context)
                self.registry = SubscriptionRegistry(self._tables[REGISTRY_TABLE])
                await nursery.start(presence.serve)
                report_started()
                await self._stop.wait()
                nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # A start that fails has one cause (a table that cannot be read): raise it alone.
            causes = leaves(group)
            if len(causes) == 1 and isinstance(causes[0], BackendError | trio.TooSlowError):
                raise self._start_error(causes[0]) from None
            raise
        except trio.TooSlowError as exc:
            raise self._start_error(exc) from None

    async def _reach_brokers(self, client: PulsarClient) -> None:
        """Wait until some broker of the service URL answers, trying again for at most the
        connect timeout and saying on the log why each try failed (every few seconds); then
        BackendError saying what happened, to which address. (Reading the tables next would
        otherwise wait for the operation timeout, in silence.)"""
        deadline = trio.current_time() + self.connect_timeout
        pause, logged_at = 0.25, -math.inf
        failure = f"{self.service_url}: timed out after {self.connect_timeout:g} s"
        with trio.move_on_at(deadline):
            while True:
                try:
                    await client.reach()
                    return
                except NoBrokerAnswers as exc:
                    failure = "; ".join(exc.attempts)
                except DriverError as exc:
                    failure = str(exc)
                now = trio.current_time()
                if now - logged_at >= CONNECT_PROGRESS_EVERY:
                    logged_at = now
                    log.warning(
                        "cannot reach the brokers yet (%s); trying again for %.0f s more"
                        " (cluster.connect_timeout)",
                        failure,
                        max(0.0, deadline - now),
                    )
                await trio.sleep(pause)
                pause = min(1.0, pause * 2)
        raise BackendError(
            f"no broker answered within cluster.connect_timeout ({self.connect_timeout:g} s):"
            f" {failure}",
            reason="unavailable",
        )

    async def _run_client(self, client: PulsarClient, running: trio.Event) -> None:
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(client.serve)
                running.set()
        except Exception:  # a system task's error would end the whole trio run
            log.exception("the Pulsar client failed")
        finally:
            running.set()
            self._client_done.set()

    def _start_error(self, exc: BaseException) -> BackendError:
        if isinstance(exc, BackendError):
            return exc
        return BackendError(
            f"{self.service_url}: the brokers did not answer in time", reason="unavailable"
        )

    def _check_running(self) -> None:
        if self._closed:
            raise BackendError("backend is closed", reason="closed")
        if self._client is None:
            raise BackendError("backend is not running: start serve() first", reason="closed")

    def on_dropped(self, callback: Callable[[str, str, int], None]) -> None:
        """See `DropNotifier`: what fan-out consumers (clean sessions) drop for a full queue;
        the brokers keep the backlog of durable subscriptions, which drop nothing here."""
        self.dropped_callback = callback

    async def aclose(self) -> None:
        """Close consumers (a waiting `receive` raises ConsumerClosed), fence leases, stop
        `serve` and close the client."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            # Consumers detach from their subscriptions while the client still runs.
            with trio.move_on_after(self.operation_timeout):
                for consumer in list(self._consumers):
                    await consumer.close_for_shutdown()
            for consumer in list(self._consumers):
                consumer.abort()
            if self._presence is not None:
                await self._presence.aclose()
            if self._roles is not None:
                await self._roles.aclose()
            if self._fanout is not None:
                await self._fanout.aclose(self.operation_timeout)
            # The client first (producers flush over its connections), then `serve`.
            await self._shutdown_client()
            self._stop.set()
            if self._admin is not None:
                await self._admin.aclose()

    async def _shutdown_client(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        if self._producers is not None:
            await self._producers.aclose()
        for table in self._tables.values():
            await table.aclose()
        await client.aclose()
        with trio.move_on_after(self.operation_timeout):
            await self._client_done.wait()

    # -- Backend ---------------------------------------------------------------------------

    async def open_client(self, client_id: str) -> ClusterLease:
        self._check_running()
        assert self._presence is not None  # made with the context
        return await self._presence.claim(client_id)

    async def publish(self, topic: str, message: Message) -> PublishResult:
        self._check_running()
        if self.local.owns(topic):
            await trio.lowlevel.checkpoint()
            return self.local.publish(topic, message)
        try:
            return await self.producers.send(topic, message)
        except ValueError as exc:
            raise BackendError(str(exc), reason="not_supported") from None

    async def publish_batch(
        self, items: Sequence[tuple[str, Message]]
    ) -> list[PublishResult | BackendError]:
        """Publish in order, all handed to the producers before any receipt is awaited (so a
        batch shares broker writes); one result per item (see `BatchPublisher`)."""
        pending: list[Receipt | PublishResult | BackendError] = []
        for topic, message in items:
            try:
                self._check_running()
                if self.local.owns(topic):
                    pending.append(self.local.publish(topic, message))
                    continue
                try:
                    receipt = self.producers.submit_nowait(topic, message)
                except trio.WouldBlock:  # no producer yet, or no room: wait for it
                    receipt = await self.producers.submit(topic, message)
            except BackendError as exc:
                pending.append(exc)
            except ValueError as exc:
                pending.append(BackendError(str(exc), reason="not_supported"))
            else:
                if message.qos and receipt is not None:
                    pending.append(receipt)
                else:
                    pending.append(PublishResult(NO_ID, None))
        results: list[PublishResult | BackendError] = []
        for item in pending:
            if isinstance(item, Receipt):
                # Receipts come for whole batches: once one has come, those sent with it have
                # too, and are read without a trip through the scheduler each.
                if not item.done:
                    await item.settled()
                try:
                    results.append(item.result())
                except BackendError as exc:
                    results.append(exc)
            else:
                results.append(item)
        await trio.lowlevel.checkpoint()
        return results

    async def subscribe(self, spec: SubscriptionSpec) -> ClusterConsumer | FanOutConsumer:
        self._check_running()
        if self.consumer_options.fanout and fans_out(spec):
            # Non-durable exclusive: one reader per topic for the whole proxy.
            if self._fanout is None:
                self._fanout = FanOut(self.context, report_dropped=self._report_dropped)
            return await self._fanout.subscribe(spec)
        if spec.whole_batches:
            raise BackendError(
                "whole batches are not available in separated mode", reason="not_supported"
            )
        if spec.start_at is not None:
            raise BackendError(
                "start_at is not available in separated mode", reason="not_supported"
            )
        kept = spec.durable or spec.kind is SubscriptionKind.SHARED
        since = self.registry.since(spec) if kept else {}
        start = 0 if spec.start is StartPosition.EARLIEST else now_ms()
        since = {selector: since.get(selector, start) for selector in spec.selectors}
        await self.registry.record(spec, since)
        consumer = self._consumer(spec, since)
        await consumer.open()
        if self._closed:
            consumer.abort()
            raise BackendError("backend is closed", reason="closed")
        self._consumers.add(consumer)
        return consumer

    async def open_producer(self, spec: ProducerSpec) -> Producer:
        await trio.lowlevel.checkpoint()
        raise BackendError(
            "registered producers (the Pulsar adapter) are not available in separated mode",
            reason="not_supported",
        )

    async def topics(self, namespace: str) -> list[str]:
        self._check_running()
        return await admin.get_topics(
            self.service_url, namespace, seconds=self.operation_timeout, auth=self.auth
        )

    def _topic_admin(self) -> BrokerAdmin:
        self._check_running()
        if self._admin is None:
            raise BackendError(
                "topic stats and deletion need the brokers' HTTP admin: set cluster.admin_url"
                ' (e.g. "http://broker-1:8080", Apache Pulsar\'s webServiceUrl)',
                reason="not_configured",
            )
        return self._admin

    def namespace_admin(self) -> NamespaceAdmin | None:
        """The brokers' namespace policies (retention, backlog quotas), for the admin API;
        None without `cluster.admin_url`."""
        return None if self._admin is None else NamespaceAdmin(self._admin)

    async def topic_stats(self, topic: str) -> TopicStats | None:
        """Asked of the brokers' HTTP admin (see `topic_admin`)."""
        return await self._topic_admin().stats(topic)

    async def delete_topic(self, topic: str, *, force: bool = False) -> bool:
        """Asked of the brokers' HTTP admin (see `topic_admin`), once this proxy's own producer
        of the topic (kept for its MQTT publishers) is closed."""
        admin = self._topic_admin()
        await self.producers.release(topic)
        return await admin.delete(topic, force=force)

    # -- schemas: kept by the brokers, as Apache Pulsar keeps them ------------------------

    async def schema(self, topic: str, version: int | None = None) -> StoredSchema | None:
        """GET_SCHEMA, asked of the broker that owns `topic`."""
        return await self._schemas().get(topic, version)

    async def get_or_create_schema(self, topic: str, schema: SchemaInfo) -> int:
        """GET_OR_CREATE_SCHEMA, asked of the broker that owns `topic`: it checks the rule."""
        return await self._schemas().get_or_create(topic, schema)

    async def delete_schema(self, topic: str) -> int | None:
        """Asked of the brokers' HTTP admin (see `topic_admin`)."""
        return await self._topic_admin().delete_schema(topic)

    async def schema_compatibility(self, namespace: str) -> Compatibility:
        """Asked of the brokers' HTTP admin (see `topic_admin`)."""
        return await self._topic_admin().schema_compatibility(namespace)

    async def set_schema_compatibility(self, namespace: str, rule: Compatibility | None) -> None:
        await self._topic_admin().set_schema_compatibility(namespace, rule)

    def _schemas(self) -> BrokerSchemas:
        self._check_running()
        return BrokerSchemas(self._current_client(), self.operation_timeout)

    def not_ready(self) -> list[str]:
        if self._closed:
            return ["the connection to the brokers is closed"]
        if self._client is None or self._client.closed:
            return ["the Pulsar client is not running"]
        return list(self.health.problems)

    async def delete_subscription(self, name: str, member: str = "") -> None:
        """Delete a subscription no consumer is attached to (an expired session): forget the
        member; when it was the last one, attach to every topic its selectors match and
        unsubscribe there."""
        self._check_running()
        await self.registry.table.catch_up()
        members = self.registry.members(name)
        unshared = members.get("", {})
        if unshared.get("kind", SubscriptionKind.SHARED.value) != SubscriptionKind.SHARED.value:
            # A subscription that is not shared is recorded under "" (it has one consumer at a
            # time), with the member it was made with: only that member deletes it, as in the
            # merged broker. (A record from before members were kept names no member.)
            recorded = unshared.get("member")
            if recorded is not None and recorded != member:
                log.debug("subscription %r is not member %r's: nothing to delete", name, member)
                await trio.lowlevel.checkpoint()
                return
            member = ""
        record = members.get(member)
        if await self.registry.leave_member(name, member):
            return
        if record is None:
            log.debug("no record of subscription %r (member %r): nothing to delete", name, member)
            return
        selectors = frozenset(record.get("since", {}))
        if not selectors:
            return
        try:
            kind = SubscriptionKind(record.get("kind", "exclusive"))
        except ValueError:
            kind = SubscriptionKind.EXCLUSIVE
        spec = SubscriptionSpec(name=name, selectors=selectors, kind=kind, member=member)
        consumer = self._consumer(spec, {})
        await consumer.open()
        await consumer.delete()

    async def leave_topics(
        self, spec: SubscriptionSpec, dropped: str, remaining: frozenset[str]
    ) -> None:
        """Unsubscribe `spec`'s subscription from the topics `dropped` matched and no selector
        in `remaining` does (a removed selector's backlog is not kept)."""
        topics = await self._topics_of(dropped)
        gone = [
            topic
            for topic in topics
            if matching_selectors(topic, [dropped], tenant=self.tenant, namespace=self.namespace)
            and not matching_selectors(
                topic, remaining, tenant=self.tenant, namespace=self.namespace
            )
        ]
        for topic in gone:
            single = SubscriptionSpec(name=spec.name, selectors=frozenset([topic]), kind=spec.kind)
            consumer = self._consumer(single, {})
            try:
                await consumer.open()
                await consumer.delete()
            except BackendError as exc:
                log.warning("leaving %s for %r: %s", topic, spec.name, exc)

    async def _topics_of(self, selector: str) -> list[str]:
        namespace = f"{self.tenant}/{self.namespace}"
        if selector.startswith(("persistent://", "non-persistent://")):
            namespace = "/".join(selector.split("://", 1)[1].split("/")[:2])
        try:
            return await self.topics(namespace)
        except BackendError as exc:
            log.warning("topics of %s: %s", namespace, exc)
            return []

    def _table(self, name: str) -> ClusterTable:
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = ClusterTable(
                name, tenant=self.tenant, namespace=self.namespace
            )
        return table

    def table(self, name: str) -> ClusterTable:
        """The table `name`; one that `serve` did not load is loaded now, and reads of it
        raise BackendError until it is (`put` waits for it)."""
        known = name in self._tables
        table = self._table(name)
        if not known and self._nursery is not None and not self._closed:
            self._nursery.start_soon(self._load, table)
        return table

    async def _load(self, table: ClusterTable) -> None:
        try:
            await table.serve(self.context)
        except BackendError as exc:
            log.error("table %r: %s", table.name, exc)

    async def _partition_count(self, topic: str) -> int:
        """The brokers' partitioned metadata of `topic` (see `ClusterPartitionedTopics`)."""
        self._check_running()
        try:
            return await self._current_client().partitions(topic)
        except DriverError as exc:
            raise error_for(exc, f"partitioned metadata of {topic}") from None

    async def lookup(self, topic: str) -> str:
        self._check_running()
        return await admin.lookup(
            self.service_url, topic, seconds=self.operation_timeout, auth=self.auth
        )

    async def hold_role(self, name: str) -> ClusterRole:
        """Enter this proxy for role `name`; it is granted in the background (see
        `mop.backends.cluster.roles`)."""
        self._check_running()
        roles = self._roles
        assert roles is not None, "serve() is running"
        return await roles.hold(name)


@asynccontextmanager
async def open_cluster_backend(service_url: str, **options: Any) -> AsyncIterator[ClusterBackend]:
    """Run a `ClusterBackend` for the duration of the block, then close it (`options` are the
    keyword arguments of ClusterBackend)."""
    backend = ClusterBackend(service_url, **options)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(backend.serve)
            try:
                yield backend
            finally:
                await backend.aclose()  # inside the nursery: it is what ends `serve`
    finally:
        # Also when `serve` fails to start: what it opened is closed.
        with trio.CancelScope(shield=True):
            await backend.aclose()


if TYPE_CHECKING:

    def _conforms(
        backend: ClusterBackend,
        consumer: ClusterConsumer,
        table: ClusterTable,
        lease: ClusterLease,
    ) -> tuple[Backend, BatchPublisher, Consumer, Table, ClientLease]:
        return backend, backend, consumer, table, lease
