"""What the MQTT adapter shares between connections: sessions, retained messages, topic names.

`MqttServer.serve` runs the background work (session timers, `$SYS`); `handle_connection`
serves one client. Everything goes through the MessagingProcessor, never a backend directly.
"""

from __future__ import annotations

import dataclasses
import logging
from functools import lru_cache

import trio

from mop.processor import ClientContext, MessagingProcessor, PublishResult
from mop.protocols.mqtt.connection import ConnectionLimits
from mop.protocols.mqtt.mapping import publish_to_message
from mop.protocols.mqtt.packets import Publish, Will
from mop.protocols.mqtt.retained import RetainedStore
from mop.protocols.mqtt.sessions import SessionRegistry, now_ms
from mop.protocols.mqtt.sys_topics import SysPublisher
from mop.protocols.mqtt.timers import Timers
from mop.settings import MqttSettings, Settings
from mop.topic_names import mqtt_to_pulsar, pulsar_to_mqtt
from mop.topics import TopicError, validate_topic_name
from mop.transport import ConnectionInfo

log = logging.getLogger("mop.mqtt")

VERSION = "mop 0.1.0"  # kept in step with mop.__version__ (pyproject)


class MqttServer:
    def __init__(self, settings: Settings, processor: MessagingProcessor) -> None:
        self.settings: MqttSettings = settings.mqtt
        self.processor = processor
        self.limits = ConnectionLimits(
            max_packet_size=self.settings.max_packet_size,
            receive_maximum=self.settings.max_inflight,
            topic_alias_maximum=self.settings.topic_alias_maximum,
            max_topic_length=self.settings.max_topic_length,
            max_topic_levels=self.settings.max_topic_levels,
        )
        tenant, namespace = settings.default_tenant, settings.default_namespace
        # Topic names repeat endlessly on the hot path: map each one once.
        self.canonical = lru_cache(maxsize=65536)(
            lambda topic: mqtt_to_pulsar(topic, tenant=tenant, namespace=namespace)
        )
        self.mqtt_name = lru_cache(maxsize=65536)(
            lambda topic: pulsar_to_mqtt(topic, tenant=tenant, namespace=namespace)
        )
        self.timers = Timers()
        self.retained = RetainedStore(processor.table("retained"))
        self.sessions = SessionRegistry(processor, self.timers, self._publish_will)
        self.sys = SysPublisher(self, VERSION)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        recovered = await self.sessions.recover()
        log.info("mqtt: %d retained messages, %d offline sessions", len(self.retained), recovered)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.timers.serve)
            if self.settings.sys_interval > 0:
                await nursery.start(self.sys.serve, self.settings.sys_interval)
            task_status.started()

    async def handle_connection(self, stream: trio.abc.Stream, info: ConnectionInfo) -> None:
        from mop.protocols.mqtt.handler import ClientHandler

        await ClientHandler(self, stream, info).run()

    def topic_problem(self, topic: str) -> str | None:
        """Why `topic` is not a valid topic name under the configured limits, or None."""
        try:
            validate_topic_name(
                topic,
                max_length=self.settings.max_topic_length,
                max_levels=self.settings.max_topic_levels,
            )
        except TopicError as exc:
            return str(exc)
        return None

    async def publish(self, ctx: ClientContext, publish: Publish) -> PublishResult:
        """Publish an MQTT message (and update the retained table when it is retained)."""
        message = publish_to_message(publish, client_id=ctx.client_id, now_ms=now_ms())
        result = await self.processor.publish(ctx, self.canonical(publish.topic), message)
        if publish.retain and self.settings.retain_available:
            await self.retained.set(publish.topic, message if publish.payload else None)
        return result

    async def _publish_will(self, client_id: str, will: Will) -> None:
        props = dataclasses.replace(will.properties, will_delay_interval=None)
        publish = Publish(will.topic, will.payload, will.qos, will.retain, properties=props)
        ctx = ClientContext(client_id=client_id, protocol="mqtt")
        try:
            await self.publish(ctx, publish)
        except Exception:
            log.exception("publishing the will of %r failed", client_id)
