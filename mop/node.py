"""A mop node: the one place that decides between merged and separated mode and wires it all.

`open_node(settings)` builds the backend for the configured mode, the MessagingProcessor on
top of it and the protocol handlers on top of that, serves their listeners and, on exit, closes
everything in reverse order. `serve_node` is the same as a `serve_*` task for `nursery.start`.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import itertools
import logging
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import NoReturn, Protocol

import trio

from mop.admin import AdminContext, bind_admin, serve_admin
from mop.backends.local import LocalBackend
from mop.backlog_quota import (
    BacklogQuota,
    BacklogQuotaControl,
    BacklogQuotas,
    QuotaKind,
    QuotaPolicy,
)
from mop.broker.storage import DurableStorage, StorageError, open_durable_storage
from mop.counters import Drop, ProtocolStats, Refusal
from mop.exception_groups import leaves
from mop.membership import Membership, MembershipError
from mop.observability import Telemetry, open_telemetry
from mop.observability.backend_metrics import (
    BrokerReadings,
    register_broker_metrics,
    register_link_metrics,
)
from mop.observability.overload_metrics import register_overload_metrics
from mop.observability.processor_metrics import register_processor_metrics
from mop.observability.telemetry import TelemetryError
from mop.overload.guard import OverloadGuard
from mop.overload.memory import open_guard, serve_memory_watch
from mop.partitioned import OtherMembers
from mop.partitioned_declare import declare_count, declare_until_done
from mop.processor import Backend, BackendError, MessagingProcessor
from mop.protocols.base import (
    NodeServices,
    ProtocolHandler,
    UnknownProtocol,
    load_protocol,
    protocol_data,
)
from mop.protocols.pulsar.client import NO_AUTH, ClientAuth, cluster_client_auth
from mop.retention import RetentionControl, RetentionPolicies, RetentionPolicy
from mop.schemas import Compatibility
from mop.security.abuse import BANS_TABLE, Ban
from mop.security.ban_store import BanStore
from mop.security.gatekeeper import Gatekeeper
from mop.security.policy import PolicyError, load_policy
from mop.security.reloading import PolicyReloader
from mop.settings import BacklogQuotaSettings, LimitsSettings, RetentionSettings, Settings
from mop.topic_names import PulsarTopicName, mqtt_to_pulsar
from mop.topics import TopicError
from mop.transport import (
    BoundListener,
    Handler,
    ListenerSpec,
    OpenListeners,
    open_listeners,
    serve_open_listeners,
)

log = logging.getLogger("mop.node")


class StartupError(Exception):
    """The node cannot start; the message says why in one line."""


@dataclass(frozen=True, slots=True)
class Node:
    settings: Settings
    processor: MessagingProcessor
    protocols: dict[str, ProtocolHandler]
    # The protocols' listeners and, last, the admin HTTP listener ("admin" over "tcp").
    listeners: tuple[BoundListener, ...]
    telemetry: Telemetry

    def address(self, protocol: str = "mqtt", kind: str = "tcp") -> tuple[str, int]:
        """Where the node listens for `protocol` over `kind` (handy with port 0);
        `address("admin")` is the admin API's."""
        for bound in self.listeners:
            if bound.spec.name == protocol and bound.spec.kind == kind:
                return bound.host, bound.port
        raise LookupError(f"no {protocol} listener over {kind}")

    def protocol_data(self) -> dict[str, dict[str, str]]:
        """What each protocol advertises to its clients (PIP-41), with the ports bound."""
        return protocol_data(self.protocols, self.listeners)


