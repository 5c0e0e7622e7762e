"""The consume method: a Pulsar consumer per call (one per partition of a partitioned topic,
as pulsar-client subscribes them, each in its partition's subscription).

Each processor consumer works by permits: it is granted its share of
`pulsar-receiver-queue-size` at first and one more for each of its messages `Call.send` has
written, so at most that many messages are taken ahead of the client's reading (the server's
send waits for the client's HTTP/2 window: a reader that stops reading stops the consumer, and
memory stays bounded). Messages sent and not acknowledged are bounded too (`max_unacked`, as
Pulsar brokers bound them per consumer): at the bound the next message waits for
acknowledgements, and with it the permits. Acks are read on the request stream meanwhile; the
client half-closing it ends the call, and what it did not acknowledge goes back to the
subscription, for its next consumer.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Final

import trio
from google.protobuf.message import DecodeError

from mop.clock import now_ms
from mop.counters import Drop, ProtocolStats
from mop.message import Delivery, MessageId
from mop.processor import (
    BackendError,
    ClientContext,
    Consumer,
    ConsumerClosed,
    MessagingProcessor,
    SubscriptionKind,
    SubscriptionSpec,
)
from mop.protocols.grpc.errors import backend_status
from mop.protocols.grpc.mapping import from_proto_id, proto_message, readable
from mop.protocols.grpc.metadata import ConsumerOpen, consumer_open
from mop.protocols.grpc.proto import mop_grpc_pb2 as pb
from mop.protocols.grpc.serving.calls import Call
from mop.protocols.grpc.serving.clients import Namespaces, open_call_client
from mop.protocols.grpc.serving.partitions import topics_of
from mop.protocols.grpc.status import GrpcError, StatusCode
from mop.protocols.pulsar.mapping import subscription_name
from mop.security.acl import Access

log = logging.getLogger("mop.grpc")

# Messages sent to one call and not acknowledged, past which it is sent no more until some
# are (Pulsar brokers' maxUnackedMessagesPerConsumer).
DEFAULT_MAX_UNACKED: Final = 50_000
_CUMULATIVE_KINDS: Final = frozenset({SubscriptionKind.EXCLUSIVE, SubscriptionKind.FAILOVER})


def decode_ack(data: bytes) -> pb.Ack:
    ack = pb.Ack()
    try:
        ack.ParseFromString(data)
    except DecodeError:
        raise GrpcError(StatusCode.INVALID_ARGUMENT, "the request is not an Ack message") from None
    return ack


def subscription_spec(topic: str, request: ConsumerOpen) -> SubscriptionSpec:
    """The processor subscription of a consume call on `topic` (a partition, for a
    partitioned topic): the one a Pulsar client of the same subscription shares
    (`subscription_name`), durable on a persistent topic."""
    return SubscriptionSpec(
        name=subscription_name(topic, request.subscription),
        selectors=frozenset([topic]),
        kind=request.kind,
        durable=topic.startswith("persistent://"),
        start=request.start,
        permits=True,
        consumer_name=request.consumer_name,
    )


@dataclass(slots=True)
class Leg:
    """The consumer of one topic of the call (of one partition: `partition` is its index)."""

    partition: int
    topic: str
    consumer: Consumer


class Consuming:
    """What the consume calls of a node share."""

    def __init__(
        self,
        processor: MessagingProcessor,
        namespaces: Namespaces,
        stats: ProtocolStats,
        *,
        max_unacked: int = DEFAULT_MAX_UNACKED,
    ) -> None:
        self.processor = processor
        self.namespaces = namespaces
        self.stats = stats
        self.max_unacked = max_unacked

    async def consume(self, call: Call) -> None:
        request = consumer_open(call.metadata)
        async with open_call_client(self.processor, self.namespaces, call) as client:
            topic = client.topic(request.topic, Access.READ)
            topics = await topics_of(self.processor, topic)
            async with self._subscribed(client.ctx, topics, request) as legs:
                await ConsumeCall(self, call, client.ctx, legs, request).run()

    @asynccontextmanager
    async def _subscribed(
        self, ctx: ClientContext, topics: list[str], request: ConsumerOpen
    ) -> AsyncIterator[list[Leg]]:
        """A consumer on each of `topics` while the block runs; closed after it, so that what
        was not acknowledged goes back to the subscriptions."""
        legs: list[Leg] = []
        try:
            for partition, topic in enumerate(topics):
                try:
                    consumer = await self.processor.subscribe(
                        ctx, subscription_spec(topic, request)
                    )
                except BackendError as exc:
                    raise backend_status(exc) from None
                legs.append(Leg(partition, topic, consumer))
            yield legs
        finally:
            with trio.CancelScope(shield=True):
                for leg in legs:
                    await leg.consumer.close()


class ConsumeCall:
    """One consume call: messages out as the client reads them, acks in."""

    def __init__(
        self,
        consuming: Consuming,
        call: Call,
        ctx: ClientContext,
        legs: list[Leg],
        request: ConsumerOpen,
    ) -> None:
        self._consuming = consuming
        self._call = call
        self._ctx = ctx
        self._legs = legs
        self._request = request
        # The queue size shared out over the legs (each gets at least one permit).
        self._queue = max(1, request.receiver_queue_size // len(legs))
        # Sent and not acknowledged, by leg (partition) and id.
        self.outstanding: dict[tuple[int, MessageId], Delivery] = {}
        # Set when acknowledgements come, for a writer waiting at `max_unacked`.
        self._acked = trio.Event()
        self._ending: GrpcError | None = None

    async def run(self) -> None:
        """Serve until the client half-closes (OK) or something ends the call (its status)."""
        # The legs' deliveries, written in turn; permits bound what waits here.
        ready, taken = trio.open_memory_channel[tuple[Leg, list[Delivery]]](math.inf)
        async with trio.open_nursery() as nursery:
            scope = nursery.cancel_scope
            for leg in self._legs:
                leg.consumer.grant(self._queue)
                nursery.start_soon(self._take, leg, ready.clone(), scope)
            ready.close()
            nursery.start_soon(self._write, taken)
            await self._read_acks()
            scope.cancel()
        if self._ending is not None:
            raise self._ending

    def _end(self, status: GrpcError, scope: trio.CancelScope) -> None:
        if self._ending is None:
            self._ending = status
        scope.cancel()

    # -- messages out ----------------------------------------------------------------------

    async def _take(
        self,
        leg: Leg,
        ready: trio.MemorySendChannel[tuple[Leg, list[Delivery]]],
        scope: trio.CancelScope,
    ) -> None:
        async with ready:
            while True:
                try:
                    deliveries = await leg.consumer.receive(self._queue)
                except ConsumerClosed:
                    self._end(GrpcError(StatusCode.UNAVAILABLE, "the consumer was closed"), scope)
                    return
                ready.send_nowait((leg, deliveries))

    async def _write(self, taken: trio.MemoryReceiveChannel[tuple[Leg, list[Delivery]]]) -> None:
        stats = self._consuming.stats
        processor = self._consuming.processor
        tracing = processor.tracing
        max_unacked = self._consuming.max_unacked
        partitioned = len(self._legs) > 1
        async for leg, deliveries in taken:
            for delivery in deliveries:
                message = delivery.message
                if not readable(message):
                    # Only a Pulsar consumer can read it (mop.message.ENCRYPTED).
                    leg.consumer.ack([delivery])
                    processor.record_dropped(Drop.ENCRYPTED, message.count)
                    leg.consumer.grant(message.count)
                    continue
                while len(self.outstanding) >= max_unacked:
                    self._acked = trio.Event()
                    await self._acked.wait()
                self.outstanding[leg.partition, delivery.message_id] = delivery
                trace = None
                if tracing is not None and message.properties:
                    trace = tracing.delivering(
                        self._ctx, delivery.topic, message.qos, message.properties
                    )
                partition = leg.partition if partitioned else 0
                data = proto_message(delivery, partition).SerializeToString()
                await self._call.send(data)
                if trace is not None:
                    trace.sent()
                # The server counts the bytes on the wire and the requests.
                stats.messages_sent += 1
                stats.payload_bytes_sent += len(message.payload)
                leg.consumer.grant(1)
            if deliveries and stats.delivery_latency.due(len(deliveries)):
                stats.delivery_latency.record_age(now_ms(), deliveries[-1].message.publish_time)

    # -- acks in ---------------------------------------------------------------------------

    async def _read_acks(self) -> None:
        while (data := await self._call.receive()) is not None:
            try:
                self._on_ack(decode_ack(data))
            except GrpcError as exc:
                self._ending = exc
                return
            except BackendError as exc:  # e.g. what a separated proxy's consumer cannot do
                self._ending = backend_status(exc)
                return
            except ConsumerClosed:
                self._ending = GrpcError(StatusCode.UNAVAILABLE, "the consumer was closed")
                return
            self._acked.set()

    def _leg(self, message_id: pb.MessageId) -> Leg:
        partition = message_id.partition if len(self._legs) > 1 else 0
        if not 0 <= partition < len(self._legs):
            raise GrpcError(
                StatusCode.INVALID_ARGUMENT,
                f"message id of partition {partition}: the topic has {len(self._legs)}",
            )
        return self._legs[partition]

    def _take_back(self, ids: list[pb.MessageId]) -> dict[int, list[Delivery]]:
        """The outstanding deliveries `ids` name, by leg, no longer outstanding."""
        found: dict[int, list[Delivery]] = {}
        for mid in ids:
            leg = self._leg(mid)
            delivery = self.outstanding.pop((leg.partition, from_proto_id(mid)), None)
            if delivery is not None:
                found.setdefault(leg.partition, []).append(delivery)
        return found

    def _on_ack(self, ack: pb.Ack) -> None:
        if ack.type == pb.Ack.CUMULATIVE:
            self._ack_through(ack)
        else:
            for partition, acked in self._take_back(list(ack.message_ids)).items():
                self._legs[partition].consumer.ack(acked)
        delay = ack.redelivery_delay_ms / 1000
        for partition, back in self._take_back(list(ack.negative_message_ids)).items():
            self._legs[partition].consumer.nack(back, delay)

    def _ack_through(self, ack: pb.Ack) -> None:
        kind = self._request.kind
        if kind not in _CUMULATIVE_KINDS:
            raise GrpcError(
                StatusCode.FAILED_PRECONDITION,
                f"a cumulative ack is for exclusive and failover subscriptions, not {kind.value}",
            )
        if len(ack.message_ids) != 1:
            raise GrpcError(
                StatusCode.INVALID_ARGUMENT,
                f"a cumulative ack names one message id, not {len(ack.message_ids)}",
            )
        leg = self._leg(ack.message_ids[0])
        through = from_proto_id(ack.message_ids[0])
        if through.ledger < 0 or through.entry < 0:
            return
        # Up to this message of its partition (pulsar-client acknowledges a partitioned
        # topic cumulatively one partition at a time, too).
        leg.consumer.ack_through(leg.topic, through)
        done = [key for key in self.outstanding if key[0] == leg.partition and key[1] <= through]
        for key in done:
            del self.outstanding[key]


__all__ = ["DEFAULT_MAX_UNACKED", "ConsumeCall", "Consuming", "Leg", "subscription_spec"]
