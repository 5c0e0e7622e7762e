"""One Pulsar client connection: the trio side around the pure `ServerConnection`.

The reader feeds bytes to the state machine and acts on commands (producers and consumers have
their own modules); one writer task sends everything in batches; a keepalive task PINGs a
silent client and drops it when it stays silent. A broken frame gets an ERROR, then the
connection closes; every other problem is answered and the connection goes on.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from mop.processor import ClientContext, ClientLease, ConnectionLimitReached
from mop.protocols.pulsar.commands import (
    Ack,
    CloseConsumer,
    CloseProducer,
    Command,
    Connect,
    Error,
    Flow,
    GetLastMessageId,
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
    lookup_connect,
    lookup_failed,
    lookup_redirect,
    partitioned_metadata,
    partitioned_metadata_failed,
)
from mop.protocols.pulsar.errors import RemoteProtocolError, ServerError
from mop.protocols.pulsar.frames import ChecksumMismatch, NeedData, UnknownCommand
from mop.protocols.pulsar.serving.consumers import ConnectionConsumers
from mop.protocols.pulsar.serving.peers import is_peer
from mop.protocols.pulsar.serving.producers import ConnectionProducers
from mop.protocols.pulsar.serving.server import PulsarServer, TopicRefused
from mop.transport import ConnectionInfo, OutboundBuffer

log = logging.getLogger("mop.pulsar")

_DOMAINS = {
    TopicsMode.PERSISTENT: ("persistent://",),
    TopicsMode.NON_PERSISTENT: ("non-persistent://",),
    TopicsMode.ALL: ("persistent://", "non-persistent://"),
}


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
        self.producers = ConnectionProducers(self)
        self.consumers = ConnectionConsumers(self)
        self._nursery: trio.Nursery | None = None
        self._handlers: dict[type, Callable[[Any], Awaitable[None] | None]] = {
            Ping: self._on_ping,
            Pong: _ignore,
            PartitionedMetadata: self._on_partitioned_metadata,
            Lookup: self._on_lookup,
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

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self) -> None:
        lease = await self._handshake()
        if lease is None:
            return
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self.out.run)
                nursery.start_soon(self._keepalive, nursery.cancel_scope)
                await self._serve_reads()
                with trio.move_on_after(2):
                    await self.out.flush()
                nursery.cancel_scope.cancel()
        except* (trio.BrokenResourceError, trio.ClosedResourceError):
            log.debug("%s: connection lost", self.ctx.peer)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await self.producers.close_all()
                await self.consumers.close_all()
                await self.server.processor.close_client(self.ctx, lease)

    async def _handshake(self) -> ClientLease | None:
        """Read CONNECT, admit the client and answer CONNECTED; None when that fails."""
        with trio.move_on_after(self.server.timers.connect_timeout):
            try:
                connect = await self._read_connect()
            except RemoteProtocolError as exc:
                log.info("%s: bad first frame: %s", self.ctx.peer, exc)
                await self._send_now(self.conn.protocol_error(exc))
                return None
            if connect is None:
                return None
            try:
                lease = await self.server.processor.open_client(self.ctx)
            except ConnectionLimitReached as exc:
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
                "%s: connected (%s, protocol %d)",
                self.ctx.peer,
                connect.client_version,
                self.conn.protocol_version,
            )
            return lease
        log.info("%s: no CONNECT within %ss", self.ctx.peer, self.server.timers.connect_timeout)
        return None

    async def _read_connect(self) -> Connect | None:
        while True:
            event = self.conn.next_event()
            if isinstance(event, Connect):
                return event
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self.server.processor.record_received_bytes(len(data))
            self.conn.receive_data(data)

    async def _send_now(self, data: bytes) -> None:
        with (
            trio.move_on_after(2),
            contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError),
        ):
            await self.stream.send_all(data)

    async def _keepalive(self, scope: trio.CancelScope) -> None:
        """PING a connection silent for an interval; drop it when silent for another."""
        interval = self.server.timers.keepalive_interval
        seen = self.conn.frames_received
        pinged = False
        while True:
            await trio.sleep(interval)
            if self.conn.frames_received != seen:
                seen = self.conn.frames_received
                pinged = False
            elif pinged:
                log.info("%s: silent for %gs, dropping the connection", self.ctx.peer, 2 * interval)
                scope.cancel()
                return
            else:
                self.send(Ping())
                pinged = True

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
        processor = self.server.processor
        while True:
            while not isinstance(event := self.conn.next_event(), NeedData):
                await self._handle(event)
            await self.out.wait_space()
            data = await self.stream.receive_some(65536)
            if not data:
                raise _Closed
            processor.record_received_bytes(len(data))
            self.conn.receive_data(data)

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

    def _on_partitioned_metadata(self, cmd: PartitionedMetadata) -> None:
        try:
            self.server.topic(cmd.topic)
        except TopicRefused as exc:
            self.send(partitioned_metadata_failed(cmd.request_id, exc.error, exc.message))
            return
        self.send(partitioned_metadata(cmd.request_id))

    async def _on_lookup(self, cmd: Lookup) -> None:
        try:
            topic = self.server.topic(cmd.topic)
        except TopicRefused as exc:
            self.send(lookup_failed(cmd.request_id, exc.error, exc.message))
            return
        # An authoritative lookup comes from a redirect: answering Connect ends the chain even
        # if this broker's member list disagrees with the one that redirected.
        owner = None if cmd.authoritative else await self.server.owner(topic)
        if owner is not None:
            self.send(lookup_redirect(cmd.request_id, owner))
        else:
            self.send(lookup_connect(cmd.request_id, self.server.service_url(self.info)))

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
                topics=tuple(sorted(t for t in topics if t.startswith(domains))),
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