async def start_backend(
    settings: Settings,
    nursery: trio.Nursery,
    membership: Membership | None = None,
    *,
    tables: tuple[str, ...] = (),
    auth: ClientAuth | None = None,
) -> Backend:
    """The constructor switch: merged mode gets the colocated broker over durable storage in
    `data_dir`, separated mode remote brokers through lookup (with `tables`, those the
    protocol handlers read as they start, loaded before it returns, and `auth`, the node's
    credentials, from `broker_auth` when not given). Background work runs in `nursery`; the
    caller closes the backend with `aclose()`. `membership` is the node's (made from
    `settings` when not given)."""
    if settings.mode == "separated":
        auth = auth if auth is not None else broker_auth(settings)
        return await _start_cluster_backend(settings, nursery, tables, auth)
    if membership is None:
        membership = cluster_membership(settings)
    _check_cluster(settings, membership)
    others = _other_members(settings, membership, auth)
    directory = Path(settings.data_dir) / "broker"
    try:
        storage = await open_durable_storage(directory, settings.storage)
    except (StorageError, OSError) as exc:
        raise StartupError(f"storage in {directory}: {exc}") from None
    backend = LocalBackend(
        storage,
        tenant=settings.default_tenant,
        namespace=settings.default_namespace,
        membership=membership,
        unsubscribed_grace=settings.storage.unsubscribed_grace,
        retention=retention_policies(settings.retention),
        retention_check=settings.retention.check_interval,
        backlog_quotas=backlog_quotas(settings.backlog_quota),
        schema_compatibility=Compatibility(settings.pulsar.schema_compatibility),
        schema_max_bytes=settings.pulsar.schema_max_bytes,
        other_members=others,
        subscriber_max_bytes=settings.limits.subscriber_backlog_bytes,
        subscriber_stall_timeout=settings.limits.subscriber_stall_timeout,
    )
    try:
        await nursery.start(storage.serve)
        await nursery.start(backend.serve)
    except BaseException:
        with trio.CancelScope(shield=True):
            await backend.aclose()
        raise
    return backend


def _other_members(
    settings: Settings, membership: Membership, auth: ClientAuth | None
) -> OtherMembers | None:
    """A member of a mop broker cluster with `cluster.admin_url` (every member's admin URL)
    reaches the others' admin through it: the member that keeps a partitioned topic deletes
    the partitions the others hold."""
    url = settings.cluster.admin_url
    if not membership.clustered or url is None:
        return None
    from mop.backends.cluster.partitioned import MemberAdmin
    from mop.backends.cluster.topic_admin import BrokerAdmin, admin_urls

    try:
        urls = admin_urls(url)
    except ValueError as exc:
        raise StartupError(f"cluster.admin_url: {exc}") from None
    auth = auth if auth is not None else broker_auth(settings)
    return MemberAdmin(BrokerAdmin(urls, auth=auth, timeout=settings.cluster.operation_timeout))


def retention_policies(settings: RetentionSettings) -> RetentionPolicies:
    """The retention policies `settings` give (the admin API may override them later)."""
    return RetentionPolicies(
        RetentionPolicy(settings.time_seconds, settings.size_bytes),
        {
            entry.namespace: RetentionPolicy(entry.time_seconds, entry.size_bytes)
            for entry in settings.namespaces
        },
    )


def backlog_quotas(settings: BacklogQuotaSettings) -> BacklogQuotas:
    """The backlog quotas `settings` give (the admin API may override them later)."""
    policy = QuotaPolicy(settings.policy)
    return BacklogQuotas(
        {
            QuotaKind.SIZE: BacklogQuota(settings.limit_bytes, policy),
            QuotaKind.AGE: BacklogQuota(settings.limit_seconds, policy),
        }
    )


def cluster_membership(settings: Settings) -> Membership:
    """The node's cluster: `cluster.brokers`, and this broker's URL (`cluster.advertised_url`,
    else its Pulsar listener)."""
    advertised = settings.cluster.advertised_url or (
        f"pulsar://{settings.pulsar.host}:{settings.pulsar.port}"
    )
    return Membership(settings.cluster.brokers, advertised)


def _check_cluster(settings: Settings, membership: Membership) -> None:
    """Refuse cluster settings that make no sense: in a cluster of several members this
    broker is one of them, and no MQTT adapter runs beside it (MQTT clients may use any
    topic, and a broker must store only the topics it owns)."""
    if not membership.clustered:
        return
    if "mqtt" in settings.protocols:
        raise StartupError(
            "mqtt on a broker of a multi-member cluster: put MQTT on separated proxies"
        )
    try:
        membership.check()
    except MembershipError as exc:
        raise StartupError(str(exc)) from None


def _advertise_bound_port(
    membership: Membership, settings: Settings, bound: list[BoundListener]
) -> None:
    """With pulsar.port = 0 and no advertised URL, the URL lookups answer has the port the
    Pulsar listener bound."""
    if settings.cluster.advertised_url or settings.pulsar.port or settings.mode == "separated":
        return
    for entry in bound:
        if entry.spec.name == "pulsar" and entry.spec.kind == "tcp":
            membership.advertise(f"pulsar://{settings.pulsar.host}:{entry.port}")


