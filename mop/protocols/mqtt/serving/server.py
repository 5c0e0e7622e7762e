"""What the MQTT adapter shares between connections: sessions, retained messages, topic names.

`MqttServer.serve` runs the background work (sessions and, where this node runs them, their
timers; `$SYS` values and client events); the adapter serves each client with a `ClientHandler`
on top of it. Everything goes through the MessagingProcessor, never a backend directly.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

import trio

from mop.clock import now_ms
from mop.message import Message
from mop.processor import (
    AdapterCounts,
    BackendError,
    ClientContext,
    MessagingProcessor,
    PublishResult,
)
from mop.processor.tracing import MessageTracing, PublishTrace
from mop.protocols.mqtt.connection import ConnectionLimits
from mop.protocols.mqtt.mapping import publish_to_message, with_properties
from mop.protocols.mqtt.negotiation import JWT_METHOD, ConnectPolicy
from mop.protocols.mqtt.packets import Publish, Will
from mop.protocols.mqtt.reason_codes import ReasonCode
from mop.protocols.mqtt.serving.client_events import ClientEvents, default_node_name
from mop.protocols.mqtt.serving.outflow import OutflowContext
from mop.protocols.mqtt.serving.retained import TABLE as RETAINED_TABLE
from mop.protocols.mqtt.serving.retained import RetainedStore
from mop.protocols.mqtt.serving.session_registry import SessionRegistry
from mop.protocols.mqtt.serving.sys_topics import SysPublisher
from mop.protocols.mqtt.serving.timers import Timers
from mop.protocols.mqtt.shared_encodings import SharedQos0Encodings
from mop.settings import MqttSettings, Settings
from mop.topic_names import FULL_NAME_SCHEMES, is_system_topic, mqtt_to_pulsar, pulsar_to_mqtt
from mop.topics import matches
from mop.version import SERVER_NAME

if TYPE_CHECKING:  # the handler module imports this one
    from mop.protocols.mqtt.serving.handler import ClientHandler

log = logging.getLogger("mop.mqtt")


# First topic levels of `$` topics no client may publish to, whatever the settings.
RESERVED_DOLLAR_LEVELS = frozenset({"$SYS", "$share"})
# Where mosquitto bridges report their state (`notifications`, on by default), their will
# included: mosquitto lets any client write there. mop takes such messages and drops them.
BRIDGE_STATE_FILTER = "$SYS/broker/connection/+/state"


class MqttServer:
    def __init__(self, settings: Settings, processor: MessagingProcessor) -> None:
        self.settings: MqttSettings = settings.mqtt
        self.processor = processor
        # This protocol's counters, which the connections add to.
        self.stats = processor.stats.protocol("mqtt")
        # The connections with a session, so that a new ban can close those it covers.
        self.clients: set[ClientHandler] = set()
        processor.gatekeeper.on_bans_added(self._close_banned)
        self.limits = ConnectionLimits(
            max_packet_size=self.settings.max_packet_size,
            receive_maximum=self.settings.max_inflight,
            topic_alias_maximum=self.settings.topic_alias_maximum,
            max_topic_length=self.settings.max_topic_length,
            max_topic_levels=self.settings.max_topic_levels,
        )
        self.connect_policy = ConnectPolicy.from_settings(
            self.settings,
            auth_methods=frozenset([JWT_METHOD]) if settings.auth.jwt.enabled else frozenset(),
        )
        tenant, namespace = settings.default_tenant, settings.default_namespace
        # Topic names repeat endlessly on the hot path: map each one once.
        self.canonical = lru_cache(maxsize=65536)(
            lambda topic: mqtt_to_pulsar(topic, tenant=tenant, namespace=namespace)
        )
        self.mqtt_name = lru_cache(maxsize=65536)(
            lambda topic: pulsar_to_mqtt(topic, tenant=tenant, namespace=namespace)
        )
        self._tenant = tenant
        # QoS 0 PUBLISH bytes, so that a message fanned out to many clients is encoded once
        # (`encoded_qos0`).
        self._encoded = SharedQos0Encodings()
        self.timers = Timers()
        self.retained = RetainedStore(processor.table(RETAINED_TABLE))
        self.sessions = SessionRegistry(
            processor, self.timers, self._publish_will, node_timeout=self.settings.node_timeout
        )
        self.sys = SysPublisher(self, SERVER_NAME)
        # Not through `canonical`: each client id's event topics would crowd the hot topics
        # out of its cache.
        self.events = ClientEvents(
            processor,
            lambda topic: mqtt_to_pulsar(topic, tenant=tenant, namespace=namespace),
            publishes=self.settings.sys_events,
            node=self.settings.sys_node_name or default_node_name(),
        )
        self.outflow_context = OutflowContext(
            mqtt_name=self.mqtt_name,
            canonical=self.canonical,
            encoded_qos0=self.encoded_qos0,
            record_sent=self.stats.record_sent,
            record_dropped=processor.record_dropped,
            record_flow=self.sessions.record_flow,
            forget_flow=self.sessions.forget_flow,
            delivery_latency=self.stats.delivery_latency,
            tracing=processor.tracing,
        )
        processor.stats.adapters["mqtt"] = self.counts

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.timers.serve)
            # Sessions first: a node that runs the session timers from the start (a merged
            # node) has its offline sessions back before it accepts connections.
            await nursery.start(self.sessions.serve)
            log.info(
                "mqtt: %d retained messages, %d offline sessions with timers here",
                len(self.retained),
                len(self.sessions),
            )
            if self.settings.sys_interval > 0:
                await nursery.start(self.sys.serve, self.settings.sys_interval)
            if self.events.publishes:
                await nursery.start(self.events.serve)
            task_status.started()

    def _close_banned(self) -> None:
        now = time.time()
        gatekeeper = self.processor.gatekeeper
        for client in list(self.clients):
            ctx = client.ctx
            ban = gatekeeper.ban_of(
                client_id=ctx.client_id,
                usernames=(ctx.username, ctx.principal.name),
                address=client.info.peer[0],
                now=now,
            )
            if ban is not None:
                client.close_for(ReasonCode.ADMINISTRATIVE_ACTION, f"banned {ban.kind}")

    def counts(self) -> AdapterCounts:
        """Sessions, subscriptions, retained messages and deliveries in flight or queued on
        this node now, for the metrics: a walk over the sessions when they are collected (on
        copies: an OTLP export reads them from its own thread)."""
        subscriptions = shared = inflight = queued = 0
        for state in self.sessions.states():
            for topic_filter in list(state.subscriptions):
                if topic_filter.startswith("$share/"):
                    shared += 1
                else:
                    subscriptions += 1
        for client in list(self.clients):
            if client.state is not None:
                inflight += len(client.state.outbound)
            if client.flow is not None:
                queued += client.flow.queued
        return AdapterCounts(
            sessions=self.sessions.connected,
            offline_sessions=len(self.sessions),
            subscriptions=subscriptions,
            shared_subscriptions=shared,
            retained=self.retained.shared,
            inflight=inflight,
            queued=queued,
        )

    def acl_name(self, topic: str) -> str:
        """The name the ACL knows a topic or filter by: its MQTT name, also when the client
        gave the full Pulsar name (`persistent://public/default/a%2Fb` is `a/b`), so that no
        spelling of a topic escapes a rule about it."""
        if topic.startswith(FULL_NAME_SCHEMES):
            return self.mqtt_name(topic)
        return topic

    def is_system(self, acl_name: str) -> bool:
        """Whether a topic (or filter) of this name is in the system namespace, which holds
        the node's tables (retained messages, sessions, bans): no MQTT client's business."""
        return is_system_topic(acl_name, self._tenant)

    def reserved(self, acl_name: str) -> bool:
        """Whether MQTT clients may not publish to a topic of this name: `$SYS` is the
        node's, a `$share/...` name could never be subscribed to (such a filter is a shared
        subscription), and the system namespace holds the node's tables. Other `$` topics
        (`$aws/...`-style conventions) are the clients' unless `mqtt.publish_dollar_topics`
        is off; the spec only advises applications against them."""
        if acl_name[:1] == "$":
            if not self.settings.publish_dollar_topics:
                return True
            return acl_name.partition("/")[0] in RESERVED_DOLLAR_LEVELS
        return self.is_system(acl_name)

    def is_bridge_state(self, acl_name: str) -> bool:
        """Whether a topic of this name is where a mosquitto bridge reports its state: a
        reserved topic, whose messages (and wills) are taken and dropped rather than
        refused, so that bridges with mosquitto's default settings can connect."""
        return matches(BRIDGE_STATE_FILTER, acl_name)

    def encoded_qos0(self, topic: str, message: Message, retain: bool, level: int) -> bytes:
        """A QoS 0 PUBLISH of `message` without properties, as sent to every client at
        protocol `level`: encoded once, then the same bytes for each subscriber."""
        return self._encoded.encoded(topic, message, retain, level)

    async def publish(self, ctx: ClientContext, publish: Publish) -> PublishResult:
        """Publish an MQTT message (and update the retained table when it is retained)."""
        message = publish_to_message(publish, client_id=ctx.client_id, now_ms=now_ms())
        trace: PublishTrace | None = None
        tracing = self.processor.tracing
        if tracing is not None and not ctx.internal:
            trace = tracing.received(ctx, publish.topic, publish.qos, message.properties)
            if trace is not None:
                if trace.carrier:
                    message = with_properties(message, trace.carrier)
                trace.storing()
        try:
            result = await self.processor.publish(ctx, self.canonical(publish.topic), message)
            if trace is not None:
                trace.stored()
            if publish.retain and self.settings.retain_available:
                await self.retained.set(publish.topic, message if publish.payload else None)
        except BaseException as exc:
            if trace is not None:
                trace.end(exc)
            raise
        if trace is not None:
            trace.end()
        return result

    async def publish_batch(
        self, ctx: ClientContext, publishes: Sequence[Publish]
    ) -> list[PublishResult | BackendError]:
        """Publish messages that are not retained, in order, with one wait for durability;
        one result per message (see `MessagingProcessor.publish_batch`)."""
        tracing = self.processor.tracing
        if tracing is not None and not ctx.internal:
            return await self._publish_batch_traced(tracing, ctx, publishes)
        now = now_ms()
        canonical = self.canonical
        client_id = ctx.client_id
        items = [
            (canonical(p.topic), publish_to_message(p, client_id=client_id, now_ms=now))
            for p in publishes
        ]
        return await self.processor.publish_batch(ctx, items)

    async def _publish_batch_traced(
        self, tracing: MessageTracing, ctx: ClientContext, publishes: Sequence[Publish]
    ) -> list[PublishResult | BackendError]:
        """`publish_batch` with a trace for each message the tracing samples."""
        now = now_ms()
        items: list[tuple[str, Message]] = []
        traces: list[PublishTrace | None] = []
        for publish in publishes:
            message = publish_to_message(publish, client_id=ctx.client_id, now_ms=now)
            trace = tracing.received(ctx, publish.topic, publish.qos, message.properties)
            if trace is not None and trace.carrier:
                message = with_properties(message, trace.carrier)
            items.append((self.canonical(publish.topic), message))
            traces.append(trace)
        sampled = [trace for trace in traces if trace is not None]
        for trace in sampled:
            trace.storing()
        try:
            results = await self.processor.publish_batch(ctx, items)
        except BaseException as exc:
            for trace in sampled:
                trace.end(exc)
            raise
        for trace, result in zip(traces, results, strict=True):
            if trace is not None:
                error = result if isinstance(result, BackendError) else None
                trace.stored(error)
                trace.end(error)
        return results

    async def _publish_will(self, client_id: str, will: Will) -> None:
        props = dataclasses.replace(will.properties, will_delay_interval=None)
        publish = Publish(will.topic, will.payload, will.qos, will.retain, properties=props)
        ctx = ClientContext(client_id=client_id, protocol="mqtt")
        try:
            await self.publish(ctx, publish)
        except Exception:
            log.exception("publishing the will of %r failed", client_id)
