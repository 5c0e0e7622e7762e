"""`$SYS/broker/...`: the node describes itself to MQTT clients, as retained messages.

`$SYS` is this node's own (DESIGN.md section 4): a client sees the statistics of the node it is
connected to, in merged mode and through a separated proxy alike. So the values are retained on
this node only (`RetainedStore.keep_local`, never the shared retained table, where proxies would
overwrite each other's), and published through the processor, whose backend keeps `$SYS` topics
on the node: both backends deliver them in memory to the node's own consumers, without storing
them or sending them to a broker (`mop.backends.node_local` says why).

The topics and their values are `mop.protocols.mqtt.sys_tree`'s; this module gathers the
numbers (`SysPublisher.counters`) and publishes them. Only changed values are republished, so an
idle node does not churn anything.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final

import psutil
import trio

from mop.clock import now_ms
from mop.processor import BackendError, ClientContext
from mop.protocols.mqtt.mapping import publish_to_message
from mop.protocols.mqtt.packets import Publish
from mop.protocols.mqtt.session import SessionState
from mop.protocols.mqtt.sys_tree import SysCounters, SysTree

if TYPE_CHECKING:
    from mop.protocols.mqtt.serving.server import MqttServer

log = logging.getLogger("mop.mqtt")

SYS_CONTEXT = ClientContext(client_id="$SYS", protocol="mqtt", internal=True)
# Every topic of this node's own: retained values under it in the shared table were written by
# earlier versions (or by other proxies) and are not this node's.
SYS_FILTER: Final = "$SYS/#"


def resident_memory() -> int:
    """The bytes of memory the process holds now (its resident set size)."""
    return int(psutil.Process().memory_info().rss)


class SysPublisher:
    def __init__(
        self, server: MqttServer, version: str, memory: Callable[[], int] = resident_memory
    ) -> None:
        self._server = server
        self._tree = SysTree(version)
        self._memory = memory
        self._memory_peak = 0
        self._last: dict[str, str] = {}

    def counters(self) -> SysCounters:
        """What the node counts now. Sessions, subscriptions and messages in flight are those
        of the sessions this node holds: connected through it, or offline with their timers
        here (all of them on a merged node)."""
        server = self._server
        stats = server.processor.stats
        retained = server.retained
        subscriptions = in_flight = in_flight_bytes = 0
        for state in self._sessions():
            subscriptions += len(state.subscriptions)
            for entry in state.outbound.values():
                in_flight += 1
                message = entry.message or (entry.delivery.message if entry.delivery else None)
                in_flight_bytes += len(message.payload) if message is not None else 0
        memory = self._memory()
        self._memory_peak = max(self._memory_peak, memory)
        offline = len(server.sessions)
        return SysCounters(
            uptime=stats.uptime,
            clients_connected=stats.connections,
            clients_disconnected=offline,
            clients_maximum=stats.connections_peak,
            clients_expired=server.sessions.expired,
            connections=stats.connections_total,
            messages_received=stats.messages_received,
            messages_sent=stats.messages_sent,
            messages_dropped=stats.messages_dropped,
            bytes_received=stats.bytes_received,
            bytes_sent=stats.bytes_sent,
            payload_bytes_received=stats.payload_bytes_received,
            payload_bytes_sent=stats.payload_bytes_sent,
            # The deployment's retained messages: the node's own `$SYS` values are not counted
            # (an empty broker says 0, as its start-up log does).
            retained_count=retained.shared,
            stored_count=retained.shared + in_flight,
            stored_bytes=retained.shared_payload_bytes + in_flight_bytes,
            subscriptions=subscriptions,
            heap_current=memory,
            heap_maximum=self._memory_peak,
        )

    def _sessions(self) -> Iterator[SessionState]:
        for client in self._server.clients:
            if client.state is not None:
                yield client.state
        yield from self._server.sessions.offline()

    def values(self) -> dict[str, str]:
        return self._tree.values(self.counters(), trio.current_time())

    async def publish_changed(self) -> None:
        server = self._server
        for topic, value in self.values().items():
            if self._last.get(topic) == value:
                continue
            self._last[topic] = value
            publish = Publish(topic=topic, payload=value.encode(), retain=True)
            message = publish_to_message(publish, client_id=SYS_CONTEXT.client_id, now_ms=now_ms())
            await server.processor.publish(SYS_CONTEXT, server.canonical(topic), message)
            if server.settings.retain_available:
                server.retained.keep_local(topic, message)

    async def serve(
        self, interval: float, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        try:
            await self._server.retained.clear_shared(SYS_FILTER)
        except BackendError as exc:
            log.warning("$SYS values of earlier versions stay in the retained table: %s", exc)
        await self.publish_changed()
        task_status.started()
        while True:
            await trio.sleep(interval)
            await self.publish_changed()