async def _start_cluster_backend(
    settings: Settings, nursery: trio.Nursery, tables: tuple[str, ...], auth: ClientAuth
) -> Backend:
    """Separated mode: a stateless proxy whose backend reaches the brokers through
    pulsar-client (which reconnects on its own: a broker restart needs no proxy restart)."""
    # Imported here: a merged node need not load pulsar-client's native library.
    from mop.backends.cluster import ClusterBackend, ConsumerOptions, ProducerOptions

    cluster = settings.cluster
    if not cluster.service_url:
        raise StartupError(
            'cluster.service_url is required with mode = "separated"'
            ' (the brokers, e.g. "pulsar://127.0.0.1:6650")'
        )
    if "pulsar" in settings.protocols:
        raise StartupError(
            "protocols: the Pulsar adapter runs on brokers, not on a separated proxy; set"
            ' protocols = ["mqtt"] (Pulsar clients connect to the brokers directly)'
        )
    if cluster.admin_url is not None:
        from mop.backends.cluster.topic_admin import admin_urls

        try:
            admin_urls(cluster.admin_url)
        except ValueError as exc:
            raise StartupError(f"cluster.admin_url: {exc}") from None
    backend = ClusterBackend(
        cluster.service_url,
        auth=auth,
        admin_url=cluster.admin_url,
        tenant=settings.default_tenant,
        namespace=settings.default_namespace,
        tables=tables,
        operation_timeout=cluster.operation_timeout,
        connect_timeout=cluster.connect_timeout,
        fence_timeout=cluster.fence_timeout,
        producers=ProducerOptions(
            send_timeout=cluster.send_timeout, batching_delay=cluster.batching_delay
        ),
        consumers=ConsumerOptions(
            receiver_queue=cluster.receiver_queue, pattern_discovery=cluster.pattern_discovery
        ),
    )
    try:
        await nursery.start(backend.serve)
    except BackendError as exc:
        with trio.CancelScope(shield=True):
            await backend.aclose()
        raise StartupError(f"cluster.service_url {cluster.service_url}: {exc}") from None
    except BaseException:
        with trio.CancelScope(shield=True):
            await backend.aclose()
        raise
    log.info("separated mode: brokers at %s", cluster.service_url)
    return backend


def _open_gatekeeper(settings: Settings) -> Gatekeeper:
    """The security policy the settings' files describe; a file that cannot be used stops the
    node with a one-line error, and anonymous access on a public address is warned of."""
    try:
        policy = load_policy(settings.auth)
    except PolicyError as exc:
        raise StartupError(str(exc)) from None
    if policy.authenticator.allow_anonymous:
        public = [
            f"{name}.host {host}"
            for name, host in (("mqtt", settings.mqtt.host), ("pulsar", settings.pulsar.host))
            if name in settings.protocols and not _is_loopback(host)
        ]
        if public:
            log.warning(
                "anonymous clients are allowed on a non-loopback address (%s): set "
                "auth.allow_anonymous = false and configure authentication before exposing mop",
                ", ".join(public),
            )
    return Gatekeeper(policy, settings.auth)


async def _serve_bans(
    gatekeeper: Gatekeeper,
    store: BanStore,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Enforce the deployment's bans (`mop ban`, other nodes' flapping bans), store this
    node's own, and remove the expired ones."""
    async with trio.open_nursery() as nursery:

        async def keep(ban: Ban) -> None:
            try:
                await store.add(ban)
            except BackendError as exc:
                log.warning(
                    "ban of %s %s not stored (in force here only): %s", ban.kind, ban.value, exc
                )

        gatekeeper.share_bans(store.bans, lambda ban: nursery.start_soon(keep, ban))

        # A ban stored by `mop ban` or another node closes the clients it covers (the store's
        # own watcher, which puts it in force, runs first).
        def stored_elsewhere(_key: str, value: bytes | None) -> None:
            if value is not None:
                gatekeeper.bans_added()

        store.table.watch(stored_elsewhere)
        await nursery.start(store.serve_expiry)
        task_status.started()


def broker_auth(settings: Settings) -> ClientAuth:
    """This node's own credentials towards brokers (`cluster.auth`), read once: a separated
    proxy's, or a broker's towards its peers (none for a node alone). StartupError when they
    cannot be used."""
    if settings.mode != "separated" and not settings.cluster.brokers:
        return NO_AUTH
    try:
        return cluster_client_auth(settings.cluster)
    except ValueError as exc:
        raise StartupError(str(exc)) from None


