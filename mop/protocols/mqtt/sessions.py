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
from mop.protocols.mqtt.session import SessionState
from mop.protocols.mqtt.timers import Timers
from mop.topics import parse_shared

log = logging.getLogger("mop.mqtt")

TABLE = "mqtt-sessions"
PublishWill = Callable[[str, Will], Awaitable[None]]


def now_ms() -> int:
    return int(time.time() * 1000)


class SessionRegistry:
    def __init__(
        self, processor: MessagingProcessor, timers: Timers, publish_will: PublishWill
    ) -> None:
        self._processor = processor
        self._table = processor.table(TABLE)
        self._timers = timers
        self._publish_will = publish_will
        self._offline: dict[str, SessionState] = {}
        self._wills: dict[str, Will] = {}

    def __len__(self) -> int:
        return len(self._offline)

    def recover(self) -> int:
        """Load offline sessions from the table and schedule their ends; returns the count."""
        for client_id, data in self._table.items():
            try:
                state = SessionState.from_bytes(data)
            except (ValueError, KeyError, TypeError):
                log.error("session %r in %s is unreadable; dropping it", client_id, TABLE)
                continue
            self._offline[client_id] = state
            deadline = state.expires_at if state.expires_at is not None else now_ms()
            self._timers.schedule(
                f"expire:{client_id}", (deadline - now_ms()) / 1000, self._expiry(client_id)
            )
        return len(self._offline)

    async def take(self, client_id: str, *, clean_start: bool) -> tuple[SessionState, bool]:
        """The session for a connecting client, and whether it existed (session present).

        A reconnect before the will delay elapses cancels the delayed will (MQTT 5 3.1.3.2.2).
        """
        self._timers.cancel(f"expire:{client_id}")
        # A new connection cancels a waiting will, whether it waits for its delay (a timer) or
        # for the end of the session (no timer).
        self._timers.cancel(f"will:{client_id}")
        self._wills.pop(client_id, None)
        state = self._offline.pop(client_id, None)
        if state is not None and clean_start:
            await self._end(state)
            state = None
        if state is None:
            return SessionState(client_id=client_id), False
        state.expires_at = None
        return state, True

    async def release(self, state: SessionState, *, will: Will | None) -> None:
        """The connection of `state` is gone; keep the session or end it, and handle the will."""
        client_id = state.client_id
        expiry = state.expiry_interval
        if will is not None:
            delay = will.properties.will_delay_interval or 0
            if delay and expiry and delay < expiry:
                self._wills[client_id] = will
                self._timers.schedule(f"will:{client_id}", delay, self._delayed_will(client_id))
            elif delay and expiry:
                self._wills[client_id] = will  # published when the session ends
            else:
                await self._publish_will(client_id, will)
        if expiry == 0:
            await self._end(state)
            return
        state.expires_at = now_ms() + expiry * 1000 if expiry != 0xFFFFFFFF else None
        self._offline[client_id] = state
        await self.save(state)
        if state.expires_at is not None:
            self._timers.schedule(f"expire:{client_id}", expiry, self._expiry(client_id))

    async def save(self, state: SessionState) -> None:
        if state.expiry_interval:
            await self._table.put(state.client_id, state.to_bytes())

    async def _end(self, state: SessionState) -> None:
        """Delete a session: its subscriptions in the backend, its table entry, a pending will."""
        client_id = state.client_id
        will = self._wills.pop(client_id, None)
        self._timers.cancel(f"will:{client_id}")
        await self._processor.delete_subscription(client_id)
        for topic_filter in state.subscriptions:
            if parse_shared(topic_filter).group is not None:
                # Shared subscriptions are named after their `$share/...` filter.
                await self._processor.delete_subscription(topic_filter, member=client_id)
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
            will = self._wills.pop(client_id, None)
            if will is not None:
                await self._publish_will(client_id, will)

        return fire
