"""`$SYS/broker/...`: the node describes itself to MQTT clients, as retained messages.

Only changed values are republished, so an idle node does not churn the retained table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from mop.processor import ClientContext
from mop.protocols.mqtt.packets import Publish

if TYPE_CHECKING:
    from mop.protocols.mqtt.server import MqttServer

SYS_CONTEXT = ClientContext(client_id="$SYS", protocol="mqtt", internal=True)


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
        for topic, value in self.values().items():
            if self._last.get(topic) == value:
                continue
            self._last[topic] = value
            await self._server.publish(
                SYS_CONTEXT, Publish(topic=topic, payload=value.encode(), retain=True)
            )

    async def serve(
        self, interval: float, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        await self.publish_changed()
        task_status.started()
        while True:
            await trio.sleep(interval)
            await self.publish_changed()
