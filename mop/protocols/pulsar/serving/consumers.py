"""The consumers of one Pulsar connection: SUBSCRIBE, FLOW, ACK, REDELIVER, SEEK, UNSUBSCRIBE,
CLOSE_CONSUMER, GET_LAST_MESSAGE_ID and CONSUMER_STATS, and one task per consumer that sends
MESSAGE frames.

Each consumer is a processor consumer with permit-based flow control (FLOW grants permits, a
batch uses one per message) that takes batches whole. Its subscription is named after the topic
and the Pulsar subscription, since Pulsar subscriptions belong to one topic.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import trio

from mop.clock import now_ms
from mop.message import Delivery, Message, MessageId
from mop.processor import (
    BackendError,
    Consumer,
    ConsumerClosed,
    StartPosition,
    SubscriptionKind,
    SubscriptionSpec,
)
from mop.processor.tracing import DeliveryTrace, MessageTracing
from mop.protocols.pulsar.commands import (
    Ack,
    AckResponse,
    AckType,
    ActiveConsumerChange,
    CloseConsumer,
    ConsumerStats,
    ConsumerStatsResponse,
    Error,
    Flow,
    GetLastMessageId,
    GetLastMessageIdResponse,
    InitialPosition,
    RedeliverUnacknowledgedMessages,
    Seek,
    Subscribe,
    SubType,
    Success,
    Unsubscribe,
)
from mop.protocols.pulsar.errors import ServerError
from mop.protocols.pulsar.frames import ack_set_of, unacked_indexes
from mop.protocols.pulsar.mapping import (
    EARLIEST,
    LATEST,
    entry_bytes,
    from_id_data,
    subscription_name,
    to_id_data,
)
from mop.protocols.pulsar.metadata import MessageIdData
from mop.protocols.pulsar.serving.consumer_stats import ConsumerMeter, stats_response
from mop.protocols.pulsar.serving.server import TopicRefused, server_error
from mop.security.acl import Access

if TYPE_CHECKING:
    from mop.protocols.pulsar.serving.handler import PulsarConnection

log = logging.getLogger("mop.pulsar")

_KINDS: Final = {
    SubType.Exclusive: SubscriptionKind.EXCLUSIVE,
    SubType.Shared: SubscriptionKind.SHARED,
    SubType.Failover: SubscriptionKind.FAILOVER,
    SubType.Key_Shared: SubscriptionKind.KEY_SHARED,
}
# Entries taken from the processor consumer at a time (permits bound them anyway).
_RECEIVE_BATCH: Final = 1000
_MASK64: Final = (1 << 64) - 1
# The request id of a CLOSE_CONSUMER the broker sends on its own (the client ignores it).
_BROKER_REQUEST: Final = 0


@dataclass(slots=True)
class _ConsumerState:
    consumer_id: int
    topic: str
    subscription: str
    kind: SubscriptionKind
    consumer: Consumer
    sub_type: SubType
    name: str
    meter: ConsumerMeter
    # Entries sent and not yet acknowledged, by entry id (for nacks and batch-index acks).
    outstanding: dict[MessageId, Delivery] = field(default_factory=dict)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)


class ConnectionConsumers:
    def __init__(self, link: PulsarConnection) -> None:
        self._link = link
        self._states: dict[int, _ConsumerState] = {}
        self._tracing = link.server.processor.tracing
        # A non-durable subscription goes with its consumer, which a seek closes: where the
        # seek put it, for the client's subscribe that follows, by (topic, subscription).
        self._resume: dict[tuple[str, str], MessageId] = {}

    def __len__(self) -> int:
        return len(self._states)

    @property
    def inflight(self) -> int:
        """Entries sent to the client and not yet acknowledged."""
        return sum(len(state.outstanding) for state in self._states.values())

    def subscriptions(self) -> list[tuple[str, str]]:
        """(topic, subscription) of each consumer."""
        return [(state.topic, state.subscription) for state in self._states.values()]

    def _state(self, consumer_id: int, request_id: int) -> _ConsumerState | None:
        """The consumer, or None after answering ERROR ConsumerNotFound."""
        state = self._states.get(consumer_id)
        if state is None:
            self._link.send(
                Error(
                    request_id=request_id,
                    error=ServerError.ConsumerNotFound,
                    message=f"no consumer {consumer_id} on this connection",
                )
            )
        return state

    # -- SUBSCRIBE -------------------------------------------------------------------------

    async def on_subscribe(self, cmd: Subscribe) -> None:
        link = self._link
        rid = cmd.request_id
        if cmd.consumer_id in self._states:
            link.send(Success(request_id=rid))  # a retried request: it is subscribed already
            return
        try:
            topic = link.authorized_topic(cmd.topic, Access.READ)
        except TopicRefused as exc:
            link.send(Error(request_id=rid, error=exc.error, message=exc.message))
            return
        if (owner := await link.server.owner(topic)) is not None:
            # The client looks the topic up again and goes to the owner.
            link.send(
                Error(
                    request_id=rid,
                    error=ServerError.ServiceNotReady,
                    message=f"topic {topic} is served by {owner}",
                )
            )
            return
        try:
            await link.schemas.check_consumer(topic, cmd.schema)
        except BackendError as exc:
            link.send(Error(request_id=rid, error=server_error(exc), message=str(exc)))
            return
        kind = _KINDS[cmd.sub_type]
        durable = cmd.durable and topic.startswith("persistent://")
        start, start_at = _start(cmd)
        resume = None if durable else self._resume.pop((topic, cmd.subscription), None)
        if resume is not None:
            start, start_at = _resume_at(resume)
        spec = SubscriptionSpec(
            name=subscription_name(topic, cmd.subscription),
            selectors=frozenset([topic]),
            kind=kind,
            durable=durable,
            start=start,
            start_at=start_at,
            permits=True,
            whole_batches=True,
            priority=cmd.priority_level or 0,
            consumer_name=cmd.consumer_name or "",
        )
        try:
            consumer = await link.server.processor.subscribe(link.ctx, spec)
        except BackendError as exc:
            link.send(Error(request_id=rid, error=server_error(exc), message=str(exc)))
            return
        state = _ConsumerState(
            cmd.consumer_id,
            topic,
            cmd.subscription,
            kind,
            consumer,
            cmd.sub_type,
            cmd.consumer_name or "",
            ConsumerMeter(time.time()),
        )
        self._states[cmd.consumer_id] = state
        link.send(Success(request_id=rid))
        if kind is SubscriptionKind.FAILOVER:
            link.send(ActiveConsumerChange(consumer_id=cmd.consumer_id, is_active=consumer.active))
        link.nursery.start_soon(self._serve, state)

    async def _serve(self, state: _ConsumerState) -> None:
        with state.scope:
            async with trio.open_nursery() as nursery:
                if state.kind is SubscriptionKind.FAILOVER:
                    nursery.start_soon(self._watch_active, state)
                await self._deliver(state)
                nursery.cancel_scope.cancel()

    async def _deliver(self, state: _ConsumerState) -> None:
        link = self._link
        conn = link.conn
        cid = state.consumer_id
        tracing = self._tracing
        while True:
            await link.out.wait_space()
            try:
                deliveries = await state.consumer.receive(_RECEIVE_BATCH)
            except ConsumerClosed:
                return
            frames = []
            traces: list[DeliveryTrace] | None = None
            count = payload = 0  # messages (those of batches apart) and their payloads' bytes
            for delivery in deliveries:
                message = delivery.message
                if tracing is not None:
                    traces = self._traced(tracing, state.topic, message, traces)
                mid = delivery.message_id
                state.outstanding[mid] = delivery
                size = message.count
                count += size
                payload += len(message.payload)
                ack_set: tuple[int, ...] = ()
                if delivery.acked and size > 1:
                    ack_set = ack_set_of(i for i in range(size) if i not in delivery.acked)
                frames.append(
                    conn.deliver(
                        cid,
                        mid.ledger & _MASK64,
                        mid.entry & _MASK64,
                        entry_bytes(delivery.message, mid),
                        None,
                        redelivery_count=delivery.redelivery_count,
                        ack_set=ack_set,
                    )
                )
            data = b"".join(frames)
            link.write(data)
            state.meter.sent(count, len(data))
            stats = link.server.stats
            link.messages_out += count
            stats.record_sent(count, len(data), payload)
            if deliveries and stats.delivery_latency.due(count):
                stats.delivery_latency.record_age(now_ms(), deliveries[-1].message.publish_time)
            if traces is not None:
                for trace in traces:
                    trace.sent()

    def _traced(
        self,
        tracing: MessageTracing,
        topic: str,
        message: Message,
        traces: list[DeliveryTrace] | None,
    ) -> list[DeliveryTrace] | None:
        """`traces` with a "deliver" span for each traced message of `message` (of each
        message of a batch) added."""
        for member in message.batch or (message,):
            if not member.properties:
                continue
            trace = tracing.delivering(self._link.ctx, topic, member.qos, member.properties)
            if trace is not None:
                if traces is None:
                    traces = []
                traces.append(trace)
        return traces

    async def _watch_active(self, state: _ConsumerState) -> None:
        while True:
            try:
                active = await state.consumer.active_changed()
            except ConsumerClosed:
                return
            self._link.send(ActiveConsumerChange(consumer_id=state.consumer_id, is_active=active))

    # -- FLOW, ACK, REDELIVER --------------------------------------------------------------

    def on_flow(self, cmd: Flow) -> None:
        state = self._states.get(cmd.consumer_id)
        if state is not None:
            state.consumer.grant(cmd.message_permits)
            state.meter.granted(cmd.message_permits)

    def on_ack(self, cmd: Ack) -> None:
        state = self._states.get(cmd.consumer_id)
        if state is not None:
            if cmd.ack_type is AckType.Cumulative:
                for data in cmd.message_id[:1]:
                    self._ack_through(state, data)
            else:
                for data in cmd.message_id:
                    self._ack_one(state, data)
        if cmd.request_id is not None:
            self._link.send(AckResponse(consumer_id=cmd.consumer_id, request_id=cmd.request_id))

    def _ack_one(self, state: _ConsumerState, data: MessageIdData) -> None:
        whole = from_id_data(data).whole
        delivery = state.outstanding.get(whole)
        if delivery is None:
            return  # acknowledged twice, or not delivered here: nothing to do
        owed = _unacked_in(delivery)
        message = delivery.message
        size = message.count
        if data.ack_set and size > 1:
            unacked = set(unacked_indexes(data.ack_set, size))
            newly = [i for i in range(size) if i not in unacked and i not in delivery.acked]
            if message.batch:
                mid = MessageId
                state.consumer.ack(
                    [
                        dataclasses.replace(delivery, message_id=mid(whole.ledger, whole.entry, i))
                        for i in newly
                    ]
                )
            acked = delivery.acked.union(newly)
            if len(acked) < size:
                # Some messages still owed. An entry mop cannot split is acknowledged once all
                # of its messages are (until then a redelivery brings it back whole).
                kept = dataclasses.replace(delivery, acked=acked)
                state.outstanding[whole] = kept
                state.meter.acknowledged(owed - _unacked_in(kept))
                return
            if not message.batch:
                state.consumer.ack([delivery])
        else:
            state.consumer.ack([delivery])
        del state.outstanding[whole]
        state.meter.acknowledged(owed)

    def _ack_through(self, state: _ConsumerState, data: MessageIdData) -> None:
        mid = from_id_data(data)
        if mid in (EARLIEST, LATEST) or mid.ledger < 0 or mid.entry < 0:
            return
        whole = mid.whole
        through = whole
        delivery = state.outstanding.get(whole)
        if data.ack_set:
            # The set bits are the messages of the batch still owed. Read them even when the
            # entry is not out with this consumer (it may be on its way back after a
            # redelivery request): taking the id as the whole entry would lose them.
            size = 64 * len(data.ack_set)
            if delivery is not None and delivery.message.count > 1:
                size = delivery.message.count
            unacked = unacked_indexes(data.ack_set, size)
            if unacked:
                # Up to the message before the first one still unacknowledged.
                through = MessageId(whole.ledger, whole.entry, unacked[0] - 1)
                if unacked[0] == 0:
                    through = MessageId(whole.ledger, whole.entry - 1)
        if through.entry < 0:
            return
        state.consumer.ack_through(state.topic, through)
        done = through
        if through.batch_index >= 0:
            done = MessageId(whole.ledger, whole.entry - 1)
        acked = 0
        for key in [key for key in state.outstanding if key <= done]:
            acked += _unacked_in(state.outstanding.pop(key))
        state.meter.acknowledged(acked)

    def on_redeliver(self, cmd: RedeliverUnacknowledgedMessages) -> None:
        state = self._states.get(cmd.consumer_id)
        if state is None:
            return
        outstanding = state.outstanding
        if cmd.message_ids:
            wanted = {from_id_data(data).whole for data in cmd.message_ids}
            back = [outstanding.pop(mid) for mid in wanted if mid in outstanding]
        else:
            back = list(outstanding.values())
            outstanding.clear()
        if back:
            state.meter.redelivering(sum(_unacked_in(delivery) for delivery in back))
            state.consumer.nack(back)

    # -- SEEK, UNSUBSCRIBE, CLOSE_CONSUMER, GET_LAST_MESSAGE_ID ----------------------------

    async def on_seek(self, cmd: Seek) -> None:
        state = self._state(cmd.consumer_id, cmd.request_id)
        if state is None:
            return
        consumer = state.consumer
        # Nothing more goes out to this consumer: what the reset hands it would be stale.
        state.scope.cancel()
        try:
            if cmd.message_publish_time is not None:
                await consumer.seek(state.topic, publish_time=cmd.message_publish_time)
            elif cmd.message_id is None or from_id_data(cmd.message_id) == EARLIEST:
                await consumer.seek(state.topic)
            elif (target := from_id_data(cmd.message_id)) == LATEST:
                last = (await consumer.position(state.topic)).last
                after = None if last is None else MessageId(last.ledger, last.entry + 1)
                await consumer.seek(state.topic, message_id=after)
            else:
                await consumer.seek(state.topic, message_id=target.whole)
            if not consumer.spec.durable:
                mark = (await consumer.position(state.topic)).mark_delete
                self._resume[(state.topic, state.subscription)] = mark or EARLIEST
        except (BackendError, ConsumerClosed) as exc:
            error = ServerError.ServiceNotReady
            if isinstance(exc, BackendError):
                error = server_error(exc)
            self._link.send(Error(request_id=cmd.request_id, error=error, message=str(exc)))
            state.scope = trio.CancelScope()
            self._link.nursery.start_soon(self._serve, state)
            return
        # The client subscribes again from the new position; CLOSE_CONSUMER has to come first.
        await self._drop(state)
        self._link.send(CloseConsumer(consumer_id=cmd.consumer_id, request_id=_BROKER_REQUEST))
        self._link.send(Success(request_id=cmd.request_id))

    async def on_unsubscribe(self, cmd: Unsubscribe) -> None:
        state = self._state(cmd.consumer_id, cmd.request_id)
        if state is None:
            return
        state.scope.cancel()
        del self._states[cmd.consumer_id]
        try:
            await state.consumer.unsubscribe()
        except BackendError as exc:
            self._link.send(
                Error(request_id=cmd.request_id, error=server_error(exc), message=str(exc))
            )
            return
        self._link.send(Success(request_id=cmd.request_id))

    async def on_close(self, cmd: CloseConsumer) -> None:
        state = self._states.get(cmd.consumer_id)
        if state is not None:
            await self._drop(state)
        self._link.send(Success(request_id=cmd.request_id))

    async def on_get_last_message_id(self, cmd: GetLastMessageId) -> None:
        state = self._state(cmd.consumer_id, cmd.request_id)
        if state is None:
            return
        try:
            position = await state.consumer.position(state.topic)
        except (BackendError, ConsumerClosed) as exc:
            self._link.send(
                Error(
                    request_id=cmd.request_id, error=ServerError.ServiceNotReady, message=str(exc)
                )
            )
            return
        last, mark = position.last, position.mark_delete
        mark_index = None
        if last is not None and mark is not None and mark.whole == last.whole:
            mark_index = last.batch_index  # the whole last entry is acknowledged
        self._link.send(
            GetLastMessageIdResponse(
                request_id=cmd.request_id,
                last_message_id=to_id_data(last),
                consumer_mark_delete_position=to_id_data(mark, mark_index),
            )
        )

    async def on_stats(self, cmd: ConsumerStats) -> None:
        """CONSUMER_STATS; an unknown consumer is told in the response, as Pulsar does."""
        link = self._link
        state = self._states.get(cmd.consumer_id)
        if state is None:
            link.send(
                ConsumerStatsResponse(
                    request_id=cmd.request_id,
                    error_code=ServerError.ConsumerNotFound,
                    error_message=f"no consumer {cmd.consumer_id} on this connection",
                )
            )
            return
        backlog = 0
        try:
            stats = await link.server.processor.topic_stats(state.topic)
        except BackendError:
            stats = None
        name = subscription_name(state.topic, state.subscription)
        for sub in () if stats is None else stats.subscriptions:
            if sub.name == name:
                backlog = sub.backlog
        link.send(
            stats_response(
                cmd.request_id,
                state.meter,
                time.time(),
                name=state.name,
                sub_type=state.sub_type,
                address=f"/{link.ctx.peer}",
                unacked=sum(_unacked_in(d) for d in state.outstanding.values()),
                backlog=backlog,
            )
        )

    # -- the end ---------------------------------------------------------------------------

    async def _drop(self, state: _ConsumerState) -> None:
        state.scope.cancel()
        if self._states.get(state.consumer_id) is state:
            del self._states[state.consumer_id]
        with trio.CancelScope(shield=True):
            await state.consumer.close()

    async def close_all(self) -> None:
        """The connection ends: unacknowledged messages go back to their subscriptions."""
        for state in list(self._states.values()):
            await self._drop(state)


def _unacked_in(delivery: Delivery) -> int:
    """Messages of a delivered entry not acknowledged yet (a batch's members count)."""
    return delivery.message.count - len(delivery.acked)


def _resume_at(mark: MessageId) -> tuple[StartPosition, MessageId | None]:
    """Start just after `mark` (a mark_delete position), or at the first message."""
    if mark == EARLIEST:
        return StartPosition.EARLIEST, None
    return StartPosition.LATEST, MessageId(mark.ledger, mark.entry + 1)


def _start(cmd: Subscribe) -> tuple[StartPosition, MessageId | None]:
    """Where a new subscription begins: a reader's start id wins over the initial position."""
    if cmd.start_message_id is not None:
        mid = from_id_data(cmd.start_message_id)
        if mid == EARLIEST:
            return StartPosition.EARLIEST, None
        if mid == LATEST or mid.ledger < 0 or mid.entry < 0:
            return StartPosition.LATEST, None
        return StartPosition.LATEST, mid.whole
    if cmd.initial_position is InitialPosition.Earliest:
        return StartPosition.EARLIEST, None
    return StartPosition.LATEST, None
