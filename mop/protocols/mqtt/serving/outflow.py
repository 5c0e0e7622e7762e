"""The outbound half of an MQTT connection: deliveries from consumers to the client.

Deliveries become PUBLISH packets within the client's Receive Maximum; QoS 1/2 flows are tracked
in the session state until PUBACK / PUBCOMP, acknowledged to their consumer when the client has
the message, and resumed with their packet ids after a reconnect (or a crash).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import trio

from mop.clock import now_ms
from mop.counters import Drop, LatencyHistogram
from mop.message import ENCRYPTED, Delivery, Message
from mop.processor import ClientContext, Consumer, ConsumerClosed
from mop.processor.tracing import DeliveryTrace, MessageTracing
from mop.protocols.mqtt.connection import ServerConnection
from mop.protocols.mqtt.mapping import message_properties
from mop.protocols.mqtt.packets import NO_PROPERTIES, Properties, Pubrec, Pubrel
from mop.protocols.mqtt.reason_codes import ReasonCode
from mop.protocols.mqtt.serving.subscriptions import RetainedDelivery, SessionSubscriptions
from mop.protocols.mqtt.session import Outbound, SessionState, SubscriptionOptions
from mop.transport import OutboundBuffer

log = logging.getLogger("mop.mqtt")


class _Pending(NamedTuple):
    """A PUBLISH waiting for its turn (QoS 1/2: for room in the client's Receive Maximum)."""

    topic: str
    message: Message
    qos: int
    retain: bool
    properties: Properties
    delivery: Delivery | None
    consumer: Consumer | None


@dataclass(frozen=True, slots=True)
class OutflowContext:
    """What an `Outflow` needs of what connections share (`MqttServer` makes one)."""

    mqtt_name: Callable[[str], str]  # canonical topic -> MQTT topic name
    canonical: Callable[[str], str]  # MQTT topic name -> canonical topic
    # A QoS 0 PUBLISH without properties: (topic, message, retain, protocol level) -> bytes.
    encoded_qos0: Callable[[str, Message, bool, int], bytes]
    record_sent: Callable[[int, int, int], None]  # (messages, bytes, payload bytes)
    record_dropped: Callable[[str], None]  # (why: `mop.counters.Drop`)
    # Make a QoS 2 delivery durable in the session / forget it once PUBCOMP came.
    record_flow: Callable[[SessionState, Outbound], Awaitable[None]]
    forget_flow: Callable[[SessionState, int], Awaitable[None]]
    # From a message's publish time to its delivery (sampled: see `LatencyHistogram.due`).
    delivery_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    # Traces of messages ("deliver" spans); None when the node does not trace.
    tracing: MessageTracing | None = None


class Outflow:
    __slots__ = (
        "_acks",
        "_conn",
        "_context",
        "_ctx",
        "_drain_lock",
        "_out",
        "_released_ids",
        "_resend_ids",
        "_state",
        "_subs",
        "_waiting",
        "_window_open",
        "messages_out",
    )

    def __init__(
        self,
        context: OutflowContext,
        conn: ServerConnection,
        out: OutboundBuffer,
        ctx: ClientContext,
        state: SessionState,
        subs: SessionSubscriptions,
    ) -> None:
        self._context = context
        self._conn = conn
        self._out = out
        self._ctx = ctx
        self._state = state
        self._subs = subs
        # QoS 1/2 publishes waiting for a free slot in the client's Receive Maximum.
        # Made when first needed (an idle connection never needs them):
        # QoS 1/2 publishes waiting for a free slot in the client's Receive Maximum.
        self._waiting: deque[_Pending] | None = None
        self._window_open: trio.Event | None = None
        # Packet ids of messages in flight when the previous connection ended, by message id.
        self._resend_ids: dict[tuple[str, str], int] | None = None
        # Messages whose QoS 2 flow reached PUBREL before the previous connection ended: the
        # client has them, so a redelivery from the backend is acknowledged, not sent again.
        self._released_ids: set[tuple[str, str]] | None = None
        # One drain at a time keeps deliveries in order across the awaits inside it.
        self._drain_lock: trio.Lock | None = None
        # Deliveries the client has, to acknowledge to their consumers (`flush_acks`).
        self._acks: list[tuple[Consumer, Delivery]] = []
        self.messages_out = 0  # PUBLISHes sent (for the admin API)

    @property
    def queued(self) -> int:
        """PUBLISHes waiting for room in the client's Receive Maximum."""
        waiting = self._waiting
        return len(waiting) if waiting else 0

    def room(self) -> int:
        waiting = self._waiting
        return (
            self._conn.client_receive_maximum
            - len(self._state.outbound)
            - (len(waiting) if waiting else 0)
        )

    async def deliver(self, consumer: Consumer, shared: SubscriptionOptions | None) -> None:
        """Move messages from one consumer to the client, within Receive Maximum."""
        context = self._context
        mqtt_name = context.mqtt_name
        encoded_qos0 = context.encoded_qos0
        plan = self._subs.plan
        send = self.send
        conn = self._conn
        out = self._out
        latency = context.delivery_latency
        tracing = context.tracing
        while True:
            while self.room() <= 0:
                window = self._window_open = trio.Event()
                await window.wait()
            await out.wait_space()
            try:
                deliveries = await consumer.receive(max(1, self.room()))
            except ConsumerClosed:
                return
            now = now_ms()
            if deliveries and latency.due(len(deliveries)):
                latency.record_age(now, deliveries[-1].message.publish_time)
            # A QoS 0 PUBLISH below MQTT 5 has no properties and no topic alias: the same
            # bytes for every such client, gathered into one write.
            level = conn.protocol_level
            plain = level != 5
            chunks: list[bytes] = []
            payload = 0  # the bytes of their payloads
            # Deliveries finished here, to acknowledge; QoS 0 messages need none (the
            # consumers are `auto_ack_qos0`).
            done: list[Delivery] = []
            traces: list[DeliveryTrace] | None = None
            # No drain can start or end before the next await (a delivery may still queue).
            draining = self._draining
            for delivery in deliveries:
                if self._released_ids and self._was_released(delivery):
                    done.append(delivery)
                    continue
                message = delivery.message
                topic = mqtt_name(delivery.topic)
                how = plan(topic, message, shared)
                if how is not None and message.properties and ENCRYPTED in message.properties:
                    # Only a Pulsar consumer with the key can read it (mop.message.ENCRYPTED).
                    context.record_dropped(Drop.ENCRYPTED)
                    how = None
                if how is None or (message.expires_at and message.expires_at <= now):
                    if how is not None:
                        context.record_dropped(Drop.EXPIRED)
                    if message.qos:
                        done.append(delivery)
                    continue
                qos, retain, sub_ids = how
                if tracing is not None and message.properties:
                    trace = tracing.delivering(self._ctx, topic, qos, message.properties)
                    if trace is not None:
                        if traces is None:
                            traces = []
                        traces.append(trace)
                if qos == 0 and plain and not draining and not self._waiting:
                    chunks.append(encoded_qos0(topic, message, retain, level))
                    payload += len(message.payload)
                    if message.qos:
                        done.append(delivery)
                    continue
                if chunks:  # what came before goes first
                    self._write_chunks(chunks, payload)
                    chunks = []
                    payload = 0
                if (
                    not send(topic, message, qos, retain, sub_ids, now, delivery, consumer)
                    and message.qos
                ):
                    done.append(delivery)
            if chunks:
                self._write_chunks(chunks, payload)
            if done:
                consumer.ack(done)
            if self._waiting:
                await self.drain()
            await out.push()
            if traces is not None:
                for trace in traces:
                    trace.sent()

    def delivering(self, retained: list[RetainedDelivery]) -> list[DeliveryTrace]:
        """The "deliver" spans of retained messages about to be sent (none without tracing)."""
        tracing = self._context.tracing
        if tracing is None:
            return []
        traces = []
        for item in retained:
            properties = item.message.properties
            trace = tracing.delivering(self._ctx, item.topic, item.qos, properties)
            if trace is not None:
                traces.append(trace)
        return traces

    @property
    def _draining(self) -> bool:
        """Whether a drain is between taking messages from the window and writing them."""
        return self._drain_lock is not None and self._drain_lock.locked()

    def _write_chunks(self, chunks: list[bytes], payload: int) -> None:
        data = b"".join(chunks)
        self._out.add(data)  # pushed by the caller (see `deliver` and the read loop)
        self.messages_out += len(chunks)
        self._context.record_sent(len(chunks), len(data), payload)

    def send(
        self,
        topic: str,
        message: Message,
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
        waiting = self._waiting
        if qos == 0:
            if waiting or self._draining:
                # Behind queued QoS 1/2 messages: keep the order the client sees.
                self._queue().append(_Pending(topic, message, 0, retain, props, None, None))
            else:
                self._write(topic, message, 0, retain, False, None, props)
            return False
        if waiting is None:
            waiting = self._queue()
        waiting.append(_Pending(topic, message, qos, retain, props, delivery, consumer))
        return True

    def _queue(self) -> deque[_Pending]:
        if self._waiting is None:
            self._waiting = deque()
        return self._waiting

    def _was_released(self, delivery: Delivery) -> bool:
        key = (delivery.topic, str(delivery.message_id))
        released = self._released_ids
        if released is not None and key in released:
            released.discard(key)
            return True
        return False

    async def drain(self) -> None:
        """Send queued QoS 1/2 messages while the client's Receive Maximum allows.

        New QoS 2 deliveries of a persistent session are recorded (packet id -> message)
        before they are sent, so that after a crash the message goes out again with the same
        packet id and the client can recognise it (exactly once). Only then is there anything
        to wait for: one drain at a time holds the lock across those waits, and later drains
        queue behind it so that the client sees the messages in order.
        """
        lock = self._drain_lock
        if lock is not None and lock.locked():
            async with lock:
                await self._send_window()
            return
        batch = self._take_window()
        if not self._must_record(batch):
            self._send_batch(batch)  # nothing to wait for, so nothing can come between
            return
        if lock is None:
            lock = self._drain_lock = trio.Lock()
        lock.acquire_nowait()
        try:
            await self._record(batch)
            self._send_batch(batch)
        finally:
            lock.release()

    async def _send_window(self) -> None:
        batch = self._take_window()
        await self._record(batch)
        self._send_batch(batch)

    def _must_record(self, batch: list[tuple[_Pending, Outbound | None, bool]]) -> bool:
        if not self._state.expiry_interval:
            return False
        return any(entry is not None and entry.qos == 2 for _, entry, _ in batch)

    async def _record(self, batch: list[tuple[_Pending, Outbound | None, bool]]) -> None:
        state = self._state
        for _, entry, _ in batch:
            if entry is not None and entry.qos == 2:
                await self._context.record_flow(state, entry)

    def _send_batch(self, batch: list[tuple[_Pending, Outbound | None, bool]]) -> None:
        state = self._state
        encode = self._encode
        add = self._out.add  # pushed by the caller (see `deliver` and the read loop)
        # Counted once for the batch (`_count_sent`).
        sent = nbytes = payload = 0
        for item, entry, dup in batch:
            message = item.message
            if entry is None:
                data = encode(item.topic, message, 0, item.retain, False, None, item.properties)
            else:
                data = encode(
                    item.topic,
                    message,
                    item.qos,
                    item.retain,
                    dup,
                    entry.packet_id,
                    item.properties,
                )
            if data is None:
                if entry is not None:
                    state.outbound.pop(entry.packet_id, None)
                    self._finish(entry)
                continue
            add(data)
            sent += 1
            nbytes += len(data)
            payload += len(message.payload)
        if sent:
            self._count_sent(sent, nbytes, payload)
        self.flush_acks()

    def _take_window(self) -> list[tuple[_Pending, Outbound | None, bool]]:
        """Give packet ids to as many waiting messages as the window has room for (QoS 0
        messages queued behind them need none)."""
        state = self._state
        outbound = state.outbound
        waiting = self._waiting
        if not waiting:
            return []
        limit = self._conn.client_receive_maximum
        # (message, its flow (None for QoS 0), whether it is sent again (DUP))
        batch: list[tuple[_Pending, Outbound | None, bool]] = []
        while waiting:
            item = waiting[0]
            if item.qos == 0:
                waiting.popleft()
                batch.append((item, None, False))
                continue
            if len(outbound) >= limit:
                break
            waiting.popleft()
            delivery = item.delivery
            pid = None
            resend = self._resend_ids
            if delivery is not None and resend:
                pid = resend.pop((delivery.topic, str(delivery.message_id)), None)
                if pid in outbound:
                    pid = None
            dup = pid is not None
            if pid is None:
                pid = state.allocate_packet_id()
                assert pid is not None  # Receive Maximum is at most 65535
            if delivery is not None:
                entry = Outbound(
                    pid, item.qos, delivery.topic, delivery.message_id, delivery=delivery
                )
                entry.consumer = item.consumer
            else:
                entry = Outbound(
                    pid, item.qos, self._context.canonical(item.topic), None, message=item.message
                )
            outbound[pid] = entry
            batch.append((item, entry, dup))
        return batch

    def _write(
        self,
        topic: str,
        message: Message,
        qos: int,
        retain: bool,
        dup: bool,
        packet_id: int | None,
        props: Properties,
    ) -> bool:
        """Encode and buffer one PUBLISH; False when it exceeds the client's Maximum Packet
        Size and is dropped."""
        data = self._encode(topic, message, qos, retain, dup, packet_id, props)
        if data is None:
            return False
        self._out.add(data)  # pushed by the caller (see `deliver` and the read loop)
        self._count_sent(1, len(data), len(message.payload))
        return True

    def _count_sent(self, messages: int, nbytes: int, payload: int) -> None:
        self.messages_out += messages
        self._context.record_sent(messages, nbytes, payload)

    def _encode(
        self,
        topic: str,
        message: Message,
        qos: int,
        retain: bool,
        dup: bool,
        packet_id: int | None,
        props: Properties,
    ) -> bytes | None:
        """One PUBLISH; None (counted as dropped) when it exceeds the client's Maximum
        Packet Size. A QoS 0 PUBLISH without properties or topic alias is the same bytes for
        every client at its protocol level: the server encodes it once."""
        conn = self._conn
        data: bytes | None
        if qos == 0 and props is NO_PROPERTIES and not conn.client_topic_alias_maximum:
            data = self._context.encoded_qos0(topic, message, retain, conn.protocol_level)
            limit = conn.client_max_packet_size
            if limit is not None and len(data) > limit:
                data = None
        else:
            data = conn.publish_bytes(topic, message.payload, qos, retain, dup, packet_id, props)
        if data is None:
            self._context.record_dropped(Drop.TOO_LARGE)
            log.debug(
                "%s: message on %r exceeds the client's maximum packet size",
                self._ctx.client_id,
                topic,
            )
        return data

    @property
    def waiting(self) -> bool:
        """Whether messages wait for room in the client's Receive Maximum."""
        return bool(self._waiting)

    def acked(self, pid: int) -> Outbound | None:
        """PUBACK (or PUBCOMP): the flow of `pid` is complete. Returns its entry (None for an
        unknown packet id, which needs no reaction); a QoS 2 entry must then be `forget`-ed.
        The caller sends what now fits the window with `drain` and acknowledges to the
        consumers with `flush_acks`."""
        entry = self._state.outbound.pop(pid, None)
        if entry is None:
            return None
        self._finish(entry)
        if self._window_open is not None:
            self._window_open.set()
        return entry

    async def forget(self, entry: Outbound) -> None:
        """Drop the stored record of a completed QoS 2 flow."""
        await self._context.forget_flow(self._state, entry.packet_id)

    async def on_ack(self, pid: int) -> None:
        entry = self.acked(pid)
        if entry is None:
            return  # unknown packet id: nothing to release (the spec asks no reaction)
        if entry.qos == 2:
            await self.forget(entry)
        self.flush_acks()
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
            await self._context.record_flow(self._state, entry)
            self._finish(entry)  # acknowledged with the rest of the read (`flush_acks`)
        reason = 0 if entry is not None else ReasonCode.PACKET_IDENTIFIER_NOT_FOUND
        self._out.add(self._conn.send_pubrel(packet.packet_id, reason))  # pushed by the reader

    def _finish(self, entry: Outbound) -> None:
        """The client has the message: acknowledge it to its consumer (once), with the other
        acknowledgements of the same read (`flush_acks`)."""
        if entry.delivery is not None and entry.consumer is not None:
            self._acks.append((entry.consumer, entry.delivery))
        entry.delivery = None
        entry.message = None

    def flush_acks(self) -> None:
        """Acknowledge what the client has to the consumers, one call per run of the same
        consumer."""
        acks = self._acks
        if not acks:
            return
        self._acks = []
        start = 0
        for index in range(1, len(acks) + 1):
            if index == len(acks) or acks[index][0] is not acks[start][0]:
                acks[start][0].ack([delivery for _, delivery in acks[start:index]])
                start = index

    def resend_inflight(self) -> None:
        """After a reconnect: PUBREL what was released, resend retained-in-flight PUBLISHes,
        and remember the packet ids of consumer messages the backend will redeliver."""
        for pid, entry in list(self._state.outbound.items()):
            if entry.released:
                self._out.write(self._conn.send(Pubrel(pid)))
                if entry.message_id is not None:
                    if self._released_ids is None:
                        self._released_ids = set()
                    self._released_ids.add((entry.topic, str(entry.message_id)))
            elif entry.message is not None:
                topic = self._context.mqtt_name(entry.topic)
                self._write(topic, entry.message, entry.qos, True, True, pid, NO_PROPERTIES)
            else:
                del self._state.outbound[pid]
                if entry.message_id is not None:
                    if self._resend_ids is None:
                        self._resend_ids = {}
                    self._resend_ids[(entry.topic, str(entry.message_id))] = pid