def _retention_control(backend: Backend) -> LocalBackend | RetentionAndQuotas | None:
    """What the admin API may change of the retention policies and backlog quotas
    (`RetentionControl`, `BacklogQuotaControl`): a node with its own broker (merged, or a
    broker node) has them; a separated proxy asks its brokers' HTTP admin
    (`cluster.admin_url`), and without it has none."""
    if isinstance(backend, LocalBackend):
        return backend
    from mop.backends.cluster import ClusterBackend

    if isinstance(backend, ClusterBackend):
        return backend.namespace_admin()
    return None


class RetentionAndQuotas(RetentionControl, BacklogQuotaControl, Protocol):
    """Both controls in one object (`_retention_control`)."""


def _broker_membership(settings: Settings, membership: Membership) -> Membership | None:
    """The membership of a broker node (merged, serving the Pulsar protocol), whose admin
    listener answers Pulsar's admin REST API for its topics; None for other nodes."""
    if settings.mode == "merged" and "pulsar" in settings.protocols:
        return membership
    return None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _with_default_protocols(settings: Settings) -> Settings:
    """A separated proxy left with the default protocols runs MQTT only (the Pulsar adapter
    belongs on brokers)."""
    if settings.mode == "separated" and settings.protocols == Settings().protocols:
        return dataclasses.replace(settings, protocols=("mqtt",))
    return settings


@asynccontextmanager
async def open_node(settings: Settings) -> AsyncIterator[Node]:
    settings = _with_default_protocols(settings)
    handlers = _load_handlers(settings)
    backend: Backend | None = None
    telemetry = _open_telemetry(settings)
    # Bound before anything starts: a port in use stops the node before it writes anything
    # (storage files, tables). They listen once the node serves: until then connections are
    # refused (see `OpenListeners`).
    opened: list[_OpenedListeners] = []
    admin_socket: socket.socket | None = None
    try:
        async with trio.open_nursery() as nursery:
            gatekeeper = _open_gatekeeper(settings)
            auth = broker_auth(settings)
            membership = cluster_membership(settings)
            for handler in handlers.values():
                handler.initialize(settings)
                log.debug("%s advertises %s", handler.name, handler.advertised_data())
            await _open_listeners(opened, handlers, settings.limits)
            if settings.admin.enabled:
                admin_socket = _bind_admin(settings)
            _advertise_bound_port(
                membership, settings, [b for entry in opened for b in entry.listeners.bound]
            )
            tables = (*(name for h in handlers.values() for name in h.tables), BANS_TABLE)
            overload = _open_overload(settings.limits)
            backend = await start_backend(settings, nursery, membership, tables=tables, auth=auth)
            processor = MessagingProcessor(
                backend,
                max_connections=settings.limits.max_connections,
                gatekeeper=gatekeeper,
                overload=overload,
                tracing=telemetry.tracing,
            )
            _register_metrics(telemetry, processor, backend, settings)
            register_overload_metrics(telemetry, overload)
            if overload.watches_memory:
                await nursery.start(
                    serve_memory_watch, overload, settings.limits.memory_check_interval
                )
            await _declare_partitioned(settings, processor, membership, nursery)
            await nursery.start(PolicyReloader(gatekeeper, settings.auth).serve)
            bans = BanStore(processor.table(BANS_TABLE))
            await nursery.start(_serve_bans, gatekeeper, bans)
            services = NodeServices(
                processor=processor, nursery=nursery, membership=membership, broker_auth=auth
            )
            for handler in handlers.values():
                await handler.start(services)
            bound: list[BoundListener] = []
            for entry in opened:
                counted = processor.stats.protocol(entry.handler.name)
                bound.extend(await _serve(nursery, entry, overload, counted))
            if admin_socket is not None:
                context = AdminContext(
                    settings=settings,
                    processor=processor,
                    telemetry=telemetry,
                    protocols=handlers,
                    listeners=lambda: tuple(bound),
                    not_ready=lambda: [*processor.not_ready(), *overload.not_ready()],
                    broker=_broker_membership(settings, membership),
                    bans=bans,
                    retention=_retention_control(backend),
                    backlog_quotas=_retention_control(backend),
                )
                bound.append(await _serve_admin(nursery, context, admin_socket))
            for listening in bound:
                log.info(
                    "%s listening on %s %s:%d",
                    listening.spec.name,
                    listening.spec.kind,
                    listening.host,
                    listening.port,
                )
            try:
                yield Node(settings, processor, handlers, tuple(bound), telemetry)
            finally:
                for handler in handlers.values():
                    await handler.close()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        _raise_startup_error(group)
        raise
    finally:
        with trio.CancelScope(shield=True):
            # Those never served (the start failed); served ones are closed already.
            for entry in opened:
                await entry.listeners.aclose()
            if admin_socket is not None:
                admin_socket.close()
            if backend is not None:
                await backend.aclose()
        telemetry.shutdown()


