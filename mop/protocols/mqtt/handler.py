"""One MQTT client connection: the trio side around the pure `ServerConnection`.

A reader task feeds bytes to the state machine and acts on packets; one delivery task per
consumer turns deliveries into PUBLISH packets within the client's Receive Maximum; one writer
task sends everything in batches. Session semantics stay here, above the processor, so they
are the same whichever backend the node runs on.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid

import trio

from mop.processor import (
    BackendError,
    ClientContext,
    ClientLease,
    ConnectionLimitReached,
    QuotaExceeded,
)
from mop.protocols.mqtt.codec import NeedData
from mop.protocols.mqtt.connection import ConnectionState, ServerConnection
from mop.protocols.mqtt.errors import RemoteProtocolError, UnsupportedProtocolVersion
from mop.protocols.mqtt.outflow import Outflow
from mop.protocols.mqtt.packets import (
    NO_PROPERTIES,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
    Will,
)
from mop.protocols.mqtt.reason_codes import ReasonCode, v3_connack_code
from mop.protocols.mqtt.server import MqttServer
from mop.protocols.mqtt.session import SessionState
from mop.protocols.mqtt.subscriptions import SessionSubscriptions
from mop.transport import ConnectionInfo, OutboundBuffer

log = logging.getLogger("mop.mqtt")


class _Close(Exception):
    """Stop serving this connection; `reason` goes into a v5 DISCONNECT when not None."""

    def __init__(self, reason: int | None, message: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class ClientHandler:
    def __init__(self, server: MqttServer, stream: trio.abc.Stream, info: ConnectionInfo) -> None:
        self.server = server
        self.stream = stream
        self.info = info
        self.conn = ServerConnection(server.limits)
        self.out = OutboundBuffer(stream)
        self.ctx = ClientContext(
            client_id="", protocol="mqtt", peer=f"{info.peer[0]}:{info.peer[1]}"
        )
        self.state: SessionState | None = None
        self.subs: SessionSubscriptions | None = None
        self.flow: Outflow | None = None
        self.lease: ClientLease | None = None
        self.will: Will | None = None
        self.keep_alive = 0
        self._read_scope = trio.CancelScope()
        self._close_reason: int | None = None
        self._send_will = True

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self) -> None:
        connect = await self._read_connect()
        if connect is None:
            return
        if not await self._open_session(connect):
            await self._flush_quietly()
            return
        assert self.subs is not None and self.flow is not None
        flow = self.flow
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.out.run)
                nursery.start_soon(self._watch_fence)
                self.subs.start(nursery, flow.deliver)
                flow.resend_inflight()
                await self._serve_reads()
                await self._flush_quietly()
                nursery.cancel_scope.cancel()
        except* trio.Cancelled:
            # The node is stopping: tell MQTT 5 clients why before the socket closes.
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await self._say_goodbye(ReasonCode.SERVER_SHUTTING_DOWN)
            raise
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await self._close_session()

    async def _say_goodbye(self, reason: int) -> None:
        if self.conn.protocol_level != 5 or self.conn.state is not ConnectionState.CONNECTED:
            return
        with contextlib.suppress(
            trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError
        ):
            await self.stream.send_all(self.out.take() + self.conn.send(Disconnect(reason)))

    async def _flush_quietly(self) -> None:
        with trio.move_on_after(2):
            with contextlib.suppress(trio.BrokenResourceError):
                await self.out.flush()

    async def _read_connect(self) -> Connect | None:
        with trio.move_on_after(self.server.settings.connect_timeout):
            while True:
                try:
                    event = self.conn.next_event()
                except UnsupportedProtocolVersion as exc:
                    await self._refuse_connect(exc.reason_code, str(exc), exc.protocol_level)
                    return None
                except RemoteProtocolError as exc:
                    log.info("%s: bad first packet: %s", self.ctx.peer, exc)
                    return None
                if isinstance(event, Connect):
                    return event
                data = await self.stream.receive_some(65536)
                if not data:
                    return None
                self.server.processor.record_received_bytes(len(data))
                self.conn.receive_data(data)
        log.info("%s: no CONNECT within %ss", self.ctx.peer, self.server.settings.connect_timeout)
        return None

    async def _refuse_connect(self, reason: int, why: str, level: int | None = None) -> None:
        level = level if level is not None else self.conn.protocol_level
        if level == 5:
            props = (
                Properties(reason_string=why) if self.conn.problem_information else NO_PROPERTIES
            )
            packet = Connack(reason_code=reason, properties=props)
        else:
            packet = Connack(reason_code=v3_connack_code(reason))
        self.conn.protocol_level = 5 if level == 5 else 4
        with trio.move_on_after(2):
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await self.stream.send_all(self.conn.send(packet))
        log.info("%s: connection refused (0x%02X): %s", self.ctx.peer, reason, why)

    async def _open_session(self, connect: Connect) -> bool:
        settings = self.server.settings
        v5 = connect.protocol_level == 5
        client_id = connect.client_id
        assigned = None
        if not client_id:
            if not v5 and not connect.clean_start:
                await self._refuse_connect(
                    ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
                    "an empty client id needs a clean session",
                )
                return False
            client_id = assigned = f"mop-{uuid.uuid4().hex}"
        method = connect.properties.authentication_method
        if method is not None:
            await self._refuse_connect(
                ReasonCode.BAD_AUTHENTICATION_METHOD,
                f"authentication method {method!r} is not supported",
            )
            return False
        if connect.will is not None:
            problem = self.server.topic_problem(connect.will.topic)
            if problem is not None:
                await self._refuse_connect(ReasonCode.TOPIC_NAME_INVALID, f"will topic: {problem}")
                return False
        self.ctx = ClientContext(
            client_id=client_id, protocol="mqtt", peer=self.ctx.peer, username=connect.username
        )
        try:
            self.lease = await self.server.processor.open_client(self.ctx)
        except ConnectionLimitReached as exc:
            await self._refuse_connect(ReasonCode.QUOTA_EXCEEDED, str(exc))
            return False
        if v5:
            requested = connect.properties.session_expiry_interval or 0
        else:
            requested = 0 if connect.clean_start else settings.default_session_expiry
        expiry = min(requested, settings.max_session_expiry)
        state, present = await self.server.sessions.take(client_id, clean_start=connect.clean_start)
        previous = (state.expiry_interval, state.disconnected_at)
        state.expiry_interval = expiry
        state.will = connect.will
        self.state = state
        self.will = connect.will
        self.keep_alive = connect.keep_alive
        server_keep_alive = None
        if self.keep_alive > settings.max_keep_alive or (
            self.keep_alive == 0 and v5 and settings.max_keep_alive < 65535
        ):
            self.keep_alive = settings.max_keep_alive
            server_keep_alive = self.keep_alive
        self.subs = SessionSubscriptions(self.server, self.ctx, state)
        self.flow = Outflow(self.server, self.conn, self.out, self.ctx, state, self.subs)
        try:
            await self.subs.restore()
            state.disconnected_at = None
            await self.server.sessions.save(state)
        except BackendError as exc:
            # Not resumable durably now (e.g. the disk is full): leave the session as it was
            # and refuse, rather than run a session whose state would not survive.
            with contextlib.suppress(BackendError):
                await self.subs.detach(unsubscribe=False)
            state.expiry_interval, state.disconnected_at = previous
            if present:
                self.server.sessions.put_back(state)
            await self.server.processor.close_client(self.ctx, self.lease)
            self.lease = None
            reason = (
                ReasonCode.QUOTA_EXCEEDED
                if isinstance(exc, QuotaExceeded)
                else ReasonCode.UNSPECIFIED_ERROR
            )
            await self._refuse_connect(reason, f"the session cannot be stored: {exc}")
            return False
        props = NO_PROPERTIES
        if v5:
            props = Properties(
                session_expiry_interval=expiry if expiry != requested else None,
                assigned_client_identifier=assigned,
                server_keep_alive=server_keep_alive,
                receive_maximum=settings.max_inflight,
                maximum_packet_size=settings.max_packet_size,
                topic_alias_maximum=settings.topic_alias_maximum,
                retain_available=None if settings.retain_available else 0,
                response_information=(
                    f"response/{client_id}"
                    if connect.properties.request_response_information
                    else None
                ),
            )
        self.out.write(self.conn.send(Connack(session_present=present, properties=props)))
        log.debug("%s: %r connected (level %d)", self.ctx.peer, client_id, connect.protocol_level)
        return True

    def _outflow(self) -> Outflow:
        assert self.flow is not None, "the session is open"
        return self.flow

    async def _watch_fence(self) -> None:
        assert self.lease is not None
        await self.lease.wait_fenced()
        self._close_reason = ReasonCode.SESSION_TAKEN_OVER
        self._read_scope.cancel()

    async def _close_session(self) -> None:
        state, subs = self.state, self.subs
        assert state is not None and subs is not None
        session_ends = state.expiry_interval == 0
        await subs.detach(unsubscribe=session_ends)
        for entry in state.outbound.values():
            entry.delivery = None
        will = self.will if self._send_will else None
        await self.server.sessions.release(state, will=will)
        if self.lease is not None:
            await self.server.processor.close_client(self.ctx, self.lease)

    # -- reading ---------------------------------------------------------------------------

    async def _serve_reads(self) -> None:
        try:
            with self._read_scope:
                await self._read_loop()
        except _Close as close:
            self._close_reason = close.reason
            if close.reason is not None:
                log.info(
                    "%s: closing %r (0x%02X): %s",
                    self.ctx.peer,
                    self.ctx.client_id,
                    close.reason,
                    close,
                )
        except RemoteProtocolError as exc:
            self._close_reason = exc.reason_code
            log.info("%s: protocol error from %r: %s", self.ctx.peer, self.ctx.client_id, exc)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._close_reason = None
        if self._close_reason is not None and self.conn.protocol_level == 5:
            self.out.write(self.conn.send(Disconnect(reason_code=self._close_reason)))

    async def _read_loop(self) -> None:
        grace = self.keep_alive * 1.5 if self.keep_alive else float("inf")
        while True:
            while True:
                event = self.conn.next_event()
                if isinstance(event, NeedData):
                    break
                await self._handle(event)
            await self.out.wait_space()
            with trio.move_on_after(grace):
                data = await self.stream.receive_some(65536)
                if not data:
                    raise _Close(None, "connection closed by the client")
                self.server.processor.record_received_bytes(len(data))
                self.conn.receive_data(data)
                continue
            raise _Close(ReasonCode.KEEP_ALIVE_TIMEOUT, f"nothing received for {grace:g}s")

    async def _handle(self, packet: Packet) -> None:
        if isinstance(packet, Publish):
            await self._on_publish(packet)
        elif isinstance(packet, Puback):
            await self._outflow().on_ack(packet.packet_id)
        elif isinstance(packet, Pubrec):
            await self._outflow().on_pubrec(packet)
        elif isinstance(packet, Pubcomp):
            await self._outflow().on_ack(packet.packet_id)
        elif isinstance(packet, Pubrel):
            await self._on_pubrel(packet)
        elif isinstance(packet, Subscribe):
            await self._on_subscribe(packet)
        elif isinstance(packet, Unsubscribe):
            await self._on_unsubscribe(packet)
        elif isinstance(packet, Pingreq):
            self.out.write(self.conn.send(Pingresp()))
        elif isinstance(packet, Disconnect):
            self._on_disconnect(packet)
        else:  # AUTH: no enhanced authentication method is offered, so none can continue
            raise _Close(ReasonCode.PROTOCOL_ERROR, f"unexpected {type(packet).__name__.upper()}")

    def _on_disconnect(self, packet: Disconnect) -> None:
        assert self.state is not None
        expiry = packet.properties.session_expiry_interval
        if expiry is not None:
            if self.state.expiry_interval == 0 and expiry != 0:
                raise _Close(ReasonCode.PROTOCOL_ERROR, "session expiry set on DISCONNECT after 0")
            self.state.expiry_interval = min(expiry, self.server.settings.max_session_expiry)
        self._send_will = packet.reason_code == ReasonCode.DISCONNECT_WITH_WILL
        raise _Close(None, "DISCONNECT")

    # -- inbound publishes -----------------------------------------------------------------

    async def _on_publish(self, publish: Publish) -> None:
        assert self.state is not None
        v5 = self.conn.protocol_level == 5
        pid = publish.packet_id
        if publish.qos == 2 and pid in self.state.inbound_qos2:
            self.out.write(self.conn.send(Pubrec(pid)))  # a resend: received once already
            return
        reason = await self._publish(publish)
        if reason is None:
            return
        if publish.qos == 1 and pid is not None:
            self.out.write(self.conn.send(Puback(pid, reason if v5 else 0)))
        elif publish.qos == 2 and pid is not None:
            if reason < 0x80:
                self.state.inbound_qos2.add(pid)
                await self.server.sessions.save(self.state)
            self.out.write(self.conn.send(Pubrec(pid, reason if v5 else 0)))

    async def _publish(self, publish: Publish) -> int | None:
        """Publish; the reason code for the ack, or None when nothing is to be answered."""
        if publish.topic.startswith("$"):
            if publish.qos == 0:
                return None
            if self.conn.protocol_level == 5:
                return ReasonCode.NOT_AUTHORIZED
            raise _Close(None, f"publishing to {publish.topic!r} is not allowed")
        if publish.retain and not self.server.settings.retain_available:
            raise _Close(ReasonCode.RETAIN_NOT_SUPPORTED, "retained messages are disabled")
        try:
            result = await self.server.publish(self.ctx, publish)
        except QuotaExceeded as exc:
            return self._publish_failed(publish, ReasonCode.QUOTA_EXCEEDED, exc)
        except BackendError as exc:
            return self._publish_failed(publish, ReasonCode.UNSPECIFIED_ERROR, exc)
        if result.subscriptions == 0:
            return ReasonCode.NO_MATCHING_SUBSCRIBERS
        return ReasonCode.SUCCESS

    def _publish_failed(self, publish: Publish, reason: int, exc: Exception) -> int | None:
        self.server.processor.stats.messages_dropped += 1
        log.warning("%s: publish to %r failed: %s", self.ctx.client_id, publish.topic, exc)
        if publish.qos == 0:
            return None
        if self.conn.protocol_level == 5:
            return reason
        # 3.1.1 acks carry no error: closing makes the client resend later.
        raise _Close(None, f"publish failed: {exc}")

    async def _on_pubrel(self, packet: Pubrel) -> None:
        assert self.state is not None
        known = packet.packet_id in self.state.inbound_qos2
        if known:
            self.state.inbound_qos2.discard(packet.packet_id)
            await self.server.sessions.save(self.state)
        reason = (
            0 if known or self.conn.protocol_level != 5 else ReasonCode.PACKET_IDENTIFIER_NOT_FOUND
        )
        self.out.write(self.conn.send(Pubcomp(packet.packet_id, reason)))

    # -- subscriptions ---------------------------------------------------------------------

    async def _on_subscribe(self, packet: Subscribe) -> None:
        assert self.subs is not None
        codes, retained = await self.subs.subscribe(packet, v5=self.conn.protocol_level == 5)
        self.out.write(self.conn.send(Suback(packet.packet_id, tuple(codes))))
        now = _now_ms()
        for item in retained:
            self._outflow().send(
                item.topic,
                item.message,
                qos=item.qos,
                retain=True,
                sub_ids=item.sub_ids,
                now=now,
                delivery=None,
                consumer=None,
            )
        await self._outflow().drain()

    async def _on_unsubscribe(self, packet: Unsubscribe) -> None:
        assert self.subs is not None
        codes = await self.subs.unsubscribe(packet.topic_filters)
        self.out.write(self.conn.send(Unsuback(packet.packet_id, tuple(codes))))

    # -- outbound messages -----------------------------------------------------------------


def _now_ms() -> int:
    return int(time.time() * 1000)
