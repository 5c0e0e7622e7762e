"""The outbound half of an MQTT connection: deliveries from consumers to the client.

Deliveries become PUBLISH packets within the client's Receive Maximum; QoS 1/2 flows are tracked
in the session state until PUBACK / PUBCOMP, acknowledged to their consumer when the client has
the message, and resumed with their packet ids after a reconnect (or a crash).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass

import trio

from mop.message import Delivery, Message
from mop.processor import ClientContext, Consumer, ConsumerClosed
from mop.protocols.mqtt.connection import ServerConnection
from mop.protocols.mqtt.mapping import message_properties
from mop.protocols.mqtt.packets import NO_PROPERTIES, Properties, Publish, Pubrec, Pubrel
from mop.protocols.mqtt.reason_codes import ReasonCode
from mop.protocols.mqtt.server import MqttServer
from mop.protocols.mqtt.session import Outbound, SessionState, SubscriptionOptions
from mop.protocols.mqtt.subscriptions import SessionSubscriptions
from mop.transport import OutboundBuffer

log = logging.getLogger("mop.mqtt")


@dataclass(frozen=True, slots=True)
class _Pending:
    topic: str
    message: Message
    qos: int
    retain: bool
    properties: Properties
    delivery: Delivery | None
    consumer: Consumer | None


class Outflow:
    def __init__(
        self,
        server: MqttServer,
        conn: ServerConnection,
        out: OutboundBuffer,
        ctx: ClientContext,
        state: SessionState,
        subs: SessionSubscriptions,
    ) -> None:
        self._server = server
        self._conn = conn
        self._out = out
        self._ctx = ctx
        self._state = state
        self._subs = subs
        # QoS 1/2 publishes waiting for a free slot in the client's Receive Maximum.
        self._waiting: deque[_Pending] = deque()
        self._window_open = trio.Event()
        # Packet ids of messages in flight when the previous connection ended, by message id.
        self._resend_ids: dict[tuple[str, str], int] = {}
        # Messages whose QoS 2 flow reached PUBREL before the previous connection ended: the
        # client has them, so a redelivery from the backend is acknowledged, not sent again.
        self._released_ids: set[tuple[str, str]] = set()
        # One drain at a time keeps deliveries in order across the awaits inside it.
        self._drain_lock = trio.Lock()

    def room(self) -> int:
        return self._conn.client_receive_maximum - len(self._state.outbound) - len(self._waiting)

    async def deliver(self, consumer: Consumer, shared: SubscriptionOptions | None) -> None:
        """Move messages from one consumer to the client, within Receive Maximum."""
        while True:
            while self.room() <= 0:
                self._window_open = trio.Event()
                await self._window_open.wait()
            await self._out.wait_space()
            try:
                deliveries = await consumer.receive(max(1, self.room()))
            except ConsumerClosed:
                return
            now = _now_ms()
            done: list[Delivery] = []
            for delivery in deliveries:
                if self._released_ids and self._was_released(delivery):
                    done.append(delivery)
                    continue
                topic = self._server.mqtt_name(delivery.topic)
                plan = self._subs.plan(topic, delivery.message, shared)
                if plan is None or (
                    delivery.message.expires_at and delivery.message.expires_at <= now
                ):
                    done.append(delivery)
                    continue
                qos, retain, sub_ids = plan
                if not self.send(
                    topic,
                    delivery.message,
                    qos=qos,
                    retain=retain,
                    sub_ids=sub_ids,
                    now=now,
                    delivery=delivery,
                    consumer=consumer,
                ):
                    done.append(delivery)
            if done:
                consumer.ack(done)
            await self.drain()

    def send(
        self,
        topic: str,
        message: Message,
        *,
        qos: int,
        retain: bool,
        sub_ids: tuple[int, ...],
        now: int,
        delivery: Delivery | None,
        consumer: Consumer | None,
    ) -> bool:
        """Send (or queue for the window) one PUBLISH. False when it is finished already
        (QoS 0 sent, or dropped), so the caller acknowledges it."""
        props = NO_PROPERTIES
        if self._conn.protocol_level == 5:
            props = message_properties(message, now_ms=now, subscription_identifiers=sub_ids)
        if qos == 0:
            publish = Publish(topic, message.payload, 0, retain, properties=props)
            if self._waiting or self._drain_lock.locked():
                # Behind queued QoS 1/2 messages: keep the order the client sees.
                self._waiting.append(_Pending(topic, message, 0, retain, props, None, None))
            else:
                self._write_publish(publish)
            return False
        self._waiting.append(_Pending(topic, message, qos, retain, props, delivery, consumer))
        return True

    def _was_released(self, delivery: Delivery) -> bool:
        key = (delivery.topic, str(delivery.message_id))
        if key in self._released_ids:
            self._released_ids.discard(key)
            return True
        return False

    async def drain(self) -> None:
        """Send queued QoS 1/2 messages while the client's Receive Maximum allows.

        New QoS 2 deliveries of a persistent session are recorded (packet id -> message)
        before they are sent, so that after a crash the message goes out again with the same
        packet id and the client can recognise it (exactly once).
        """
        async with self._drain_lock:
            batch = self._take_window()
            state = self._state
            for entry, _ in batch:
                if entry is not None and entry.qos == 2:
                    await self._server.sessions.record_flow(state, entry)
            for entry, publish in batch:
                if not self._write_publish(publish) and entry is not None:
                    state.outbound.pop(entry.packet_id, None)
                    self._finish(entry)

    def _take_window(self) -> list[tuple[Outbound | None, Publish]]:
        """Give packet ids to as many waiting messages as the window has room for (QoS 0
        messages queued behind them need none)."""
        outbound = self._state.outbound
        batch: list[tuple[Outbound | None, Publish]] = []
        while self._waiting:
            item = self._waiting[0]
            if item.qos == 0:
                self._waiting.popleft()
                publish = Publish(
                    item.topic, item.message.payload, 0, item.retain, properties=item.properties
                )
                batch.append((None, publish))
                continue
            if len(outbound) >= self._conn.client_receive_maximum:
                break
            self._waiting.popleft()
            delivery = item.delivery
            pid = None
            if delivery is not None and self._resend_ids:
                pid = self._resend_ids.pop((delivery.topic, str(delivery.message_id)), None)
                if pid in outbound:
                    pid = None
            dup = pid is not None
            if pid is None:
                pid = self._state.allocate_packet_id()
                assert pid is not None  # Receive Maximum is at most 65535
            entry = Outbound(
                packet_id=pid,
                qos=item.qos,
                topic=delivery.topic
                if delivery is not None
                else self._server.canonical(item.topic),
                message_id=delivery.message_id if delivery is not None else None,
                delivery=delivery,
                message=item.message if delivery is None else None,
                consumer=item.consumer,
            )
            publish = Publish(
                item.topic,
                item.message.payload,
                item.qos,
                item.retain,
                dup=dup,
                packet_id=pid,
                properties=item.properties,
            )
            outbound[pid] = entry
            batch.append((entry, publish))
        return batch

    def _write_publish(self, publish: Publish) -> bool:
        data = self._conn.send_publish(publish)
        if data is None:
            self._server.processor.stats.messages_dropped += 1
            log.debug(
                "%s: message on %r exceeds the client's maximum packet size",
                self._ctx.client_id,
                publish.topic,
            )
            return False
        self._out.write(data)
        self._server.processor.record_sent(1, len(data))
        return True

    async def on_ack(self, pid: int) -> None:
        entry = self._state.outbound.pop(pid, None)
        if entry is None:
            return  # unknown packet id: nothing to release (the spec asks no reaction)
        self._finish(entry)
        self._window_open.set()
        if entry.qos == 2:
            await self._server.sessions.forget_flow(self._state, pid)
        await self.drain()

    async def on_pubrec(self, packet: Pubrec) -> None:
        entry = self._state.outbound.get(packet.packet_id)
        if packet.reason_code >= 0x80:
            await self.on_ack(packet.packet_id)
            return
        if entry is not None and not entry.released:
            entry.released = True
            # Durable before PUBREL: after a crash the flow resumes at PUBREL instead of
            # sending the message a second time.
            await self._server.sessions.record_flow(self._state, entry)
            self._finish(entry)
        self._out.write(
            self._conn.send(
                Pubrel(
                    packet.packet_id,
                    0
                    if entry is not None or self._conn.protocol_level != 5
                    else ReasonCode.PACKET_IDENTIFIER_NOT_FOUND,
                )
            )
        )

    def _finish(self, entry: Outbound) -> None:
        """The client has the message: acknowledge it to its consumer (once)."""
        if entry.delivery is not None and entry.consumer is not None:
            entry.consumer.ack([entry.delivery])
        entry.delivery = None
        entry.message = None

    def resend_inflight(self) -> None:
        """After a reconnect: PUBREL what was released, resend retained-in-flight PUBLISHes,
        and remember the packet ids of consumer messages the backend will redeliver."""
        for pid, entry in list(self._state.outbound.items()):
            if entry.released:
                self._out.write(self._conn.send(Pubrel(pid)))
                if entry.message_id is not None:
                    self._released_ids.add((entry.topic, str(entry.message_id)))
            elif entry.message is not None:
                topic = self._server.mqtt_name(entry.topic)
                self._write_publish(
                    Publish(topic, entry.message.payload, entry.qos, True, dup=True, packet_id=pid)
                )
            else:
                del self._state.outbound[pid]
                if entry.message_id is not None:
                    self._resend_ids[(entry.topic, str(entry.message_id))] = pid


def _now_ms() -> int:
    return int(time.time() * 1000)
