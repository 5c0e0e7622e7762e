"""Clients connecting and disconnecting: a log line each, and, with `mqtt.sys_events`, a `$SYS`
message each under EMQX's topics (`sys_tree.event_topic`).

The lines go to the `mop.mqtt.connections` logger at INFO, at most `LINES_PER_SECOND` a second
(a storm of connections costs a bounded number of lines; the next line says how many were held
back). The messages are this node's own, like the rest of `$SYS`: the connection's task only
queues them, and `serve` publishes them through the processor in order, in batches, not
retained, to whoever subscribed to them and may read `$SYS` (the ACL applies as to any read).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from typing import Final

import trio

from mop.clock import now_ms
from mop.counters import Drop
from mop.log_limit import LimitedLog, LineBudget
from mop.message import Message
from mop.processor import BackendError, ClientContext, MessagingProcessor
from mop.protocols.mqtt.mapping import publish_to_message
from mop.protocols.mqtt.packets import Properties, Publish
from mop.protocols.mqtt.serving.sys_topics import SYS_CONTEXT
from mop.protocols.mqtt.sys_tree import (
    ClientConnected,
    ClientDisconnected,
    ClientEvent,
    event_payload,
    event_topic,
)
from mop.transport import ConnectionInfo

log = logging.getLogger("mop.mqtt.connections")
_failures = LimitedLog(logging.getLogger("mop.mqtt"))

LINES_PER_SECOND: Final = 100
# Events waiting to be published; beyond this (a storm the backend cannot keep up with) new
# ones are dropped, and counted in `$SYS/broker/messages/dropped`.
QUEUE_SIZE: Final = 10_000
_BATCH: Final = 256
# The longest topic name an MQTT packet carries, in bytes.
_MAX_TOPIC: Final = 0xFFFF
_PROPERTIES: Final = Properties(content_type="application/json", payload_format_indicator=1)


def default_node_name() -> str:
    """The node's name in event topics unless `mqtt.sys_node_name` gives one: `mop@{host}`."""
    return f"mop@{socket.gethostname()}"


class ClientEvents:
    """The connect and disconnect lines and events of one node's MQTT clients; `publishes`
    says whether events are published (`serve` must run then)."""

    def __init__(
        self,
        processor: MessagingProcessor,
        canonical: Callable[[str], str],
        *,
        publishes: bool,
        node: str,
    ) -> None:
        self._processor = processor
        self._canonical = canonical
        self.publishes = publishes
        self.node = node
        self._lines = LineBudget(LINES_PER_SECOND)
        # Lines the budget held back before the line being written, which says so.
        self._held = 0
        self._send, self._receive = trio.open_memory_channel[tuple[str, Message]](QUEUE_SIZE)

    def connected(
        self,
        ctx: ClientContext,
        info: ConnectionInfo,
        *,
        protocol_level: int,
        keep_alive: int,
        clean_start: bool,
        expiry_interval: int,
    ) -> None:
        """A client's CONNECT was accepted."""
        if self._admit_line():
            log.info(
                "%s: %r connected (level %d, keep alive %d s, clean start %s, user %r)%s",
                ctx.peer,
                ctx.client_id,
                protocol_level,
                keep_alive,
                clean_start,
                ctx.username,
                self._held_back(),
                extra={
                    "event": "client.connected",
                    "client_id": ctx.client_id,
                    "peer": ctx.peer,
                    "username": ctx.username,
                    "protocol_level": protocol_level,
                    "keep_alive": keep_alive,
                    "clean_start": clean_start,
                },
            )
        if self.publishes:
            self._queue(
                ClientConnected(
                    client_id=ctx.client_id,
                    username=ctx.username,
                    address=info.peer[0],
                    port=info.local[1],
                    protocol_level=protocol_level,
                    keep_alive=keep_alive,
                    clean_start=clean_start,
                    expiry_interval=expiry_interval,
                    at_ms=now_ms(),
                )
            )

    def disconnected(
        self, ctx: ClientContext, info: ConnectionInfo, *, protocol_level: int, reason: str
    ) -> None:
        """The connection of a client that was connected ended, for `reason`
        (`sys_tree.disconnect_reason`)."""
        if self._admit_line():
            log.info(
                "%s: %r disconnected (%s)%s",
                ctx.peer,
                ctx.client_id,
                reason,
                self._held_back(),
                extra={
                    "event": "client.disconnected",
                    "client_id": ctx.client_id,
                    "peer": ctx.peer,
                    "username": ctx.username,
                    "reason": reason,
                },
            )
        if self.publishes:
            self._queue(
                ClientDisconnected(
                    client_id=ctx.client_id,
                    username=ctx.username,
                    address=info.peer[0],
                    port=info.local[1],
                    protocol_level=protocol_level,
                    reason=reason,
                    at_ms=now_ms(),
                )
            )

    def _admit_line(self) -> bool:
        if not log.isEnabledFor(logging.INFO):
            return False
        held = self._lines.admit()
        if held is None:
            return False
        self._held = held
        return True

    def _held_back(self) -> str:
        if not self._held:
            return ""
        return f" ({self._held} more connection lines held back: over {LINES_PER_SECOND}/s)"

    def _queue(self, event: ClientEvent) -> None:
        topic = event_topic(self.node, event)
        if len(topic.encode()) > _MAX_TOPIC:
            # A long client id whose "/"s took three bytes each: no PUBLISH carries the topic.
            self._processor.record_dropped()
            _failures.warning(
                "client-events-topic", "client event not published: its topic is too long"
            )
            return
        publish = Publish(topic, event_payload(event), properties=_PROPERTIES)
        message = publish_to_message(publish, client_id=SYS_CONTEXT.client_id, now_ms=event.at_ms)
        try:
            self._send.send_nowait((self._canonical(topic), message))
        except (trio.WouldBlock, trio.BrokenResourceError):  # too many, or no longer served
            self._processor.record_dropped(Drop.QUEUE_FULL)
            _failures.warning(
                "client-events", "client event %s not published: too many waiting", topic
            )

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Publish the queued events until cancelled, in order, as many at once as wait."""
        task_status.started()
        async for first in self._receive:
            batch = [first]
            while len(batch) < _BATCH:
                try:
                    batch.append(self._receive.receive_nowait())
                except trio.WouldBlock:
                    break
            try:
                results = await self._processor.publish_batch(SYS_CONTEXT, batch)
            except BackendError as exc:
                results = [exc] * len(batch)
            for result in results:
                if isinstance(result, BackendError):
                    self._processor.record_dropped(Drop.REFUSED)
                    _failures.warning(
                        "client-events-failed", "client event not published: %s", result
                    )
