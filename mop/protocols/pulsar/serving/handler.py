"""One Pulsar client connection: the trio side around the pure `ServerConnection`.

CONNECT authenticates the client (its token, user and password, or TLS client certificate) and
fixes whose rights the connection acts with; topics are then authorized per request. The reader
feeds bytes to the state machine and acts on commands (producers and consumers have their own
modules); one writer task sends everything in batches; a keepalive task PINGs a silent client
and drops it when it stays silent (a client held back over its rates is not silent: it is not
read from on purpose); a client whose token expires is challenged to refresh it, and closed
when it cannot. A broken frame gets an ERROR, then the connection closes; every other
problem is answered and the connection goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from mop.counters import Closing, Refusal, refusal_of
from mop.overload.buckets import ClientRates
from mop.processor import ClientContext, ClientLease, ConnectionLimitReached
from mop.protocols.introspection import ClientInfo, SubscriptionInfo
from mop.protocols.pulsar.authentication import (
    REFRESH_METHOD,
    acting_principal,
    credentials_of,
    keeps_identity,
    may_use_system_topics,
)
from mop.protocols.pulsar.commands import (
    Ack,
    AuthResponse,
    CloseConsumer,
    CloseProducer,
    Command,
    Connect,
    ConsumerStats,
    Error,
    Flow,
    GetLastMessageId,
    GetOrCreateSchema,
    GetSchema,
    GetTopicsOfNamespace,
    GetTopicsOfNamespaceResponse,
    Lookup,
    PartitionedMetadata,
    Ping,
    Pong,
    Producer,
    RedeliverUnacknowledgedMessages,
    Seek,
    Send,
    Subscribe,
    TopicsMode,
    Unsubscribe,
)
from mop.protocols.pulsar.connection import (
    NO_REQUEST_ID,
    ClientEvent,
    ServerConnection,
)
from mop.protocols.pulsar.errors import RemoteProtocolError, ServerError
from mop.protocols.pulsar.frames import ChecksumMismatch, NeedData, UnknownCommand
from mop.protocols.pulsar.serving.consumers import ConnectionConsumers
from mop.protocols.pulsar.serving.lookups import ConnectionLookups
from mop.protocols.pulsar.serving.peers import is_peer
from mop.protocols.pulsar.serving.producers import ConnectionProducers
from mop.protocols.pulsar.serving.schemas import ConnectionSchemas
from mop.protocols.pulsar.serving.server import PulsarServer, TopicRefused
from mop.security.acl import Access
from mop.security.authorization import ClientPermissions
from mop.security.identity import AuthenticationError, Credentials, Principal, certificate_identity
from mop.transport import ConnectionInfo, OutboundBuffer

log = logging.getLogger("mop.pulsar")

_DOMAINS = {
    TopicsMode.PERSISTENT: ("persistent://",),
    TopicsMode.NON_PERSISTENT: ("non-persistent://",),
    TopicsMode.ALL: ("persistent://", "non-persistent://"),
}
# What a refused client is told (the log says why; the client must not learn which part of
# its credentials was wrong).
_REFUSED = "Unable to authenticate"
# Longest wait for the answer to an AUTH_CHALLENGE (else one refresh interval).
_MAX_CHALLENGE_WAIT = 60.0


class _Closed(Exception):
    """Stop serving this connection."""


class PulsarConnection:
    def __init__(self, server: PulsarServer, stream: trio.abc.Stream, info: ConnectionInfo) -> None:
        self.server = server
        self.stream = stream
        self.info = info
        self.conn = ServerConnection(server.limits)
        self.out = OutboundBuffer(stream, high_water=1 << 20)
        self.ctx = ClientContext(
            client_id=f"pulsar/{uuid.uuid4().hex}",
            protocol="pulsar",
            peer=f"{info.peer[0]}:{info.peer[1]}",
        )
        # Who the client proved to be (a proxy role, for a proxy that speaks for a client:
        # the connection then acts as that client, `ctx.principal`), and what it may do.
        self.authenticated: Principal = self.ctx.principal
        self.permissions: ClientPermissions = server.processor.permissions(self.ctx)
        # What CONNECT said that outlives it: whom a proxy speaks for, and whether the
        # client answers AUTH_CHALLENGE.
        self._original_principal: str | None = None
        self._refreshable = False
        # Set by the AUTH_RESPONSE that answers the challenge in flight, if any.
        self._refreshed: trio.Event | None = None
        # Reading ends when this is cancelled; what was written still goes out.
        self._reading = trio.CancelScope()
        # Whether the reader holds the client back over its rates now, and whether it did
        # since the keepalive last looked: the client is not read from then, on purpose.
        self._holding = False
        self._held = False
        # The client's budgets of messages and bytes (None: not limited), kept when it goes
        # for the next connection from its address as its user (`_budget_key`), so that
        # connecting again does not refill them.
        self._rates: ClientRates | None = None
        self.producers = ConnectionProducers(self)
        self.consumers = ConnectionConsumers(self)
        self.schemas = ConnectionSchemas(self)
        self.lookups = ConnectionLookups(self)
        self._nursery: trio.Nursery | None = None
        # What the admin API shows of the connection (`describe`).
        self.connected_at = 0.0
        self.messages_in = 0
        self.messages_out = 0
        # Why the connection ends, counted when it does (`mop.counters.Closing`).
        self._closing: str = Closing.NORMAL
        self._handlers: dict[type, Callable[[Any], Awaitable[None] | None]] = {
            AuthResponse: self._on_auth_response,
            Ping: self._on_ping,
            Pong: _ignore,
            PartitionedMetadata: self.lookups.on_partitioned_metadata,
            Lookup: self.lookups.on_lookup,
            GetTopicsOfNamespace: self._on_topics,
            Producer: self.producers.on_producer,
            Send: self.producers.on_send,
            CloseProducer: self.producers.on_close,
            Subscribe: self.consumers.on_subscribe,
            Flow: self.consumers.on_flow,
            Ack: self.consumers.on_ack,
            RedeliverUnacknowledgedMessages: self.consumers.on_redeliver,
            Seek: self.consumers.on_seek,
            Unsubscribe: self.consumers.on_unsubscribe,
            CloseConsumer: self.consumers.on_close,
            GetLastMessageId: self.consumers.on_get_last_message_id,
            GetSchema: self.schemas.on_get_schema,
            GetOrCreateSchema: self.schemas.on_get_or_create_schema,
            ConsumerStats: self.consumers.on_stats,
            ChecksumMismatch: self._on_checksum_mismatch,
            UnknownCommand: self._on_unknown,
        }

    @property
    def nursery(self) -> trio.Nursery:
        assert self._nursery is not None, "the connection is running"
        return self._nursery

    def write(self, data: bytes) -> None:
        self.out.write(data)

    def send(self, command: Command) -> None:
        self.out.write(self.conn.send(command))

    def authorized_topic(self, name: str, *accesses: Access) -> str:
        """The canonical name of topic `name` when this client may use it in one of the ways
        `accesses` names, else TopicRefused (AuthorizationError when only the ACL refuses)."""
        topic = self.server.topic(name)
        if not self.may_use(topic, *accesses):
            raise TopicRefused(
                ServerError.AuthorizationError,
                f"{self.ctx.principal.display!r} is not authorized to"
                f" {' or '.join(a.value for a in accesses)} {topic}",
            )
        return topic

    def may_use(self, topic: str, *accesses: Access) -> bool:
        """Whether this client may use canonical `topic` in one of the ways `accesses` names
        (the deployment's own topics only when it may use those at all)."""
        if self.server.is_system(topic) and not may_use_system_topics(
            self.ctx.principal, restricted=self.permissions.restricted
        ):
            return False
        acl_topic = self.server.acl_topic(topic)
        return any(self.permissions.may(access, acl_topic) for access in accesses)

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def admin_id(self) -> str:
        """The connection's name in the admin API: a Pulsar client names no connection, so
        it is "pulsar:" and the client's address and port."""
        return f"pulsar:{self.ctx.peer}"

    def describe(self) -> ClientInfo:
        ctx = self.ctx
        return ClientInfo(
            client_id=self.admin_id,
            protocol="pulsar",
            username=ctx.username if ctx.username is not None else ctx.principal.name,
            peer=ctx.peer,
            connected_at=self.connected_at,
            protocol_version="pulsar",
            keep_alive=int(self.server.timers.keepalive_interval),
            clean_start=True,
            subscriptions=len(self.consumers),
            inflight=self.consumers.inflight,
            queued=0,
            messages_in=self.messages_in,
            messages_out=self.messages_out,
        )

    def subscriptions(self) -> list[SubscriptionInfo]:
        """The connection's consumers: their topics (by MQTT name in the default namespace)
        and subscription names."""
        return [
            SubscriptionInfo(self.admin_id, self.server.acl_topic(topic), 1, subscription)
            for topic, subscription in self.consumers.subscriptions()
        ]

    def close(self) -> None:
        """Close the connection from outside its reads (the admin API)."""
        log.info("%s: closing the connection on request", self.ctx.peer)
        self._closing = Closing.ADMINISTRATIVE
        self._end()

    async def run(self) -> None:
        lease = await self._handshake()
        if lease is None:
            return
        self.connected_at = time.time()
        self.server.connections.add(self)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self.out.run)
                nursery.start_soon(self._keepalive, nursery.cancel_scope)
                if self.ctx.principal.expires_at is not None:
                    nursery.start_soon(self._watch_credentials)
                with self._reading:
                    await self._serve_reads()
                with trio.move_on_after(2):
                    await self.out.flush()
                nursery.cancel_scope.cancel()
        except* (trio.BrokenResourceError, trio.ClosedResourceError):
            log.debug("%s: connection lost", self.ctx.peer)
        finally:
            self.server.connections.discard(self)
            self.server.processor.overload.client_left(self._budget_key(), self._rates)
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await self.producers.close_all()
                await self.consumers.close_all()
                await self.server.processor.close_client(self.ctx, lease, self._closing)

    async def _handshake(self) -> ClientLease | None:
        """Read CONNECT, authenticate and admit the client and answer CONNECTED; None when
        that fails."""
        with trio.move_on_after(self.server.timers.connect_timeout):
            try:
                connect = await self._read_connect()
            except RemoteProtocolError as exc:
                log.info("%s: bad first frame: %s", self.ctx.peer, exc)
                self.server.stats.refuse(Refusal.PROTOCOL_ERROR)
                await self._send_now(self.conn.protocol_error(exc))
                return None
            if connect is None:
                return None
            if not self._authenticate(connect):
                await self._send_now(self.conn.auth_refused(_REFUSED))
                return None
            try:
                lease = await self.server.processor.open_client(self.ctx)
            except ConnectionLimitReached as exc:
                self.server.stats.refuse(Refusal.LIMIT_REACHED)
                await self._send_now(
                    self.conn.send(
                        Error(
                            request_id=NO_REQUEST_ID,
                            error=ServerError.ServiceNotReady,
                            message=str(exc),
                        )
                    )
                )
                return None
            self.out.write(self.conn.connected())
            log.debug(
                "%s: connected (%s, protocol %d) as %s",
                self.ctx.peer,
                connect.client_version,
                self.conn.protocol_version,
                self.ctx.principal.display,
            )
            return lease
        log.info("%s: no CONNECT within %ss", self.ctx.peer, self.server.timers.connect_timeout)
        self.server.stats.refuse(Refusal.TIMEOUT)
        return None

    def _authenticate(self, connect: Connect) -> bool:
        """Whom CONNECT's credentials prove the client is (False: refused, logged)."""
        self._original_principal = connect.original_principal
        self._refreshable = bool(
            connect.feature_flags and connect.feature_flags.supports_auth_refresh
        )
        try:
            credentials = self._credentials(connect.auth_method_name, connect.auth_data)
            self._adopt(self.server.processor.authenticate(credentials))
        except AuthenticationError as exc:
            log.info("%s: authentication refused: %s", self.ctx.peer, exc.why)
            self.server.stats.refuse(refusal_of(exc.failure))
            return False
        self.ctx = dataclasses.replace(self.ctx, username=credentials.username)
        return True

    def _credentials(self, method: str | None, data: bytes | None) -> Credentials:
        return credentials_of(
            method,
            data,
            client_id=self.ctx.client_id,
            address=self.info.peer[0],
            certificate=certificate_identity(self.info.peer_certificate),
        )

    def _adopt(self, authenticated: Principal) -> None:
        """Act as what `authenticated` proves from now on (AuthenticationError when it may not
        speak for the principal CONNECT named)."""
        acting = acting_principal(authenticated, self._original_principal)
        self.authenticated = authenticated
        self.ctx = dataclasses.replace(self.ctx, principal=acting)
        self.permissions = self.server.processor.permissions(self.ctx)

    def _end(self, last: bytes = b"") -> None:
        """Stop reading and close the connection once `last` (and what is queued) is out."""
        if last:
            self.out.write(last)
        self._reading.cancel()

    async def _read_connect(self) -> Connect | None:
        while True:
            event = self.conn.next_event()
            if isinstance(event, Connect):
                return event
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self.server.stats.record_received_bytes(len(data))
            self.conn.receive_data(data)

    async def _send_now(self, data: bytes) -> None:
        with (
            trio.move_on_after(2),
            contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError),
        ):
            await self.stream.send_all(data)

    async def _keepalive(self, scope: trio.CancelScope) -> None:
        """PING a connection silent for an interval; drop it when silent for another.

        Time the reader holds the client back over its rates is not silence (what the client
        sends waits unread). The client's own keepalive would drop the connection then, its
        PINGs unanswered, so it is sent a PONG every half interval instead: pulsar-client
        takes any frame, a PONG above all, as a sign of life. A connection held back for
        minutes thus stays.
        """
        half = self.server.timers.keepalive_interval / 2
        seen = self.conn.frames_received
        silent = 0  # half intervals without a frame from the client
        while True:
            await trio.sleep(half)
            if self._holding:
                self.send(Pong())
            if self._holding or self._held or self.conn.frames_received != seen:
                self._held = False
                seen = self.conn.frames_received
                silent = 0
                continue
            silent += 1
            if silent == 2:
                self.send(Ping())
            elif silent == 4:
                log.info("%s: silent for %gs, dropping the connection", self.ctx.peer, 4 * half)
                scope.cancel()
                return

    async def _watch_credentials(self) -> None:
        """Every refresh interval, check that the client's credentials still hold. Expired
        ones are challenged (AUTH_CHALLENGE) when the client can refresh them; a client that
        cannot, or does not answer in time, is closed (Pulsar brokers just close it)."""
        interval = self.server.settings.pulsar.auth_refresh_interval
        if interval <= 0:
            return
        processor = self.server.processor
        while True:
            await trio.sleep(interval)
            if processor.credential_valid(self.ctx):
                continue
            if not self._refreshable:
                log.info(
                    "%s: the credentials of %s expired and the client cannot refresh them",
                    self.ctx.peer,
                    self.authenticated.display,
                )
                self._end()
                return
            self._refreshed = refreshed = trio.Event()
            self.out.write(self.conn.auth_challenge(REFRESH_METHOD))
            with trio.move_on_after(min(interval, _MAX_CHALLENGE_WAIT)):
                await refreshed.wait()
            if not refreshed.is_set():
                log.info("%s: no answer to the credentials challenge in time", self.ctx.peer)
                self._end()
                return

    def _on_auth_response(self, cmd: AuthResponse) -> None:
        """The answer to our challenge: the same principal goes on with its new credentials;
        wrong ones are refused with an ERROR, another principal's are closed on."""
        response = cmd.response
        try:
            credentials = self._credentials(
                response.auth_method_name if response else None,
                response.auth_data if response else None,
            )
            refreshed = self.server.processor.authenticate(credentials)
            same = keeps_identity(self.authenticated, refreshed)
            if same:
                self._adopt(refreshed)
        except AuthenticationError as exc:
            log.info("%s: refreshed credentials refused: %s", self.ctx.peer, exc.why)
            self._end(self.conn.auth_refused(_REFUSED))
            return
        if not same:
            log.info(
                "%s: refreshed credentials prove %s, not %s: closing",
                self.ctx.peer,
                refreshed.display,
                self.authenticated.display,
            )
            self._end()
            return
        log.debug("%s: credentials of %s refreshed", self.ctx.peer, refreshed.display)
        if self._refreshed is not None:
            self._refreshed.set()

    # -- reading ---------------------------------------------------------------------------

    async def _serve_reads(self) -> None:
        try:
            await self._read_loop()
        except RemoteProtocolError as exc:
            log.info("%s: protocol error: %s", self.ctx.peer, exc)
            self.out.write(self.conn.protocol_error(exc))
        except _Closed:
            pass

    async def _read_loop(self) -> None:
        """Act on the commands of each read, then read again. A client over its message or
        byte rate is held back: what was read waits until the rates allow it, and so does the
        next read (a proxy's connection, which carries many clients that the proxy holds to
        their rates, is not limited)."""
        stats = self.server.stats
        overload = self.server.processor.overload
        if not self.authenticated.is_proxy:
            self._rates = overload.client_rates(self._budget_key())
        rates = self._rates
        read_size = 65536 if rates is None else rates.read_size(65536)
        pause = 0.0  # seconds the client's rates hold it back before more is taken
        while True:
            more = True  # what was read may hold more commands
            while not pause:
                event = self.conn.next_event()
                if isinstance(event, NeedData):
                    more = False
                    break
                stats.requests += 1
                if rates is not None and isinstance(event, Send):
                    pause = rates.charge(max(event.num_messages, 1), 0, trio.current_time())
                await self._handle(event)
                if self._reading.cancel_called:
                    return  # closing: what the client sent after that is not served
            await self.out.wait_space()
            if pause:
                self._holding = True
                try:
                    await overload.throttle(pause, self.ctx.peer)
                finally:
                    self._holding = False
                    self._held = True
                pause = 0.0
            if more:
                continue  # the rest of what was read first
            data = await self.stream.receive_some(read_size)
            if not data:
                raise _Closed
            stats.bytes_received += len(data)
            if rates is not None:
                pause = rates.charge(0, len(data), trio.current_time())
            self.conn.receive_data(data)

    def _budget_key(self) -> str:
        """What the budgets of the client's rates are kept by when it goes: a Pulsar client
        names no connection, so its address and user."""
        return f"pulsar {self.info.peer[0]} {self.ctx.principal.display}"

    async def _handle(self, event: ClientEvent) -> None:
        handler = self._handlers.get(type(event))
        if handler is None:
            return  # CONNECT cannot come twice: the state machine refuses it
        result = handler(event)
        if result is not None:
            await result

    # -- connection-level commands ---------------------------------------------------------

    def _on_ping(self, _: Ping) -> None:
        self.send(Pong())

    def _on_topics(self, cmd: GetTopicsOfNamespace) -> None:
        try:
            self.server.check_namespace(cmd.namespace)
        except TopicRefused as exc:
            self.send(Error(request_id=cmd.request_id, error=exc.error, message=exc.message))
            return
        # Asking the peers takes a while: other commands of this connection go on meanwhile.
        self.nursery.start_soon(self._answer_topics, cmd)

    async def _answer_topics(self, cmd: GetTopicsOfNamespace) -> None:
        """This broker's topics of the namespace, and (unless a peer asks) every peer's."""
        topics = set(await self.server.processor.topics(self.ctx, cmd.namespace))
        if self.server.peers and not is_peer(self.conn.client_version):
            topics |= await self.server.peers.topics(cmd.namespace, cmd.mode)
        domains = _DOMAINS[cmd.mode]
        self.send(
            GetTopicsOfNamespaceResponse(
                request_id=cmd.request_id,
                topics=tuple(
                    sorted(
                        t
                        for t in topics
                        if t.startswith(domains) and self.may_use(t, Access.READ, Access.WRITE)
                    )
                ),
            )
        )

    async def _on_checksum_mismatch(self, event: ChecksumMismatch) -> None:
        log.info(
            "%s: checksum mismatch (%08x != %08x)", self.ctx.peer, event.received, event.computed
        )
        if isinstance(event.command, Send):
            await self.producers.on_checksum_error(event.command)

    def _on_unknown(self, event: UnknownCommand) -> None:
        log.debug("%s: ignoring command type %d", self.ctx.peer, event.type)


def _ignore(_: object) -> None:
    return None
