"""`$SYS/broker/...`: the node describes itself to MQTT clients, as retained messages.

`$SYS` is this node's own (DESIGN.md section 4): a client sees the statistics of the node it is
connected to, in merged mode and through a separated proxy alike. So the values are retained on
this node only (`RetainedStore.keep_local`, never the shared retained table, where proxies would
overwrite each other's), and published through the processor, whose backend keeps `$SYS` topics
on the node: the merged node's broker is the node, and a proxy's `ClusterBackend` delivers them
in memory to its own consumers without sending them to the brokers
(`mop.backends.cluster.local_topics` says why this beats node-specific Pulsar topics).

Only changed values are republished, so an idle node does not churn anything.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

import trio

from mop.clock import now_ms
from mop.processor import BackendError, ClientContext
from mop.protocols.mqtt.mapping import publish_to_message
from mop.protocols.mqtt.packets import Publish

if TYPE_CHECKING:
    from mop.protocols.mqtt.serving.server import MqttServer

log = logging.getLogger("mop.mqtt")

SYS_CONTEXT = ClientContext(client_id="$SYS", protocol="mqtt", internal=True)
# Every topic of this node's own: retained values under it in the shared table were written by
# earlier versions (or by other proxies) and are not this node's.
SYS_FILTER: Final = "$SYS/#"


class SysPublisher:
    def __init__(self, server: MqttServer, version: str) -> None:
        self._server = server
        self._version = version
        self._last: dict[str, str] = {}

    def values(self) -> dict[str, str]:
        stats = self._server.processor.stats
        return {
            "$SYS/broker/version": self._version,
            "$SYS/broker/uptime": f"{int(stats.uptime)} seconds",
            "$SYS/broker/clients/connected": str(stats.connections),
            "$SYS/broker/clients/total": str(stats.connections + len(self._server.sessions)),
            "$SYS/broker/messages/received": str(stats.messages_received),
            "$SYS/broker/messages/sent": str(stats.messages_sent),
            "$SYS/broker/messages/dropped": str(stats.messages_dropped),
            "$SYS/broker/bytes/received": str(stats.bytes_received),
            "$SYS/broker/bytes/sent": str(stats.bytes_sent),
            "$SYS/broker/retained messages/count": str(len(self._server.retained)),
        }

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
