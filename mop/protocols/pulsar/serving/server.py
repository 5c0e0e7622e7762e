"""What the Pulsar adapter shares between connections: limits, timers, topic names, the URL it
advertises, the names it gives producers, and the cluster around it (who owns a topic, the
links to the other members). `handle_connection` serves one client.
"""

from __future__ import annotations

import functools
import itertools
import logging
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import trio

from mop.counters import ProtocolStats
from mop.membership import Membership, normalize_url
from mop.processor import BackendError, MessagingProcessor
from mop.protocols.pulsar.client import NO_AUTH, ClientAuth
from mop.protocols.pulsar.connection import ConnectionLimits
from mop.protocols.pulsar.errors import ServerError
from mop.protocols.pulsar.listeners import listeners_of
from mop.protocols.pulsar.serving.peers import PeerLinks
from mop.settings import Settings
from mop.topic_names import PulsarTopicName, is_system_topic, pulsar_to_mqtt
from mop.topics import TopicError
from mop.transport import ConnectionInfo
from mop.version import SERVER_NAME

if TYPE_CHECKING:  # the handler module imports this one
    from mop.protocols.pulsar.serving.handler import PulsarConnection

log = logging.getLogger("mop.pulsar")

_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})


# BackendError.reason -> the ServerError that answers it.
_SERVER_ERRORS = {
    "consumer_busy": ServerError.ConsumerBusy,
    "subscription_mismatch": ServerError.ConsumerBusy,
    "producer_busy": ServerError.ProducerBusy,
    "producer_fenced": ServerError.ProducerFenced,
    "quota_exceeded": ServerError.ProducerBlockedQuotaExceededError,
    # A backlog quota with the producer_exception policy, as Pulsar answers it.
    "backlog_quota_exceeded": ServerError.ProducerBlockedQuotaExceededException,
    "storage_error": ServerError.PersistenceError,
    "closed": ServerError.ServiceNotReady,
    # A message larger than the brokers behind take: failed for good. Java clients fail the
    # send on NotAllowedError; on most other errors they reconnect and send it again, forever.
    "too_large": ServerError.NotAllowedError,
    "incompatible_schema": ServerError.IncompatibleSchema,
}


