"""MQTT sessions that outlive connections: takeover, expiry, delayed wills, persistence.

A session is either attached to one live connection or offline with a deadline. Offline
sessions keep their subscriptions in the backend, so messages queue for them (bounded); at
expiry the subscriptions are deleted. Session state is written to the `mqtt-sessions` table so
that it is visible to every node and survives restarts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from mop.processor import MessagingProcessor
from mop.protocols.mqtt.packets import Will
from mop.protocols.mqtt.session import (
    Outbound,
    SessionState,
    outbound_from_bytes,
    outbound_to_bytes,
)
from mop.protocols.mqtt.timers import Timers
from mop.topics import parse_shared

log = logging.getLogger("mop.mqtt")

TABLE = "mqtt-sessions"
# QoS 2 deliveries in progress, one record per (client id, packet id): each step of a flow
# writes a few bytes instead of the whole session.
FLOWS_TABLE = "mqtt-qos2-flows"
PublishWill = Callable[[str, Will], Awaitable[None]]


def now_ms() -> int:
    return int(time.time() * 1000)


class SessionRegistry:
    def __init__(
        self, processor: MessagingProcessor, timers: Timers, publish_will: PublishWill
    ) -> None:
        self._processor = processor
        self._table = processor.table(TABLE)
        self._flows = processor.table(FLOWS_TABLE)
        self._timers = timers
        self._publish_will = publish_will
        self._offline: dict[str, SessionState] = {}
        # In a separated deployment other proxies write sessions too: a session written
        # elsewhere is owned there now (attached to a connection, or offline with its timers
        # armed there), so this node lets go of its copy and of its timers.
        self._table.watch(self._changed_elsewhere)

    def __len__(self) -> int:
        return len(self._offline)

    async def recover(self) -> int:
        """Load sessions from the table and arm their timers; returns how many there are.

        A session that was connected when the node stopped lost its connection then: its
        expiry and its will delay count from now. One that expired while the node was down
        ends at once.
        """
        now = now_ms()
        for client_id, data in self._table.items():
            try:
                state = SessionState.from_bytes(data)
            except (ValueError, KeyError, TypeError):
                log.error("session %r in %s is unreadable; dropping it", client_id, TABLE)
                continue
            if state.disconnected_at is None:
                state.disconnected_at = now
            self._offline[client_id] = state
        for key, data in list(self._flows.items()):
            client_id, packet_id = _split_flow_key(key)
            owner = self._offline.get(client_id)
            if owner is None:
                await self._flows.put(key, None)  # its session is gone
                continue
            owner.outbound[packet_id] = outbound_from_bytes(packet_id, data)
        for state in self._offline.values():
            self._arm(state)
        return len(self._offline)

    async def take(self, client_id: str, *, clean_start: bool) -> tuple[SessionState, bool]:
        """The session for a connecting client, and whether it existed (session present).

        A new connection cancels a will still waiting for its delay or for the end of the
        session (MQTT 5 3.1.3.2.2), also when it starts clean and so ends the old session.
        """
        self._disarm(client_id)
        state = self._offline.pop(client_id, None)
        if state is None:
            # Left offline through another node (the lease caught the table up for us).
            state = self._stored(client_id)
        if state is not None:
            state.will = None
            if clean_start:
                await self._end(state)
                state = None
        if state is None:
            return SessionState(client_id=client_id), False
        return state, True

    def _stored(self, client_id: str) -> SessionState | None:
        """The session as the table has it, with its QoS 2 flows, or None."""
        data = self._table.get(client_id)
        if data is None:
            return None
        try:
            state = SessionState.from_bytes(data)
        except (ValueError, KeyError, TypeError):
            log.error("session %r in %s is unreadable; starting a new one", client_id, TABLE)
            return None
        for key, flow in self._flows.items():
            owner, packet_id = _split_flow_key(key)
            if owner == client_id:
                state.outbound[packet_id] = outbound_from_bytes(packet_id, flow)
        return state

    def _changed_elsewhere(self, client_id: str, value: bytes | None) -> None:
        if self._offline.pop(client_id, None) is not None:
            self._disarm(client_id)

    def _disarm(self, client_id: str) -> None:
        self._timers.cancel(f"expire:{client_id}")
        self._timers.cancel(f"will:{client_id}")

    def put_back(self, state: SessionState) -> None:
        """Return a session taken by a connection that could not open (its stored state is
        unchanged), re-arming its timers."""
        self._offline[state.client_id] = state
        self._arm(state)

    async def release(self, state: SessionState, *, will: Will | None) -> None:
        """The connection of `state` is gone: keep the session or end it, and handle the will."""
        state.disconnected_at = now_ms()
        state.will = will
        if state.expiry_interval == 0:
            await self._end(state)
            return
        self._offline[state.client_id] = state
        await self.save(state)
        self._arm(state)

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
        """Schedule the will (after its delay, unless the session ends first) and the expiry."""
        client_id = state.client_id
        now = now_ms()
        expires_at = state.expires_at
        if state.will is not None:
            assert state.disconnected_at is not None
            delay = state.will.properties.will_delay_interval or 0
            will_at = state.disconnected_at + delay * 1000
            if expires_at is None or will_at < expires_at:
                fire = self._delayed_will(client_id)
                self._timers.schedule(f"will:{client_id}", (will_at - now) / 1000, fire)
            # otherwise the will goes out when the session ends (see _end)
        if expires_at is not None:
            expire = self._expiry(client_id)
            self._timers.schedule(f"expire:{client_id}", (expires_at - now) / 1000, expire)

    async def _end(self, state: SessionState) -> None:
        """Delete a session: its subscriptions in the backend, its table entry; then publish a
        will that was waiting for the end of the session."""
        client_id = state.client_id
        will, state.will = state.will, None
        self._timers.cancel(f"will:{client_id}")
        await self._processor.delete_subscription(client_id)
        for topic_filter in state.subscriptions:
            if parse_shared(topic_filter).group is not None:
                # Shared subscriptions are named after their `$share/...` filter.
                await self._processor.delete_subscription(topic_filter, member=client_id)
        for packet_id in state.outbound:
            await self.forget_flow(state, packet_id)
        if self._table.get(client_id) is not None:
            await self._table.put(client_id, None)
        if will is not None:
            await self._publish_will(client_id, will)

    def _expiry(self, client_id: str) -> Callable[[], Awaitable[None]]:
        async def expire() -> None:
            state = self._offline.pop(client_id, None)
            if state is not None:
                log.info("session %r expired", client_id)
                await self._end(state)

        return expire

    def _delayed_will(self, client_id: str) -> Callable[[], Awaitable[None]]:
        async def fire() -> None:
            state = self._offline.get(client_id)
            if state is None or state.will is None:
                return
            will, state.will = state.will, None
            await self.save(state)
            await self._publish_will(client_id, will)

        return fire


def _flow_key(client_id: str, packet_id: int) -> str:
    # The packet id goes last: client ids may contain "/", packet ids never do.
    return f"{client_id}/{packet_id}"


def _split_flow_key(key: str) -> tuple[str, int]:
    client_id, _, packet_id = key.rpartition("/")
    return client_id, int(packet_id)
