"""One MQTT client connection: the trio side around the pure `ServerConnection`.

The connection's task feeds bytes to the state machine and acts on the packets of each read
(publishing them in one batch); one delivery task per consumer turns deliveries into PUBLISH
packets within the client's Receive Maximum. Each of them sends what it produced itself, in one
write per batch; a writer task is started only for what is written otherwise, so an idle
connection is one waiting task. Session semantics stay here, above the processor, so they are
the same whichever backend the node runs on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, cast

import trio

from mop.clock import now_ms
from mop.counters import Drop, Refusal
from mop.log_limit import LimitedLog
from mop.overload.buckets import ClientRates
from mop.processor import (
    BackendError,
    ClientContext,
    ClientLease,
    ConnectionLimitReached,
    FenceNotifier,
    PublishResult,
)
from mop.protocols.introspection import ClientInfo
from mop.protocols.mqtt.codec import NEED_DATA, NeedData
from mop.protocols.mqtt.connection import ConnectionState, ServerConnection
from mop.protocols.mqtt.errors import (
    PacketTooLarge,
    RemoteProtocolError,
    UnsupportedProtocolVersion,
)
from mop.protocols.mqtt.negotiation import ConnectDecision, ConnectRefusal, negotiate_connect
from mop.protocols.mqtt.overload import refused_when_overloaded
from mop.protocols.mqtt.packets import (
    NO_PROPERTIES,
    Auth,
    Connack,
    Connect,
    Disconnect,
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
from mop.protocols.mqtt.reason_codes import (
    ReasonCode,
    auth_failure_reason,
    backend_reason_code,
    closing_of,
    refusal_of_connack,
    v3_connack_code,
)
from mop.protocols.mqtt.serving.outflow import Outflow
from mop.protocols.mqtt.serving.server import MqttServer
from mop.protocols.mqtt.serving.subscriptions import SessionSubscriptions
from mop.protocols.mqtt.session import SessionState
from mop.protocols.mqtt.sys_tree import CLIENT_DISCONNECTED, NODE_STOPPING, disconnect_reason
from mop.security.acl import Access
from mop.security.authorization import ClientPermissions
from mop.security.identity import AuthenticationError, Credentials, certificate_identity
from mop.topic_names import FULL_NAME_SCHEMES
from mop.transport import (
    ConnectionInfo,
    ConnectionTasks,
    OutboundBuffer,
    read_ready,
    receiver,
)
from mop.transport.linger import end_and_drain

log = logging.getLogger("mop.mqtt")
# Topic names that may be other spellings of a reserved topic, or of a topic the ACL names
# otherwise (every other name is its own ACL name, and not reserved).
_SPELT_SPECIALLY = ("$", *FULL_NAME_SCHEMES)
# One line per kind of refusal per interval: a full disk refuses every publish of every client.
_refusals = LimitedLog(log)
# Protocol levels as the admin API names them.
_VERSIONS = {3: "3.1", 4: "3.1.1", 5: "5.0"}


def _log_task_failure(peer: str, exc: Exception) -> None:
    """Log the failure of a connection's delivery or writer task as the transport logs a
    connection's own: a peer that vanished briefly, anything else with its traceback."""
    if isinstance(exc, (trio.BrokenResourceError, trio.ClosedResourceError)):
        log.info("%s: connection lost: %s", peer, exc)
    else:
        log.error("%s: a task of the connection failed", peer, exc_info=exc)