def server_error(exc: BackendError, default: ServerError = ServerError.UnknownError) -> ServerError:
    """The ServerError that answers a failed backend call (`default` for a reason without
    one of its own)."""
    return _SERVER_ERRORS.get(exc.reason, default)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class TopicRefused(Exception):
    """A topic name the node does not serve; `error` is the ServerError to answer."""

    def __init__(self, error: ServerError, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


@dataclass(frozen=True, slots=True)
class Timers:
    """How long a client may take: to send CONNECT, and to show signs of life (the broker
    PINGs a connection silent for one interval and drops it after a second one)."""

    connect_timeout: float = 10.0
    keepalive_interval: float = 30.0


class PulsarServer:
    def __init__(
        self,
        settings: Settings,
        processor: MessagingProcessor,
        timers: Timers | None = None,
        *,
        membership: Membership | None = None,
        broker_auth: ClientAuth = NO_AUTH,
    ) -> None:
        self.processor = processor
        self.settings = settings
        self.timers = timers or Timers()
        self.limits = ConnectionLimits(server_version=SERVER_NAME)
        self.tenant = settings.default_tenant
        self.namespace = settings.default_namespace
        # Broker-assigned producer names are unique across restarts, since a producer's name
        # keys its sequence ids (deduplication).
        self._boot = uuid.uuid4().hex[:8]
        self._names = itertools.count()
        # This broker's URL as the cluster lists it, and the other members, if any (none
        # when not given: a broker alone).
        self.membership = membership or Membership((), "")
        # The peers are asked with this broker's own credentials (`cluster.auth`).
        self.peers = PeerLinks(self.membership.peers(), auth=broker_auth)
        # The advertised listeners, by name (see `mop.protocols.pulsar.listeners`).
        self.listeners = listeners_of(settings.pulsar.advertised_listeners)
        # The connections past their handshake (the admin API lists them).
        self.connections: set[PulsarConnection] = set()

    @functools.cached_property
    def stats(self) -> ProtocolStats:
        """This protocol's counters, which the connections add to."""
        return self.processor.stats.protocol("pulsar")

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled when there are peers, whose connections go with it."""
        task_status.started()
        if not self.peers:
            return
        try:
            await trio.sleep_forever()
        finally:
            await self.peers.aclose()

    async def handle_connection(self, stream: trio.abc.Stream, info: ConnectionInfo) -> None:
        from mop.protocols.pulsar.serving.handler import PulsarConnection

        await PulsarConnection(self, stream, info).run()

    def service_url(self, info: ConnectionInfo) -> str:
        """The URL lookups answer with: the configured advertised URL, else this node's plain
        listener (the one `info` came in on, or the one beside it for a TLS connection)."""
        advertised = self.settings.cluster.advertised_url
        if advertised:
            return advertised
        port = info.local[1]
        if info.transport != "tcp":
            # The node advertises the port its plain listener bound (also for port 0).
            port = urlsplit(self.membership.advertised_url).port or self.settings.pulsar.port
        return f"pulsar://{self._host(info)}:{port}"

    def service_url_tls(self, info: ConnectionInfo) -> str | None:
        """The pulsar+ssl:// URL lookups answer a client connected over TLS with (pulsar-client
        connects to it when its own service URL is pulsar+ssl://); None for other clients."""
        if info.transport != "tls":
            return None
        advertised = self.settings.cluster.advertised_url
        if advertised:
            host = _url_host(urlsplit(advertised).hostname or self._host(info))
            return f"pulsar+ssl://{host}:{self.settings.pulsar.tls_port or info.local[1]}"
        return f"pulsar+ssl://{self._host(info)}:{info.local[1]}"

    def _host(self, info: ConnectionInfo) -> str:
        host = self.settings.pulsar.host
        if host in _WILDCARD_HOSTS:
            host = info.local[0]
        return _url_host(host)

    async def owner(self, topic: str) -> str | None:
        """The URL of the cluster member that owns `topic` (canonical), None for this broker."""
        if not self.peers:
            return None
        url = await self.processor.lookup(topic)
        return None if normalize_url(url) == self.membership.url else url

    def is_system(self, topic: str) -> bool:
        """Whether canonical `topic` is one of the deployment's own (its tables)."""
        return is_system_topic(topic, self.tenant)

    def acl_topic(self, topic: str) -> str:
        """The name the ACL rules know canonical `topic` by: a topic of the default namespace
        by its MQTT name (`a%2Fb` is `a/b`), any other by its full name."""
        return pulsar_to_mqtt(topic, tenant=self.tenant, namespace=self.namespace)

    def producer_name(self) -> str:
        return f"mop-{self._boot}-{next(self._names)}"

    def topic(self, name: str) -> str:
        """The canonical name of a topic this node serves, or TopicRefused.

        Every namespace of the node's default tenant is served (namespaces need no creation);
        other tenants are unknown. Local names with a "#" are refused: MQTT subscribers could
        not name such a topic. A "+" is fine, it is how MoP's encoding writes a space (an MQTT
        "+" is "%2B").
        """
        try:
            parsed = PulsarTopicName.parse(name)
        except TopicError as exc:
            raise TopicRefused(ServerError.InvalidTopicName, str(exc)) from None
        self.check_namespace(f"{parsed.tenant}/{parsed.namespace}")
        if "#" in parsed.local_name:
            raise TopicRefused(ServerError.InvalidTopicName, f"topic name {name!r} contains '#'")
        return str(parsed)

    def check_namespace(self, namespace: str) -> None:
        tenant, _, rest = namespace.partition("/")
        if tenant != self.tenant or not rest or "/" in rest:
            raise TopicRefused(
                ServerError.TopicNotFound,
                f"namespace {namespace!r} does not exist (this node serves {self.tenant}/*)",
            )
