"""MQTT sessions that outlive connections: takeover, expiry, delayed wills, persistence.

A session is either attached to one live connection or offline with a deadline. Offline
sessions keep their subscriptions in the backend, so messages queue for them (bounded); at
expiry the subscriptions are deleted. Session state is written to the `mqtt-sessions` table so
that it is visible to every node and survives restarts.

The timers of offline sessions (delayed wills, expiry) run on one node of the deployment: the
holder of the processor role `ROLE` (a merged node itself; in separated mode one proxy at a
time). The holder adopts every session the table records as offline, whoever wrote it: all of
them when it gains the role, then each one another node writes; it drops a session once the
table records it as connected or deleted, and drops them all when it loses the role. Where a
connection ends, what cannot wait is done at once: a session without expiry ends there, and a
will without delay is published there (the session is written with the will cleared, so the
holder does not send it again). A node taking a session (a client connecting) writes it as
connected, which cancels the holder's timers for it; the holder learns of it through its table
reader, so a will falling due within that moment may still go out.

Whether an offline session has expired is decided by its deadline alone, wherever a client
comes back: a node taking a session past its deadline ends it there (with a will waiting for
the end) and starts a new one, whether or not the holder's timer has fired yet (after a
restart, or with the role moving between proxies), and a take waits for an end already under
way on its node. The timer only ends the sessions nobody came back for; where the role moves,
it fires `EXPIRY_GRACE` after the deadline, so that a node that took the session just before
its deadline has been heard of by then.

While a client is connected its session is recorded as connected through this node, with its
will, also a session without expiry that has a will: in separated mode, so that the holder can
end it should this proxy die (`node_liveness`: the sessions of a node silent for
`node_timeout` go offline from then on); in merged mode, so that a node restarting after a
crash sends the wills of the clients it lost.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Final

import trio

from mop.clock import now_ms
from mop.processor import BackendError, MessagingProcessor
from mop.protocols.introspection import SessionBusy
from mop.protocols.mqtt.packets import Will
from mop.protocols.mqtt.serving.node_liveness import NODES_TABLE, NodeLiveness, heartbeat_interval
from mop.protocols.mqtt.serving.timers import Callback, Timers
from mop.protocols.mqtt.session import (
    Outbound,
    SessionState,
    outbound_from_bytes,
    outbound_to_bytes,
)
from mop.topics import parse_shared

if TYPE_CHECKING:
    from mop.processor.backend import Role

log = logging.getLogger("mop.mqtt")

TABLE = "mqtt-sessions"
# QoS 2 deliveries in progress, one record per (client id, packet id): each step of a flow
# writes a few bytes instead of the whole session.
FLOWS_TABLE = "mqtt-qos2-flows"
# The role whose holder runs the timers of every offline session of the deployment.
ROLE: Final = "mqtt-session-timers"
# A timer due while the role is in doubt (its holder's broker connection is down right now)
# waits this long and looks again; losing the role cancels it.
IN_DOUBT_RETRY: Final = 1.0
# Where the role moves between nodes: how long after a session's deadline the holder ends it,
# so that a take on another node just before the deadline reaches the holder first.
EXPIRY_GRACE: Final = 1.0
PublishWill = Callable[[str, Will], Awaitable[None]]


class SessionRegistry:
    """The sessions of one node: taken by connections, released when they end, and (on the
    holder of `ROLE`) the offline ones of the whole deployment with their timers."""

    def __init__(
        self,
        processor: MessagingProcessor,
        timers: Timers,
        publish_will: PublishWill,
        *,
        node_timeout: float = 10.0,
        wall_clock: Callable[[], int] = now_ms,
    ) -> None:
        self._processor = processor
        # Milliseconds since the epoch: what session records hold, as all nodes see them.
        self._now = wall_clock
        self._node_timeout = node_timeout
        # This process, as named in the sessions connected through it.
        self.node_id = secrets.token_hex(8)
        self._liveness: NodeLiveness | None = None  # in separated mode
        # Sessions connected through this node, as recorded by `attach`.
        self._attached: dict[str, SessionState] = {}
        # On the holder, in separated mode: the node each session recorded as connected
        # through another node is connected through.
        self._elsewhere: dict[str, str] = {}
        self._table = processor.table(TABLE)
        self._flows = processor.table(FLOWS_TABLE)
        # Heartbeats, in separated mode; opened here with the others, so that a node loads
        # it before it starts.
        self._nodes = processor.table(NODES_TABLE)
        self._timers = timers
        self._publish_will = publish_will
        # Offline sessions with their timers armed: on the holder of the role only.
        self._offline: dict[str, SessionState] = {}
        # Sessions being ended on this node, by client id: a take waits for the end.
        self._ending: dict[str, trio.Event] = {}
        # Sessions whose connections are being let go of on this node (`release`).
        self._releasing: dict[str, trio.Event] = {}
        self._role: Role | None = None
        self._holding = False  # acting as the holder: between a gain and a loss
        self._nursery: trio.Nursery | None = None
        self._table.watch(self._changed_elsewhere)
        # Sessions this node ended at their expiry, since it started (`$SYS`).
        self.expired = 0

    def __len__(self) -> int:
        return len(self._offline)

    def offline(self) -> Iterator[SessionState]:
        """The offline sessions whose timers run on this node (none unless it holds `ROLE`)."""
        return iter(self._offline.values())

    @property
    def connected(self) -> int:
        """Sessions connected through this node."""
        return len(self._attached)

    def states(self) -> list[SessionState]:
        """The sessions this node holds: connected through it, and offline with their timers
        here."""
        return [*self._attached.values(), *self._offline.values()]

    @property
    def _role_moves(self) -> bool:
        """Whether the role can be held by other nodes (separated mode), which learn of
        sessions from the table only."""
        return self._role is None or not self._role.permanent

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Take part in the role until cancelled: adopt the offline sessions whenever this
        node gains it, drop them when it loses it. A node that holds the role at once (a
        merged node) has adopted them when this reports readiness."""
        role = self._role = await self._processor.hold_role(ROLE)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if not role.permanent:
                    liveness = self._liveness = NodeLiveness(
                        self._nodes,
                        self.node_id,
                        self._node_timeout,
                        self._declared_dead,
                    )
                    await nursery.start(liveness.beat)
                    nursery.start_soon(self._watch_nodes, liveness)
                if role.held:
                    await self._follow(await role.changed())
                task_status.started()
                while True:
                    await self._follow(await role.changed())
        finally:
            self._nursery = None
            self._lose()
            with trio.CancelScope(shield=True):
                await role.release()

    async def _follow(self, held: bool) -> None:
        if held:
            count = await self._gain()
            log.info("session timers run on this node: %d offline sessions", count)
        elif self._holding:
            self._lose()
            log.info("session timers no longer run on this node")

    async def _gain(self) -> int:
        """Adopt every session the table records as offline and arm its timers; returns how
        many there are.

        On a node that is the whole deployment (`Role.permanent`), a session recorded as
        connected lost its connection when the node stopped: its expiry and its will delay
        count from now, and one that expired while the node was down ends at once. Elsewhere
        such a session is connected through another node, which owns it.
        """
        assert self._role is not None
        permanent = self._role.permanent
        now = self._now()
        # No waiting from reading the table to arming: writes reported meanwhile would be lost.
        for client_id, data in self._table.items():
            state = _parsed(client_id, data)
            if state is None:
                continue
            if state.disconnected_at is None:
                if not permanent:
                    node = self._other_node(state)
                    if node is not None:
                        self._elsewhere[client_id] = node
                    continue
                state.disconnected_at = now
            self._offline[client_id] = state
        for key, data in self._flows.items():
            client_id, packet_id = _split_flow_key(key)
            owner = self._offline.get(client_id)
            if owner is not None:
                owner.outbound[packet_id] = outbound_from_bytes(packet_id, data)
        self._holding = True
        if self._liveness is not None:
            self._liveness.start_watching()
        for state in list(self._offline.values()):
            self._arm(state)
        if permanent:
            await self._drop_orphan_flows()
        return len(self._offline)

    async def _drop_orphan_flows(self) -> None:
        """Delete QoS 2 flows whose session is gone (its end was cut short by a crash). Only
        a node that is the whole deployment does it: elsewhere the flows table may show a
        new session's flow before the sessions table shows the session."""
        for key, _ in self._flows.items():
            client_id, _packet_id = _split_flow_key(key)
            if self._table.get(client_id) is None:
                await self._flows.put(key, None)

    def _lose(self) -> None:
        self._holding = False
        for client_id in self._offline:
            self._disarm(client_id)
        self._offline.clear()
        self._elsewhere.clear()

    def _changed_elsewhere(self, client_id: str, value: bytes | None) -> None:
        """Another node wrote a session: the holder follows (adopts one written as offline,
        drops one written as connected or deleted); other nodes keep no sessions."""
        if not self._holding:
            return
        self._disarm(client_id)
        self._offline.pop(client_id, None)
        self._elsewhere.pop(client_id, None)
        state = None if value is None else _parsed(client_id, value)
        if state is None:
            return
        if state.disconnected_at is None:
            node = self._other_node(state)
            if node is not None:
                self._elsewhere[client_id] = node
                if self._liveness is not None:
                    self._liveness.saw(node)
            return
        self._offline[client_id] = state  # its QoS 2 flows: `take` and `_end` read them
        self._arm(state)

    def _other_node(self, state: SessionState) -> str | None:
        """The node a session recorded as connected is connected through, unless it is this
        one (or not named)."""
        return state.node if state.node != self.node_id else None

    async def take(self, client_id: str, *, clean_start: bool) -> tuple[SessionState, bool]:
        """The session for a connecting client, and whether it existed (session present).

        A new connection cancels a will still waiting for its delay or for the end of the
        session (MQTT 5 3.1.3.2.2), also when it starts clean and so ends the old session. A
        session past its deadline has ended, whether or not its timer has run: it is ended
        here, with a will that was waiting for the end, and a new one starts.
        """
        await self._end_finished(client_id)
        self._disarm(client_id)
        state = self._offline.pop(client_id, None)
        if state is None or self._role_moves:
            # Left offline through any node, the table has it all: the lease caught it up for
            # us. (The holder's copy may have been adopted before the flows table showed the
            # session's last QoS 2 steps.)
            state = self._stored(client_id)
        if state is not None and state.expired(self._now()):
            log.info("session %r expired", client_id)
            self.expired += 1
            await self._end(state)
            state = None
        if state is not None:
            state.will = None
            if clean_start:
                await self._end(state)
                state = None
            elif self._role_moves and state.disconnected_at is not None:
                # Recorded as connected, so that the holder of the role (another node, or
                # whichever node holds it next) cancels this session's timers. `state` itself
                # stays as stored, for `put_back`.
                taken = dataclasses.replace(state, disconnected_at=None, node=self.node_id)
                await self._table.put(client_id, taken.to_bytes())
        if state is None:
            return SessionState(client_id=client_id), False
        return state, True

    def _stored(self, client_id: str) -> SessionState | None:
        """The session as the table has it, with its QoS 2 flows, or None."""
        data = self._table.get(client_id)
        if data is None:
            return None
        state = _parsed(client_id, data)
        return None if state is None else self._with_flows(state)

    def _with_flows(self, state: SessionState) -> SessionState:
        """`state` with its QoS 2 flows in progress, as the flows table has them."""
        for key, flow in self._flows.items():
            owner, packet_id = _split_flow_key(key)
            if owner == state.client_id:
                state.outbound[packet_id] = outbound_from_bytes(packet_id, flow)
        return state

    async def _end_finished(self, client_id: str) -> None:
        """Wait until a session being ended on this node (by its timer, say) has ended. No
        end of `client_id` is under way when this returns, until the caller next waits."""
        while (ending := self._ending.get(client_id)) is not None:
            await ending.wait()

    def offline_here(self) -> Mapping[str, SessionState]:
        """The offline sessions whose timers run on this node (on the holder of `ROLE`, every
        offline session of the deployment; elsewhere none), by client id."""
        return self._offline

    async def discard(self, client_id: str) -> bool:
        """End an offline session now, as its expiry would (a will waiting for the end goes
        out); False when there is none. SessionBusy when the session is recorded as connected
        through a node (not this one's clients: their connections end their sessions)."""
        while (releasing := self._releasing.get(client_id)) is not None:
            await releasing.wait()
        await self._end_finished(client_id)
        state = self._offline.get(client_id)
        if state is None or self._role_moves:
            stored = self._stored(client_id)
            if stored is not None and stored.disconnected_at is None and state is None:
                where = "closing here" if client_id in self._attached else "through another node"
                raise SessionBusy(f"session {client_id!r} is connected ({where})")
            state = stored if stored is not None else state
        if state is None:
            return False
        self._disarm(client_id)
        self._offline.pop(client_id, None)
        log.info("session %r ended on request", client_id)
        await self._end(state)
        return True

    def _disarm(self, client_id: str) -> None:
        self._timers.cancel(f"expire:{client_id}")
        self._timers.cancel(f"will:{client_id}")

    async def attach(self, state: SessionState) -> None:
        """Record a session taken by a connection as connected through this node, with the
        connection's will: a session with expiry, and also one without that has a will (its
        record goes when it ends)."""
        state.disconnected_at = None
        state.node = self.node_id
        self._attached[state.client_id] = state
        if _recorded_while_connected(state):
            try:
                await self._table.put(state.client_id, state.to_bytes())
            except BaseException:
                self._attached.pop(state.client_id, None)
                raise

    def _declared_dead(self) -> None:
        """Another node took this one for dead (it heard no heartbeat for too long): record
        the sessions connected here as connected again, so that the holder stops their
        timers."""
        log.warning(
            "node %s was taken for dead; recording its %d connected sessions again",
            self.node_id,
            len(self._attached),
        )
        if self._nursery is not None:
            self._nursery.start_soon(self._record_attached_again)

    async def _record_attached_again(self) -> None:
        """Write every attached session again, retrying those that fail until they are
        written or have ended."""
        pending = [s for s in self._attached.values() if _recorded_while_connected(s)]
        while pending:
            failed = []
            for state in pending:
                if self._attached.get(state.client_id) is not state:
                    continue  # ended meanwhile
                try:
                    await self._table.put(state.client_id, state.to_bytes())
                except BackendError as exc:
                    log.debug("session %r not recorded again: %s", state.client_id, exc)
                    failed.append(state)
            if failed:
                log.warning("%d sessions not recorded again yet; retrying", len(failed))
                await trio.sleep(heartbeat_interval(self._node_timeout))
            pending = failed

    async def _watch_nodes(self, liveness: NodeLiveness) -> None:
        """On the holder: take the sessions of silent nodes offline, and forget the nodes."""
        while True:
            await trio.sleep(heartbeat_interval(liveness.timeout))
            if not self._holding or self._role is None or not self._role.held:
                continue
            for node_id in liveness.silent(self._elsewhere.values()):
                self._node_gone(node_id)
                await liveness.forget(node_id)

    def _node_gone(self, node_id: str) -> None:
        """Take the sessions recorded as connected through `node_id` offline from now: arm
        their wills and expiry as if their connections had ended now (the table is not
        written: the node's clients reconnecting elsewhere record their sessions anew)."""
        now = self._now()
        gone = [client_id for client_id, node in self._elsewhere.items() if node == node_id]
        offline = 0
        for client_id in gone:
            del self._elsewhere[client_id]
            state = self._stored(client_id)
            if state is None or state.disconnected_at is not None or state.node != node_id:
                continue  # ended, or taken through another node, since it was noted
            state.disconnected_at = now
            state.node = None
            self._offline[client_id] = state
            self._arm(state)
            offline += 1
        if offline:
            log.warning(
                "node %s sent no heartbeat for %.1f s: %d sessions connected through it are "
                "offline from now",
                node_id,
                self._node_timeout,
                offline,
            )

    def put_back(self, state: SessionState) -> None:
        """Return a session taken by a connection that could not open: the holder re-arms
        its timers, and where `take` recorded it as connected it is written back as offline
        (in the background: this is called on the way out of a failed connect)."""
        self._detach(state)
        if state.disconnected_at is None:
            return  # it was not offline (a record of a connection that never ended)
        if self._holding:
            self._offline[state.client_id] = state
            self._arm(state)
        if self._role_moves and self._nursery is not None:
            self._nursery.start_soon(self._write_back, state)

    async def _write_back(self, state: SessionState) -> None:
        try:
            await self.save(state)
        except BackendError as exc:
            log.error("session %r could not be written back as offline: %s", state.client_id, exc)

    async def release(self, state: SessionState, *, will: Will | None) -> None:
        """The connection of `state` is gone: keep the session or end it, and handle the will
        (a will without delay goes out from here, at once). `discard` waits for it."""
        client_id = state.client_id
        released = self._releasing[client_id] = trio.Event()
        try:
            await self._release(state, will)
        finally:
            if self._releasing.get(client_id) is released:
                del self._releasing[client_id]
            released.set()

    async def _release(self, state: SessionState, will: Will | None) -> None:
        self._detach(state)
        state.disconnected_at = self._now()
        if state.expiry_interval == 0:
            state.will = will
            await self._end(state)
            return
        at_once = will is not None and not will.properties.will_delay_interval
        state.will = None if at_once else will
        await self.save(state)
        if self._holding:
            self._offline[state.client_id] = state
            self._arm(state)
        if at_once:
            assert will is not None
            await self._publish_will(state.client_id, will)

    def _detach(self, state: SessionState) -> None:
        if self._attached.get(state.client_id) is state:
            del self._attached[state.client_id]

    async def save(self, state: SessionState) -> None:
        if state.expiry_interval:
            await self._table.put(state.client_id, state.to_bytes())

    async def record_flow(self, state: SessionState, entry: Outbound) -> None:
        """Make a QoS 2 delivery's packet id (and whether PUBREC came) durable."""
        if state.expiry_interval and entry.message_id is not None:
            await self._flows.put(
                _flow_key(state.client_id, entry.packet_id), outbound_to_bytes(entry)
            )

    async def forget_flow(self, state: SessionState, packet_id: int) -> None:
        key = _flow_key(state.client_id, packet_id)
        if self._flows.get(key) is not None:
            await self._flows.put(key, None)

    def _arm(self, state: SessionState) -> None:
        """Schedule the will (after its delay, unless the session ends first) and the end of
        the session (at its deadline; `EXPIRY_GRACE` later where the role moves)."""
        client_id = state.client_id
        now = self._now()
        expires_at = state.expires_at
        if state.will is not None:
            assert state.disconnected_at is not None
            delay = state.will.properties.will_delay_interval or 0
            will_at = state.disconnected_at + delay * 1000
            if expires_at is None or will_at < expires_at:
                key = f"will:{client_id}"
                fire = self._while_held(key, self._delayed_will(client_id))
                self._timers.schedule(key, (will_at - now) / 1000, fire)
            # otherwise the will goes out when the session ends (see _end)
        if expires_at is not None:
            key = f"expire:{client_id}"
            expire = self._while_held(key, self._expiry(client_id))
            grace = EXPIRY_GRACE if self._role_moves else 0.0
            self._timers.schedule(key, (expires_at - now) / 1000 + grace, expire)

    def _while_held(self, key: str, action: Callback) -> Callback:
        """`action`, run only while this node holds the role: while the role is in doubt it
        waits (losing the role cancels it with the other timers)."""

        async def run() -> None:
            assert self._role is not None
            if not self._holding:
                return
            if not self._role.held:
                self._timers.schedule(key, IN_DOUBT_RETRY, run)
                return
            await action()

        return run

    async def _end(self, state: SessionState) -> None:
        """Delete a session: its subscriptions in the backend, its QoS 2 flows, its table
        entry; then publish a will that was waiting for the end of the session. A take of the
        same client id waits until it is done (`_end_finished`)."""
        client_id = state.client_id
        await self._end_finished(client_id)
        ending = self._ending[client_id] = trio.Event()
        try:
            await self._delete(state)
        finally:
            del self._ending[client_id]
            ending.set()

    async def _delete(self, state: SessionState) -> None:
        client_id = state.client_id
        will, state.will = state.will, None
        self._timers.cancel(f"will:{client_id}")
        # The client is the member of its own subscription too (`SubscriptionSpec.member`):
        # without it the subscription, with its unacknowledged messages, would outlive the
        # session and come back to the next one with the same client id.
        await self._delete_subscription(client_id, client_id)
        for topic_filter in state.subscriptions:
            if parse_shared(topic_filter).group is not None:
                # Shared subscriptions are named after their `$share/...` filter.
                await self._delete_subscription(topic_filter, client_id)
        for packet_id in self._with_flows(state).outbound:
            await self.forget_flow(state, packet_id)
        if self._table.get(client_id) is not None:
            await self._table.put(client_id, None)
        if will is not None:
            await self._publish_will(client_id, will)

    async def _delete_subscription(self, name: str, client_id: str) -> None:
        """Delete the client's member of subscription `name`. A consumer still attached for it
        (a connection that could not leave its subscriptions when it closed) keeps it: the
        session ends all the same, rather than a clean start being refused for good."""
        try:
            await self._processor.delete_subscription(name, member=client_id)
        except BackendError as exc:
            if exc.reason != "consumer_busy":
                raise
            log.warning(
                "session %r: subscription %r is left in place: a consumer is still attached (%s)",
                client_id,
                name,
                exc,
            )

    def _expiry(self, client_id: str) -> Callback:
        async def expire() -> None:
            state = self._offline.pop(client_id, None)
            if state is not None:
                log.info("session %r expired", client_id)
                self.expired += 1
                await self._end(state)

        return expire

    def _delayed_will(self, client_id: str) -> Callback:
        async def fire() -> None:
            state = self._offline.get(client_id)
            if state is None or state.will is None:
                return
            will, state.will = state.will, None
            await self.save(state)
            await self._publish_will(client_id, will)

        return fire


def _recorded_while_connected(state: SessionState) -> bool:
    """Whether a session is in the table while its client is connected: one that outlives
    the connection, or one whose will must go out should this node die."""
    return bool(state.expiry_interval) or state.will is not None


def _parsed(client_id: str, data: bytes) -> SessionState | None:
    try:
        return SessionState.from_bytes(data)
    except (ValueError, KeyError, TypeError):
        log.error("session %r in %s is unreadable; ignoring it", client_id, TABLE)
        return None


def _flow_key(client_id: str, packet_id: int) -> str:
    # The packet id goes last: client ids may contain "/", packet ids never do.
    return f"{client_id}/{packet_id}"


def _split_flow_key(key: str) -> tuple[str, int]:
    client_id, _, packet_id = key.rpartition("/")
    return client_id, int(packet_id)
