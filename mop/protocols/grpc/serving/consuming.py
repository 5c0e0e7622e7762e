"""The consume method: a Pulsar consumer per call.

The call's processor consumer works by permits: it is granted `pulsar-receiver-queue-size`
at first and one more for each message `Call.send` has written, so at most that many messages
are taken ahead of the client's reading (the server's send waits for the client's HTTP/2
window: a reader that stops reading stops the consumer, and memory stays bounded). Messages
sent and not acknowledged are bounded too (`max_unacked`, as Pulsar brokers bound them per
consumer): past it no permit is granted until acknowledgements come. Acks are read on the
request stream meanwhile; the client half-closing it ends the call, and what it did not
acknowledge goes back to the subscription, for its next consumer.
"""

from __future__ import annotations

import logging
from typing import Final

import trio
from google.protobuf.message import DecodeError

from mop.clock import now_ms
from mop.counters import Drop, ProtocolStats
from mop.message import Delivery, MessageId
from mop.partitioned import partitions_of
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
from mop.protocols.grpc.status import GrpcError, StatusCode
from mop.protocols.pulsar.mapping import subscription_name
from mop.security.acl import Access

log = logging.getLogger("mop.grpc")

# Messages sent to one consumer and not acknowledged, past which it is sent no more until
# some are (Pulsar brokers' maxUnackedMessagesPerConsumer).
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
    """The processor subscription of a consume call: the one a Pulsar client of the same
    subscription on `topic` shares (`subscription_name`), durable on a persistent topic."""
    return SubscriptionSpec(
        name=subscription_name(topic, request.subscription),
        selectors=frozenset([topic]),
        kind=request.kind,
        durable=topic.startswith("persistent://"),
        start=request.start,
        permits=True,
        consumer_name=request.consumer_name,
    )


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
            if count := await self.processor.partitioned.partitions(topic):
                partitions = partitions_of(topic, count)
                raise GrpcError(
                    StatusCode.FAILED_PRECONDITION,
                    f"{topic} is a partitioned topic: consume each of its partitions"
                    f" ({partitions[0]} ... {partitions[-1]}) in a call of its own",
                )
            try:
                consumer = await self.processor.subscribe(
                    client.ctx, subscription_spec(topic, request)
                )
            except BackendError as exc:
                raise backend_status(exc) from None
            try:
                await ConsumeCall(self, call, client.ctx, consumer, request).run()
            finally:
                with trio.CancelScope(shield=True):
                    await consumer.close()


class ConsumeCall:
    """One consume call: messages out as the client reads them, acks in."""

    def __init__(
        self,
        consuming: Consuming,
        call: Call,
        ctx: ClientContext,
        consumer: Consumer,
        request: ConsumerOpen,
    ) -> None:
        self._consuming = consuming
        self._call = call
        self._ctx = ctx
        self._consumer = consumer
        self._request = request
        # Sent and not acknowledged, by id.
        self.outstanding: dict[MessageId, Delivery] = {}
        # Permits held back while `max_unacked` messages are outstanding.
        self._owed = 0
        self._ending: GrpcError | None = None

    async def run(self) -> None:
        """Serve until the client half-closes (OK) or something ends the call (its status)."""
        self._consumer.grant(self._request.receiver_queue_size)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._deliver, nursery.cancel_scope)
            await self._read_acks()
            nursery.cancel_scope.cancel()
        if self._ending is not None:
            raise self._ending

    def _end(self, status: GrpcError, scope: trio.CancelScope) -> None:
        if self._ending is None:
            self._ending = status
        scope.cancel()

    # -- messages out ----------------------------------------------------------------------

    async def _deliver(self, scope: trio.CancelScope) -> None:
        consumer = self._consumer
        stats = self._consuming.stats
        processor = self._consuming.processor
        tracing = processor.tracing
        while True:
            try:
                deliveries = await consumer.receive(self._request.receiver_queue_size)
            except ConsumerClosed:
                self._end(GrpcError(StatusCode.UNAVAILABLE, "the consumer was closed"), scope)
                return
            for delivery in deliveries:
                message = delivery.message
                if not readable(message):
                    # Only a Pulsar consumer can read it (mop.message.ENCRYPTED).
                    consumer.ack([delivery])
                    processor.record_dropped(Drop.ENCRYPTED, message.count)
                    self._release(message.count)
                    continue
                self.outstanding[delivery.message_id] = delivery
                trace = None
                if tracing is not None and message.properties:
                    trace = tracing.delivering(
                        self._ctx, delivery.topic, message.qos, message.properties
                    )
                data = proto_message(delivery).SerializeToString()
                await self._call.send(data)
                if trace is not None:
                    trace.sent()
                stats.record_sent(1, len(data), len(message.payload))
                self._release(1)
            if deliveries and stats.delivery_latency.due(len(deliveries)):
                stats.delivery_latency.record_age(now_ms(), deliveries[-1].message.publish_time)

    def _release(self, permits: int) -> None:
        """Give the consumer back `permits` for messages written, unless `max_unacked` are
        outstanding: then they wait for acknowledgements."""
        room = self._consuming.max_unacked - len(self.outstanding)
        granted = max(0, min(permits + self._owed, room))
        self._owed += permits - granted
        if granted:
            self._consumer.grant(granted)

    # -- acks in ---------------------------------------------------------------------------

    async def _read_acks(self) -> None:
        stats = self._consuming.stats
        while (data := await self._call.receive()) is not None:
            stats.requests += 1
            stats.bytes_received += len(data)
            try:
                self._on_ack(decode_ack(data))
            except GrpcError as exc:
                self._ending = exc
                return
            if self._owed:
                self._release(0)

    def _on_ack(self, ack: pb.Ack) -> None:
        consumer = self._consumer
        outstanding = self.outstanding
        if ack.type == pb.Ack.CUMULATIVE:
            self._ack_through(ack)
        else:
            acked = [
                delivery
                for mid in ack.message_ids
                if (delivery := outstanding.pop(from_proto_id(mid), None)) is not None
            ]
            if acked:
                consumer.ack(acked)
        back = [
            delivery
            for mid in ack.negative_message_ids
            if (delivery := outstanding.pop(from_proto_id(mid), None)) is not None
        ]
        if back:
            consumer.nack(back, ack.redelivery_delay_ms / 1000)

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
        through = from_proto_id(ack.message_ids[0])
        if through.ledger < 0 or through.entry < 0:
            return
        topic = next(iter(self._consumer.spec.selectors))
        self._consumer.ack_through(topic, through)
        for mid in [mid for mid in self.outstanding if mid <= through]:
            del self.outstanding[mid]


__all__ = ["DEFAULT_MAX_UNACKED", "ConsumeCall", "Consuming", "subscription_spec"]