def _declared_partitioned(settings: Settings, membership: Membership) -> dict[str, int]:
    """The partitioned topics of `pulsar.partitioned_topics` this node declares (full name ->
    count): a member of a broker cluster declares the names it owns; a separated proxy asks
    its brokers for all of them."""
    declared: dict[str, int] = {}
    for name, count in settings.pulsar.partitioned_topics.items():
        topic = mqtt_to_pulsar(
            name, tenant=settings.default_tenant, namespace=settings.default_namespace
        )
        try:
            parsed = PulsarTopicName.parse(topic)
        except TopicError as exc:
            raise StartupError(f"pulsar.partitioned_topics: {exc}") from None
        if parsed.tenant != settings.default_tenant:
            raise StartupError(
                f"pulsar.partitioned_topics: {topic} is not of tenant {settings.default_tenant!r}"
            )
        topic = str(parsed)
        if membership.owns(topic):
            declared[topic] = count
    return declared


async def _declare_partitioned(
    settings: Settings,
    processor: MessagingProcessor,
    membership: Membership,
    nursery: trio.Nursery,
) -> None:
    """Create the partitioned topics of `pulsar.partitioned_topics`, or grow those with fewer
    partitions (never shrink them). A node with its own broker declares them before it
    serves (a refusal stops it: its settings are wrong). A separated proxy declares them in
    the background, asking again while its brokers cannot answer, so that it never fails to
    start because they are not up yet (or because another proxy declared them first)."""
    declared = _declared_partitioned(settings, membership)
    if not declared:
        return
    if settings.mode == "separated":
        nursery.start_soon(declare_until_done, processor.partitioned, declared)
        return
    for topic, count in declared.items():
        try:
            await declare_count(processor.partitioned, topic, count)
        except BackendError as exc:
            raise StartupError(f"pulsar.partitioned_topics: {topic}: {exc}") from None


def _register_metrics(
    telemetry: Telemetry, processor: MessagingProcessor, backend: Backend, settings: Settings
) -> None:
    """Serve the node's metrics: the processor's and the adapters' counters, and those of the
    backend (the colocated broker and its storage, or the links to the brokers)."""
    sampling = settings.telemetry.latency_sampling
    processor.stats.sample_every(sampling)
    for name in settings.protocols:  # their series from the start, at 0
        processor.stats.protocol(name)
    if isinstance(backend, LocalBackend):
        storage = backend.storage
        # One walk over the broker per collection, for every instrument that reads it.
        stats = telemetry.per_collection(backend.stats)
        register_broker_metrics(
            telemetry,
            BrokerReadings(
                stats=stats,
                largest_backlogs=backend.largest_backlogs,
                sync_latency=storage.sync_latency if isinstance(storage, DurableStorage) else None,
            ),
            top=settings.telemetry.backlog_top,
        )
        register_processor_metrics(
            telemetry,
            processor,
            backend_drops=lambda: {
                Drop.NO_SUBSCRIBERS: stats().messages_unrouted,
                Drop.EXPIRED: stats().messages_expired,
            },
        )
        return
    register_processor_metrics(telemetry, processor)
    if settings.mode == "separated":
        from mop.backends.cluster import ClusterBackend

        if isinstance(backend, ClusterBackend):
            backend.links.sample_every(sampling)
            register_link_metrics(telemetry, backend.links)


# Nodes started in this process so far (tests and embedded brokers run several).
_NODES = itertools.count(1)