class _Close(Exception):
    """Stop serving this connection; `reason` goes into a v5 DISCONNECT when not None."""

    def __init__(self, reason: int | None, message: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class ClientHandler:
    # An idle connection is mostly this object and what hangs off it: no per-instance dict.
    __slots__ = (
        "_close_reason",
        "_closed",
        "_disconnect_reason",
        "_linger",
        "_rates",
        "_read_scope",
        "_reading_since",
        "_send_will",
        "_staged",
        "_staged_qos2",
        "bridge",
        "clean_start",
        "conn",
        "connected_at",
        "ctx",
        "flow",
        "info",
        "keep_alive",
        "lease",
        "messages_in",
        "out",
        "permissions",
        "server",
        "state",
        "stream",
        "subs",
        "will",
    )

    def __init__(self, server: MqttServer, stream: trio.abc.Stream, info: ConnectionInfo) -> None:
        self.server = server
        self.stream = stream
        self.conn = ServerConnection(server.limits)
        self.out = OutboundBuffer(stream)
        self.info = info
        self.ctx = ClientContext(
            client_id="", protocol="mqtt", peer=f"{info.peer[0]}:{info.peer[1]}"
        )
        self.permissions: ClientPermissions | None = None
        self.state: SessionState | None = None
        self.subs: SessionSubscriptions | None = None
        self.flow: Outflow | None = None
        self.lease: ClientLease | None = None
        self.will: Will | None = None
        self.keep_alive = 0
        # A mosquitto bridge below MQTT 5 (the top bit of the CONNECT's level): see
        # `SessionSubscriptions.subscribe`.
        self.bridge = False
        # What the admin API shows of the connection (`describe`).
        self.clean_start = True
        self.connected_at = 0.0  # seconds since the epoch, once CONNACK is sent
        self.messages_in = 0  # PUBLISHes received
        # Reads end when it is cancelled: by a takeover (`_on_fenced`) or an expired
        # credential (`_credential_expired`), which set `_close_reason`, or by the keep-alive
        # check (`_check_keep_alive`), which looks at when the read under way began to wait
        # (inf: no read waits). A timestamp per read is far cheaper than moving a deadline.
        self._read_scope = trio.CancelScope()
        self._reading_since = math.inf
        self._close_reason: int | None = None
        # Set once the connection and its session are closed; made only when someone waits.
        self._closed: trio.Event | None = None
        # Why the connection ended when no reason code says it: the client's DISCONNECT, or the
        # node stopping.
        self._disconnect_reason: str | None = None
        self._send_will = True
        # Whether the connection ends with a DISCONNECT that says why: then the client is
        # given time to read it before the socket closes (`end_and_drain`).
        self._linger = False
        # PUBLISHes of the current read waiting for one publish of them all (`_commit`).
        self._staged: list[Publish] = []
        # The packet ids of the QoS 2 ones; made with the first, as most clients send none.
        self._staged_qos2: set[int] | None = None
        # The client's budgets of messages and bytes (None: no per-client rates), kept for
        # its client id when it goes (`_budget_key`), so that connecting again does not
        # refill them.
        self._rates: ClientRates | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self) -> None:
        connect = await self._read_connect()
        if connect is None:
            return
        opened = await self._open_session(connect)
        del connect  # not kept alive for as long as the connection lasts
        if not opened:
            await self._flush_quietly()
            return
        assert self.subs is not None and self.flow is not None
        flow = self.flow
        self.server.clients.add(self)
        # The connection's other tasks (deliveries, writers) run beside this one, not in a
        # nursery of its own: an idle connection starts none.
        tasks = ConnectionTasks(self._read_scope)
        reported = False  # whether the failure of one of them went up (or into the log)
        try:
            # CONNACK goes out from this task: a connection that then stays idle never
            # starts a writer task.
            await self.out.flush()
            self.out.write_from(tasks)
            # A lease that calls back when fenced saves a task per connection.
            if self.server.processor.capabilities.fence_callbacks:
                cast("FenceNotifier", self.lease).on_fenced(self._on_fenced)
            else:
                tasks.start_soon(self._watch_fence)
            self.subs.start(tasks, flow.deliver)
            # The reads are served right here: a frame less for every idle connection.
            try:
                flow.resend_inflight()
                with self._read_scope:
                    await self._read_loop()
                if tasks.error is not None:  # one of them failed: as a nursery ends
                    reported = True
                    raise tasks.error
                if self._close_reason is None:  # nothing arrived within the keep alive
                    raise _Close(
                        ReasonCode.KEEP_ALIVE_TIMEOUT,
                        f"nothing received for {self.keep_alive * 1.5:g}s",
                    )
            except (
                _Close,
                RemoteProtocolError,
                trio.BrokenResourceError,
                trio.ClosedResourceError,
            ) as exc:
                if exc is tasks.error:
                    raise
                self._reads_ended(exc)
            finally:
                self.server.timers.cancel(self._keep_alive_key())
                self.server.timers.cancel(self._credential_key())
            if self._close_reason is not None and self.conn.protocol_level == 5:
                self.out.write(self.conn.send(Disconnect(reason_code=self._close_reason)))
                self._linger = True
            await self._flush_quietly()
            await tasks.aclose()
            # Once a DISCONNECT is on its way the client is given time to read it
            # (`end_and_drain` below): the failure goes into the log instead.
            if tasks.error is not None and not self._linger:
                reported = True
                raise tasks.error
        except* trio.Cancelled:
            # The node is stopping: tell MQTT 5 clients why before the socket closes, once
            # no other task of the connection is sending.
            self._disconnect_reason = NODE_STOPPING
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await tasks.aclose()
                await self._say_goodbye(ReasonCode.SERVER_SHUTTING_DOWN)
            raise
        finally:
            self.out.write_from(None)  # what is written from now on starts no writer task
            self.server.clients.discard(self)
            self.server.processor.overload.client_left(self._budget_key(), self._rates)
            self.server.timers.cancel(self._credential_key())
            self.server.events.disconnected(
                self.ctx,
                self.info,
                protocol_level=self.conn.protocol_level,
                reason=self._disconnect_reason or disconnect_reason(self._close_reason),
            )
            try:
                with trio.CancelScope(shield=True):
                    # Its tasks end before the session is let go of (they use it), with no
                    # time limit, as a nursery's end waits for its tasks.
                    await tasks.aclose()
                    if tasks.error is not None and not reported:
                        # Not what ends the connection (a node stopping, another error, a
                        # DISCONNECT sent), yet worth the log as it would have been.
                        _log_task_failure(self.ctx.peer, tasks.error)
                    with trio.move_on_after(10):
                        await self._close_session()
            finally:
                if self._closed is not None:
                    self._closed.set()
        if self._linger:  # once the client id and the session are let go of
            await end_and_drain(self.stream)

    async def _say_goodbye(self, reason: int) -> None:
        if self.conn.protocol_level != 5 or self.conn.state is not ConnectionState.CONNECTED:
            return
        if self.out.unframed:  # a send broken off halfway: the stream may end in a packet
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
        # A client sends CONNECT as soon as it is connected, so it has usually arrived by now:
        # then it is taken without arming the timeout (a cancel scope per connection).
        early = read_ready(self.stream, 65536)
        if early is not None:
            if not early:
                return None
            self._received(early)
            found = await self._next_connect()
            if not isinstance(found, NeedData):
                return found
        receive = receiver(self.stream)
        with trio.move_on_after(self.server.settings.connect_timeout):
            while True:
                found = await self._next_connect()
                if not isinstance(found, NeedData):
                    return found
                data = await receive(65536)
                if not data:
                    return None
                self._received(data)
        log.info("%s: no CONNECT within %ss", self.ctx.peer, self.server.settings.connect_timeout)
        self.server.stats.refuse(Refusal.TIMEOUT)
        return None

    def _received(self, data: bytes | bytearray) -> None:
        self.server.stats.record_received_bytes(len(data))
        self.conn.receive_data(data)

    async def _next_connect(self) -> Connect | NeedData | None:
        """The CONNECT received so far, NEED_DATA, or None when the client was turned away."""
        try:
            event = self.conn.next_event()
        except UnsupportedProtocolVersion as exc:
            await self._refuse_connect(exc.reason_code, str(exc), exc.protocol_level)
            return None
        except RemoteProtocolError as exc:
            log.info("%s: bad first packet: %s", self.ctx.peer, exc)
            self.server.stats.refuse(Refusal.PROTOCOL_ERROR)
            return None
        if isinstance(event, Connect):
            return event
        if isinstance(event, NeedData):
            return event
        # The state machine lets nothing but CONNECT through first.
        raise AssertionError(f"unexpected first packet {event!r}")  # pragma: no cover

    async def _refuse_connect(self, reason: int, why: str, level: int | None = None) -> None:
        self.server.stats.refuse(refusal_of_connack(reason))
        level = level if level is not None else self.conn.protocol_level
        if level == 5:
            props = (
                Properties(reason_string=why) if self.conn.problem_information else NO_PROPERTIES
            )
            packet = Connack(reason_code=reason, properties=props)
        else:
            packet = Connack(reason_code=v3_connack_code(reason))
        self.conn.protocol_level = 5 if level == 5 else 4
        try:
            data = self.conn.send(packet)
        except PacketTooLarge:
            data = b""  # not even without its reason string: closed without a CONNACK
        with trio.move_on_after(2):
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await self.stream.send_all(data)
                if data:
                    await end_and_drain(self.stream)  # so that the client reads why
        log.info("%s: connection refused (0x%02X): %s", self.ctx.peer, reason, why)

    def _turn_away(self, refusal: Refusal, why: str) -> None:
        """Refuse a CONNECT without a CONNACK: where the spec says to close the connection
        without one, or where none fits the client's Maximum Packet Size."""
        self.server.stats.refuse(refusal)
        log.info("%s: connection closed without CONNACK: %s", self.ctx.peer, why)

    async def _open_session(self, connect: Connect) -> bool:
        """Carry out what `negotiate_connect` decides: take the client id (the lease), take
        the session and attach it, then answer with CONNACK; or refuse the CONNECT."""
        decision = negotiate_connect(connect, self.server.connect_policy)
        if isinstance(decision, ConnectRefusal):
            if decision.answered:
                await self._refuse_connect(decision.reason_code, decision.why)
            else:
                self._turn_away(refusal_of_connack(decision.reason_code), decision.why)
            return False
        if not self.conn.fits(Connack(properties=decision.connack_properties)):
            # Checked before the session is taken: the CONNACK that follows is as large.
            self._turn_away(
                Refusal.PROTOCOL_ERROR, "no CONNACK fits the client's Maximum Packet Size"
            )
            return False
        client_id = decision.client_id
        credentials = Credentials(
            client_id=client_id,
            address=self.info.peer[0],
            username=connect.username,
            password=connect.password,
            token=_token(decision.auth_method, connect.properties.authentication_data),
            certificate=certificate_identity(self.info.peer_certificate),
        )
        processor = self.server.processor
        if processor.overload.memory_high:
            processor.overload.refused_busy(self.ctx.peer)
            await self._refuse_connect(
                ReasonCode.SERVER_BUSY, "server busy: memory is over its high-water mark"
            )
            return False
        try:
            principal = processor.authenticate(credentials)
        except AuthenticationError as exc:
            await self._refuse_connect(auth_failure_reason(exc.failure), "not authorized")
            return False
        self.ctx = ClientContext(
            client_id=client_id,
            protocol="mqtt",
            peer=self.ctx.peer,
            username=connect.username,
            principal=principal,
        )
        self.permissions = processor.permissions(self.ctx)
        self.bridge = connect.bridge and connect.protocol_level < 5
        if decision.will is not None and not self._may_write(decision.will.topic):
            will_topic = decision.will.topic
            if not self._bridge_state(will_topic) or not self._acl_allows_write(will_topic):
                await self._refuse_connect(ReasonCode.NOT_AUTHORIZED, "will topic not allowed")
                return False
            # A mosquitto bridge's notification will: `$SYS` is the node's own, so it is not
            # kept, and the bridge is let in as mosquitto lets it in.
            decision = dataclasses.replace(decision, will=None)
        try:
            self.lease = await processor.open_client(self.ctx, admit=False)
        except ConnectionLimitReached as exc:
            await self._refuse_connect(ReasonCode.QUOTA_EXCEEDED, str(exc))
            return False
        except BackendError as exc:
            # E.g. the brokers of a separated deployment cannot be reached right now.
            await self._refuse_connect(
                ReasonCode.SERVER_UNAVAILABLE, f"cannot take the client id: {exc}"
            )
            return False
        try:
            present = await self._take_session(client_id, connect.clean_start, decision)
        except BaseException:
            await self._withdraw()
            raise
        if isinstance(present, ConnectRefusal):
            await self._withdraw()
            await self._refuse_connect(present.reason_code, present.why)
            return False
        connack = Connack(session_present=present, properties=decision.connack_properties)
        self.out.write(self.conn.send(connack))
        processor.admit_client(self.ctx)
        self.clean_start = connect.clean_start
        self.connected_at = time.time()
        self._watch_credential()
        self.server.events.connected(
            self.ctx,
            self.info,
            protocol_level=connect.protocol_level,
            keep_alive=decision.keep_alive,
            clean_start=connect.clean_start,
            expiry_interval=decision.session_expiry,
        )
        return True

    async def _take_session(
        self, client_id: str, clean_start: bool, decision: ConnectDecision
    ) -> bool | ConnectRefusal:
        """Take the client's session and attach it to this connection: whether it was
        present, or why the connection is refused (the session cannot be read or stored)."""
        try:
            state, present = await self.server.sessions.take(client_id, clean_start=clean_start)
        except BackendError as exc:
            return ConnectRefusal(ReasonCode.SERVER_UNAVAILABLE, f"cannot read the session: {exc}")
        refusal = await self._attach(state, present, decision)
        return present if refusal is None else refusal

    async def _attach(
        self, state: SessionState, present: bool, decision: ConnectDecision
    ) -> ConnectRefusal | None:
        """Resume `state` on this connection on the terms of `decision`; when it cannot be
        stored, put it back as it was and say why (the caller gives the client id up)."""
        previous = (state.expiry_interval, state.disconnected_at)
        state.expiry_interval = decision.session_expiry
        state.will = decision.will
        self.state = state
        self.will = decision.will
        self.keep_alive = decision.keep_alive
        assert self.permissions is not None
        self.subs = SessionSubscriptions(self.server, self.ctx, state, self.permissions)
        self.flow = Outflow(
            self.server.outflow_context, self.conn, self.out, self.ctx, state, self.subs
        )
        try:
            await self.subs.restore()
            await self.server.sessions.attach(state)
        except BackendError as exc:
            # Not resumable durably now (e.g. the disk is full): leave the session as it was
            # and refuse, rather than run a session whose state would not survive.
            with contextlib.suppress(BackendError):
                await self.subs.detach(unsubscribe=False)
            state.expiry_interval, state.disconnected_at = previous
            if present:
                self.server.sessions.put_back(state)
            return ConnectRefusal(backend_reason_code(exc), f"the session cannot be stored: {exc}")
        return None

    async def _withdraw(self) -> None:
        """Give the client id up before CONNACK: the connection was not admitted after all."""
        lease, self.lease = self.lease, None
        if lease is not None:
            with trio.CancelScope(shield=True):
                await self.server.processor.withdraw_client(self.ctx, lease)

    def _outflow(self) -> Outflow:
        assert self.flow is not None, "the session is open"
        return self.flow

    async def _watch_fence(self) -> None:
        assert self.lease is not None
        await self.lease.wait_fenced()
        self._on_fenced()

    def _on_fenced(self) -> None:
        self._close_reason = ReasonCode.SESSION_TAKEN_OVER
        self._read_scope.cancel()

    def _budget_key(self) -> str:
        return f"mqtt {self.ctx.client_id}"

    def _keep_alive_key(self) -> Hashable:
        # The connection itself: a connection keeps no key string of its own for it.
        return self

    def _watch_keep_alive(self, delay: float) -> None:
        self.server.timers.schedule(self._keep_alive_key(), delay, self._check_keep_alive)

    async def _check_keep_alive(self) -> None:
        """End the reads when one has waited 1.5 times the keep alive; otherwise look again
        when the read under way (or the next one) could reach that."""
        grace = self.keep_alive * 1.5
        waited = trio.current_time() - self._reading_since
        if waited >= grace:
            self._read_scope.cancel()
        else:
            self._watch_keep_alive(grace - max(waited, 0.0))

    async def _close_session(self) -> None:
        state, subs = self.state, self.subs
        assert state is not None and subs is not None
        session_ends = state.expiry_interval == 0
        try:
            if self.flow is not None:
                self.flow.flush_acks()  # what the client has must not come back
            try:
                await subs.detach(unsubscribe=session_ends)
            finally:
                # Kept or ended, and its will handled, even when a subscription could not
                # be left.
                for entry in state.outbound.values():
                    entry.delivery = None
                await self.server.sessions.release(state, will=self._will_to_send())
        finally:
            # Also when the session could not be saved: the client id is let go of all the
            # same (a lease releases itself shielded), or its next connection would wait for
            # it, and the connection would stay counted.
            if self.lease is not None:
                await self.server.processor.close_client(
                    self.ctx, self.lease, closing_of(self._close_reason)
                )

    def _will_to_send(self) -> Will | None:
        """The will, unless the client said not to send it, or may not publish to its topic
        any more (new rules, or the credential that allowed it expired)."""
        will = self.will if self._send_will else None
        if will is None:
            return None
        if not self.server.processor.credential_valid(self.ctx) or not self._may_write(will.topic):
            log.info(
                "%s: the will of %r is not sent: not allowed", self.ctx.peer, self.ctx.client_id
            )
            return None
        return will

    # -- reading ---------------------------------------------------------------------------

    def _reads_ended(self, why: Exception) -> None:
        """Note why reading stopped: the reason to send in a DISCONNECT, if any."""
        if isinstance(why, _Close):
            self._close_reason = why.reason
            if why.reason is not None:
                log.info(
                    "%s: closing %r (0x%02X): %s",
                    self.ctx.peer,
                    self.ctx.client_id,
                    why.reason,
                    why,
                )
        elif isinstance(why, RemoteProtocolError):
            self._close_reason = why.reason_code
            log.info("%s: protocol error from %r: %s", self.ctx.peer, self.ctx.client_id, why)
        else:  # the connection is gone
            self._close_reason = None

    async def _read_loop(self) -> None:
        """Act on every packet of each read, then read again.

        PUBLISHes that are not retained are staged and published together (`_commit`): one
        wait for durability and one write of their PUBACKs and PUBRECs per read, instead of
        one each. Any other packet commits what is staged first, so that acks, deliveries
        and session changes keep the order of the packets; so does a QoS 2 PUBLISH that is
        received again (its packet id is taken), which is answered without publishing.

        Overload protection holds the client back. Over its message or byte rate, packets
        read already wait (their acks too) until the rates allow them, and the next read
        waits for that. While the node is over its memory high-water mark, a read with
        PUBLISHes is answered (0x97 for those that `refused_when_overloaded` names), then the
        client is not read from until memory is below the low-water mark.
        """
        keep_alive = self.keep_alive > 0
        if keep_alive:
            self._watch_keep_alive(self.keep_alive * 1.5)
        inf = math.inf
        now = trio.current_time
        receive = receiver(self.stream)
        conn = self.conn
        flow = self._outflow()
        staged = self._staged
        may_write = self._may_write
        stats = self.server.stats
        overload = self.server.processor.overload
        self._rates = rates = overload.client_rates(self._budget_key())
        read_size = 65536 if rates is None else rates.read_size(65536)
        level = conn.protocol_level
        published = 0  # the PUBLISHes taken since the last read
        pause = 0.0  # seconds the client's rates hold it back before more is taken

        while True:
            refusing = overload.memory_high
            more = True  # what was read may hold more packets
            while not pause:
                if staged and conn.inbound_full:
                    # Answer what is staged before a PUBLISH beyond our Receive Maximum, so
                    # a client is held to it only as it was before the batching.
                    await self._commit()
                try:
                    event = conn.next_event()
                except RemoteProtocolError:
                    if staged:  # what came before the bad packet is answered
                        await self._commit()
                    raise
                if event is NEED_DATA:
                    more = False
                    break
                stats.requests += 1
                if type(event) is Publish:
                    published += 1
                    if rates is not None:
                        pause = rates.charge(1, 0, now())
                    if (
                        not event.retain
                        and may_write(event.topic)
                        and not (refusing and refused_when_overloaded(level, event.qos))
                        and (event.qos < 2 or self._stages_qos2(event))
                    ):
                        staged.append(event)
                        continue
                elif type(event) is Puback or type(event) is Pubcomp:
                    # The end of a flow: no reply to write, and what it frees is sent (`drain`)
                    # and acknowledged to the consumers (`flush_acks`) once for the read.
                    entry = flow.acked(event.packet_id)
                    if entry is not None and entry.qos == 2:
                        await flow.forget(entry)
                    continue
                if staged:
                    await self._commit()
                await _HANDLERS[type(event)](self, event)
            if staged:
                await self._commit()
            flow.flush_acks()
            if flow.waiting:
                await flow.drain()
            # What this read produced leaves from this task, before it waits again.
            await self.out.push()
            await self.out.wait_space()
            if pause:
                await overload.throttle(pause, self.ctx.client_id)
                pause = 0.0
            if more:
                continue  # the rest of what was read first
            if published and overload.memory_high:
                await overload.wait_memory(self.ctx.client_id)
            published = 0
            if keep_alive:
                self._reading_since = now()
                data = await receive(read_size)
                self._reading_since = inf
            else:
                data = await receive(read_size)
            if not data:
                raise _Close(None, "connection closed by the client")
            stats.bytes_received += len(data)
            if rates is not None:
                pause = rates.charge(0, len(data), now())
            conn.receive_data(data)

    async def _on_pubrec(self, packet: Pubrec) -> None:
        await self._outflow().on_pubrec(packet)

    async def _on_pingreq(self, packet: Pingreq) -> None:
        self.out.write(self.conn.send(Pingresp()))

    async def _on_auth(self, packet: Auth) -> None:
        """Re-authentication (MQTT 5 section 4.12.1) with the method of the CONNECT: a fresh
        token for the same user keeps the connection going past the old one's expiry."""
        method = packet.properties.authentication_method
        if method != self.conn.auth_method:
            raise _Close(ReasonCode.PROTOCOL_ERROR, "AUTH with another authentication method")
        if packet.reason_code != ReasonCode.REAUTHENTICATE:
            raise _Close(ReasonCode.PROTOCOL_ERROR, "AUTH that continues no exchange")
        credentials = Credentials(
            client_id=self.ctx.client_id,
            address=self.info.peer[0],
            username=self.ctx.username,
            token=_token(method, packet.properties.authentication_data),
        )
        try:
            principal = self.server.processor.authenticate(credentials)
        except AuthenticationError as exc:
            raise _Close(ReasonCode.NOT_AUTHORIZED, f"re-authentication: {exc.why}") from None
        if principal.name != self.ctx.principal.name:
            raise _Close(ReasonCode.NOT_AUTHORIZED, "re-authenticated as another user")
        self.ctx = dataclasses.replace(self.ctx, principal=principal)
        assert self.permissions is not None
        self.permissions.become(principal)
        self._watch_credential()
        self.out.write(
            self.conn.send(Auth(ReasonCode.SUCCESS, Properties(authentication_method=method)))
        )

    def _reserved(self, topic: str) -> bool:
        """Whether no client may publish to `topic` (`MqttServer.reserved`), however spelt."""
        return self.server.reserved(self.server.acl_name(topic))

    def _bridge_state(self, topic: str) -> bool:
        """Whether `topic` is where mosquitto bridges report their state
        (`MqttServer.is_bridge_state`), however spelt."""
        return self.server.is_bridge_state(self.server.acl_name(topic))

    def _may_write(self, topic: str) -> bool:
        """Whether this client may publish to `topic` (also a will): not a `$` or system
        topic, and allowed by the ACL under its MQTT name, however the client spelt it."""
        if topic.startswith(_SPELT_SPECIALLY):  # `$`, a Pulsar name
            return not self._reserved(topic) and self._acl_allows_write(topic)
        permissions = self.permissions  # `_acl_allows_write` inline: once per message
        assert permissions is not None
        return not permissions.restricted or permissions.may(Access.WRITE, topic)

    def _acl_allows_write(self, topic: str) -> bool:
        """Whether the ACL lets this client write to `topic` (under its MQTT name, however
        the client spelt it), reserved or not: for a bridge's state, which is dropped."""
        name = self.server.acl_name(topic) if topic.startswith(_SPELT_SPECIALLY) else topic
        permissions = self.permissions
        assert permissions is not None
        return not permissions.restricted or permissions.may(Access.WRITE, name)

    def _credential_key(self) -> str:
        return f"credential/{id(self)}"

    def _watch_credential(self) -> None:
        """Close the connection when the credential it was admitted with expires (a token's
        `exp`), unless the client re-authenticates first."""
        expires_at = self.ctx.principal.expires_at
        if expires_at is None:
            return
        delay = max(0.0, expires_at - time.time())
        self.server.timers.schedule(self._credential_key(), delay, self._credential_expired)

    def describe(self) -> ClientInfo:
        """The connection as the admin API shows it."""
        ctx, state, flow = self.ctx, self.state, self.flow
        return ClientInfo(
            client_id=ctx.client_id,
            protocol="mqtt",
            username=ctx.username,
            peer=ctx.peer,
            connected_at=self.connected_at,
            protocol_version=_VERSIONS.get(self.conn.protocol_level, "5.0"),
            keep_alive=self.keep_alive,
            clean_start=self.clean_start,
            subscriptions=len(state.subscriptions) if state is not None else 0,
            inflight=len(state.outbound) if state is not None else 0,
            queued=flow.queued if flow is not None else 0,
            messages_in=self.messages_in,
            messages_out=flow.messages_out if flow is not None else 0,
        )

    def close_for(self, reason: int, why: str) -> None:
        """End the connection from outside its reads (a ban): MQTT 5 clients are told
        `reason` in a DISCONNECT."""
        log.info("%s: closing %r: %s", self.ctx.peer, self.ctx.client_id, why)
        self._close_reason = reason
        self._read_scope.cancel()

    async def end_session(self, reason: int, why: str) -> None:
        """Close the connection as `close_for` does, end its session whatever its expiry
        says, and return once both are done."""
        if self._closed is None:
            self._closed = trio.Event()
        if self.state is not None:
            self.state.expiry_interval = 0
        self.close_for(reason, why)
        await self._closed.wait()

    async def _credential_expired(self) -> None:
        if self.server.processor.credential_valid(self.ctx):
            self._watch_credential()  # re-authenticated meanwhile
            return
        log.info("%s: %r: the credential expired", self.ctx.peer, self.ctx.client_id)
        self._close_reason = ReasonCode.NOT_AUTHORIZED
        self._read_scope.cancel()

    async def _on_disconnect(self, packet: Disconnect) -> None:
        assert self.state is not None
        expiry = packet.properties.session_expiry_interval
        if expiry is not None:
            if self.state.expiry_interval == 0 and expiry != 0:
                raise _Close(ReasonCode.PROTOCOL_ERROR, "session expiry set on DISCONNECT after 0")
            self.state.expiry_interval = min(expiry, self.server.settings.max_session_expiry)
        self._send_will = packet.reason_code == ReasonCode.DISCONNECT_WITH_WILL
        self._disconnect_reason = CLIENT_DISCONNECTED
        raise _Close(None, "DISCONNECT")

    # -- inbound publishes -----------------------------------------------------------------

    def _stages_qos2(self, publish: Publish) -> bool:
        """Whether a QoS 2 PUBLISH can be staged: its packet id is not taken by one received
        before (whose PUBREL has not come) or by one staged already. When it can, its packet
        id is noted as staged (the caller stages it)."""
        assert self.state is not None
        pid = publish.packet_id
        assert pid is not None  # the codec refuses a QoS 2 PUBLISH without one
        staged = self._staged_qos2
        if staged is None:
            staged = self._staged_qos2 = set()
        elif pid in staged:
            return False
        if pid in self.state.inbound_qos2:
            return False
        staged.add(pid)
        return True

    async def _commit(self) -> None:
        """Publish the staged PUBLISHes (not retained) with one wait for durability, then
        answer the QoS 1 ones with their PUBACKs and the QoS 2 ones with their PUBRECs, in
        order, in one write. Nothing is acknowledged before it is durable, and no PUBREC goes
        out before its packet id is recorded in the session (once for all of them); a message
        the backend refused is answered with its reason code (MQTT 5) or closes the
        connection (3.1.1, whose acks carry no error), after the acks of the messages before
        it."""
        staged = self._staged[:]
        self._staged.clear()
        if self._staged_qos2 is not None:
            self._staged_qos2.clear()
        self.messages_in += len(staged)
        results = await self.server.publish_batch(self.ctx, staged)
        conn = self.conn
        v5 = conn.protocol_level == 5
        acks: list[bytes] = []
        received: list[int] = []  # QoS 2 packet ids to record before their PUBRECs
        failure: _Close | None = None
        send_puback = conn.send_puback
        for publish, result in zip(staged, results, strict=True):
            qos = publish.qos
            reason: int | None
            if type(result) is PublishResult:  # stored: `_ack_reason` without the call
                if qos == 0:
                    continue  # nothing to answer
                subscribed = result.subscriptions != 0 or not v5
                reason = ReasonCode.SUCCESS if subscribed else ReasonCode.NO_MATCHING_SUBSCRIBERS
            else:
                try:
                    reason = self._ack_reason(publish, result, v5)
                except _Close as exc:
                    failure = exc  # answered after the acks of the messages before it
                    break
                if reason is None:
                    continue
            pid = publish.packet_id
            assert pid is not None
            if qos == 1:
                acks.append(send_puback(pid, reason))
            else:
                if reason < 0x80:
                    received.append(pid)
                acks.append(conn.send_pubrec(pid, reason))
        if received:
            state = self.state
            assert state is not None
            state.inbound_qos2_mutable().update(received)
            try:
                await self.server.sessions.save(state)
            except BackendError as exc:
                # Not answered: the client sends them again (with DUP) after a reconnect.
                state.inbound_qos2_mutable().difference_update(received)
                raise _Close(ReasonCode.UNSPECIFIED_ERROR, f"session not saved: {exc}") from exc
        if acks:
            self.out.add(b"".join(acks))  # pushed by the read loop
        if failure is not None:
            raise failure

    async def _on_publish(self, publish: Publish) -> None:
        assert self.state is not None
        v5 = self.conn.protocol_level == 5
        pid = publish.packet_id
        if publish.qos == 2 and pid is not None and pid in self.state.inbound_qos2:
            self.out.write(self.conn.send_pubrec(pid))  # a resend: received once already
            return
        reason = await self._publish(publish)
        if reason is None:
            return
        if publish.qos == 1 and pid is not None:
            self.out.write(self.conn.send(Puback(pid, reason if v5 else 0)))
        elif publish.qos == 2 and pid is not None:
            if reason < 0x80:
                self.state.inbound_qos2_mutable().add(pid)
                await self.server.sessions.save(self.state)
            self.out.write(self.conn.send_pubrec(pid, reason))

    async def _publish(self, publish: Publish) -> int | None:
        """Publish; the reason code for the ack, or None when nothing is to be answered."""
        self.messages_in += 1
        if self._reserved(publish.topic):
            if self._bridge_state(publish.topic) and self._acl_allows_write(publish.topic):
                # A mosquitto bridge's state: taken and dropped, as its will is (where the
                # ACL lets the client write there; refused as the rest of `$SYS` otherwise).
                self.server.processor.record_dropped(Drop.DENIED)
                return None if publish.qos == 0 else ReasonCode.SUCCESS
            if publish.qos == 0:
                return None
            if self.conn.protocol_level == 5:
                return ReasonCode.NOT_AUTHORIZED
            raise _Close(None, f"publishing to {publish.topic!r} is not allowed")
        if not self._may_write(publish.topic):
            self.server.processor.record_dropped(Drop.DENIED)
            if publish.qos == 0:
                return None
            # MQTT 3.1.1 acks carry no error: the message is acknowledged and dropped, as
            # mosquitto does, so that the client does not send it again and again.
            return ReasonCode.NOT_AUTHORIZED if self.conn.protocol_level == 5 else 0
        if publish.retain and not self.server.settings.retain_available:
            raise _Close(ReasonCode.RETAIN_NOT_SUPPORTED, "retained messages are disabled")
        overload = self.server.processor.overload
        if overload.memory_high and refused_when_overloaded(self.conn.protocol_level, publish.qos):
            overload.refused_publishes(self.ctx.client_id)
            self.server.processor.record_dropped(Drop.OVERLOADED)
            return ReasonCode.QUOTA_EXCEEDED
        try:
            result: PublishResult | BackendError = await self.server.publish(self.ctx, publish)
        except BackendError as exc:
            result = exc
        return self._ack_reason(publish, result, self.conn.protocol_level == 5)

    def _ack_reason(
        self, publish: Publish, result: PublishResult | BackendError, v5: bool
    ) -> int | None:
        """The reason code that answers a PUBLISH once publishing it gave `result`, or None
        when nothing answers it (QoS 0). A message the backend refused is counted as dropped;
        on MQTT 3.1.1, whose acks carry no error, it closes the connection (`_Close`), so
        that the client sends it again later."""
        if isinstance(result, BackendError):
            # A separated proxy's broker over its memory mark refuses as an overloaded node.
            overloaded = result.reason == Drop.OVERLOADED
            self.server.processor.record_dropped(Drop.OVERLOADED if overloaded else Drop.REFUSED)
            _refusals.warning(
                type(result).__name__,
                "%s: publish to %r failed: %s",
                self.ctx.client_id,
                publish.topic,
                result,
            )
            if publish.qos == 0:
                return None
            if not v5:
                raise _Close(None, f"publish failed: {result}")
            return backend_reason_code(result)
        if publish.qos == 0:
            return None
        if result.subscriptions == 0 and v5:
            return ReasonCode.NO_MATCHING_SUBSCRIBERS
        return ReasonCode.SUCCESS

    async def _on_pubrel(self, packet: Pubrel) -> None:
        assert self.state is not None
        known = packet.packet_id in self.state.inbound_qos2
        if known:
            self.state.inbound_qos2_mutable().discard(packet.packet_id)
            await self.server.sessions.save(self.state)
        reason = 0 if known else ReasonCode.PACKET_IDENTIFIER_NOT_FOUND
        self.out.add(self.conn.send_pubcomp(packet.packet_id, reason))  # pushed by the read loop

    # -- subscriptions ---------------------------------------------------------------------

    async def _on_subscribe(self, packet: Subscribe) -> None:
        assert self.subs is not None
        # Its size is known before: one code per filter. Closed (0x95) before the
        # subscriptions are made and saved, not after, when the client could not tell.
        self._check_ack_fits(Suback(packet.packet_id, (0,) * len(packet.subscriptions)))
        codes, retained = await self.subs.subscribe(
            packet, v5=self.conn.protocol_level == 5, bridge=self.bridge
        )
        self.out.write(self.conn.send(Suback(packet.packet_id, tuple(codes))))
        now = now_ms()
        traces = self._outflow().delivering(retained)
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
        for trace in traces:
            trace.sent()

    async def _on_unsubscribe(self, packet: Unsubscribe) -> None:
        assert self.subs is not None
        self._check_ack_fits(Unsuback(packet.packet_id, (0,) * len(packet.topic_filters)))
        codes = await self.subs.unsubscribe(packet.topic_filters)
        self.out.write(self.conn.send(Unsuback(packet.packet_id, tuple(codes))))

    def _check_ack_fits(self, ack: Suback | Unsuback) -> None:
        """PacketTooLarge (the connection closes with 0x95) when no acknowledgement of this
        size fits the client's Maximum Packet Size [MQTT-3.1.2-24]."""
        if not self.conn.fits(ack):
            name = type(ack).__name__.upper()
            raise PacketTooLarge(f"no {name} fits the client's Maximum Packet Size")

    # -- outbound messages -----------------------------------------------------------------


_Handler = Callable[[ClientHandler, Any], Awaitable[None]]

# What the read loop does with each packet type it does not handle inline.
_HANDLERS: dict[type, _Handler] = {
    Publish: ClientHandler._on_publish,
    Pubrec: ClientHandler._on_pubrec,
    Pubrel: ClientHandler._on_pubrel,
    Subscribe: ClientHandler._on_subscribe,
    Unsubscribe: ClientHandler._on_unsubscribe,
    Pingreq: ClientHandler._on_pingreq,
    Disconnect: ClientHandler._on_disconnect,
    Auth: ClientHandler._on_auth,
}


def _token(method: str | None, data: bytes | None) -> str | None:
    """The token an enhanced authentication exchange carries, if any."""
    if method is None or data is None:
        return None
    return data.decode("utf-8", errors="replace")