def node_instance_id() -> str:
    """The node's identity in its telemetry (`service.instance.id`, `target_info`): its host
    and process, `{host}:{pid}`, with `/{n}` for the n-th node of a process that runs several.
    Known before any listener binds (a port may be 0), and unlike an address a node connects
    to (the brokers' URL a proxy has), never shared by two nodes."""
    number = next(_NODES)
    name = f"{socket.gethostname()}:{os.getpid()}"
    return name if number == 1 else f"{name}/{number}"


def _open_telemetry(settings: Settings) -> Telemetry:
    try:
        return open_telemetry(settings.telemetry, mode=settings.mode, node_name=node_instance_id())
    except TelemetryError as exc:
        raise StartupError(str(exc)) from None


def _bind_admin(settings: Settings) -> socket.socket:
    admin = settings.admin
    try:
        return bind_admin(admin.host, admin.port)
    except OSError as exc:
        raise StartupError(f"admin {admin.host}:{admin.port}: {exc}") from None


async def _serve_admin(
    nursery: trio.Nursery, context: AdminContext, sock: socket.socket
) -> BoundListener:
    admin = context.settings.admin
    try:
        bound: BoundListener = await nursery.start(serve_admin, context, sock)
    except OSError as exc:
        raise StartupError(f"admin {admin.host}:{admin.port}: {exc}") from None
    except BaseExceptionGroup as group:
        # hypercorn listens inside its own nurseries.
        errors = leaves(group)
        if len(errors) == 1 and isinstance(errors[0], OSError):
            raise StartupError(f"admin {admin.host}:{admin.port}: {errors[0]}") from None
        raise
    return bound


async def serve_node(
    settings: Settings, *, task_status: trio.TaskStatus[Node] = trio.TASK_STATUS_IGNORED
) -> NoReturn:
    async with open_node(settings) as node:
        task_status.started(node)
        await trio.sleep_forever()
    raise AssertionError("unreachable")  # pragma: no cover


def _load_handlers(settings: Settings) -> dict[str, ProtocolHandler]:
    handlers = {}
    for name in settings.protocols:
        try:
            handlers[name] = load_protocol(name)
        except UnknownProtocol as exc:
            raise StartupError(f"protocols: {exc}") from None
    return handlers


def _open_overload(limits: LimitsSettings) -> OverloadGuard:
    try:
        return open_guard(limits)
    except ValueError as exc:
        raise StartupError(f"limits.memory_low_watermark: {exc}") from None


@dataclass(frozen=True, slots=True)
class _OpenedListeners:
    """Listeners of one protocol handler that share a connection handler, bound but not
    served yet."""

    handler: ProtocolHandler
    connection_handler: Handler
    listeners: OpenListeners


async def _open_listeners(
    opened: list[_OpenedListeners],
    handlers: dict[str, ProtocolHandler],
    limits: LimitsSettings,
) -> None:
    """Bind the listeners of every handler, each held to `limits.connection_rate`, adding them
    to `opened` (which the caller closes if the node does not start); StartupError when one
    cannot be bound."""
    for handler in handlers.values():
        by_handler: dict[Handler, list[ListenerSpec]] = {}
        try:
            for spec, connection_handler in handler.listeners():
                spec = dataclasses.replace(
                    spec,
                    connection_rate=limits.connection_rate,
                    connection_burst=limits.connection_burst,
                )
                by_handler.setdefault(connection_handler, []).append(spec)
            for connection_handler, specs in by_handler.items():
                listeners = await open_listeners(specs)
                opened.append(_OpenedListeners(handler, connection_handler, listeners))
        except OSError as exc:
            raise StartupError(f"{handler.name}: {exc}") from None


async def _serve(
    nursery: trio.Nursery,
    opened: _OpenedListeners,
    overload: OverloadGuard,
    stats: ProtocolStats,
) -> list[BoundListener]:
    """Accept connections on `opened` (one refused over its connection rate is counted in
    `stats` and by overload protection)."""

    def refused(spec: ListenerSpec) -> None:
        overload.refused_connection(f"{spec.name} ({spec.kind})")
        stats.refuse(Refusal.RATE_LIMITED)

    bound: list[BoundListener] = await nursery.start(
        partial(
            serve_open_listeners, opened.listeners, opened.connection_handler, on_refused=refused
        )
    )
    return bound


def _raise_startup_error(group: BaseExceptionGroup) -> None:
    """Surface a lone StartupError from inside the node's nursery as itself."""
    found = leaves(group)
    if len(found) == 1 and isinstance(found[0], StartupError):
        raise found[0] from None
