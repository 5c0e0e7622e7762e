"""Consumers in separated mode: a processor `Consumer` over consumers of the proxy's Pulsar
client.

A consumer follows each topic its selectors cover with a plain Pulsar consumer (a leg),
all under the subscription's name: the topics of exact selectors at once, the topics MQTT
filters match as the proxy's topic poller reports them (`discovery`: one listing per
namespace and period for every consumer of the proxy), and node-local `$SYS` topics from this
process (`mop.backends.node_local`). Each leg hands what arrives, a frame at a time on the trio
thread, to the consumer, which turns it into deliveries in a bounded buffer; past the bound the legs
are paused (no more permits), so a slow reader holds at most the buffer plus what the brokers
were already allowed to send.

A leg of a topic a filter matches starts a new subscription at the earliest message, so that a
topic created after the subscription (found by the next poll) loses nothing; messages published
before a selector was first subscribed (kept per selector, see `SubscriptionRegistry`) are
acknowledged and skipped. Publish times come from the publishing proxy's clock, so proxies'
clocks must agree (NTP) to better than the time between a subscription and the first message it
must see.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Final

import trio

from mop.backends.cluster.discovery import Watch
from mop.backends.cluster.errors import error_for
from mop.backends.cluster.legs import (
    Leg,
    close_leg_soon,
    close_legs,
    in_parallel,
    subscribe_leg,
    unsubscribe_legs,
)
from mop.backends.cluster.messages import incoming
from mop.backends.cluster.patterns import (
    SelectorPlan,
    matching_selectors,
    plan,
)
from mop.clock import now_ms
from mop.message import Delivery, MessageId
from mop.processor.backend import (
    BackendError,
    ConsumerClosed,
    CursorPosition,
    StartPosition,
    SubscriptionKind,
    SubscriptionSpec,
)
from mop.protocols.pulsar.commands import InitialPosition, SubType
from mop.protocols.pulsar.driver import ClientConsumer, ConsumerConfig, DriverError, Received
from mop.topic_names import is_exact_selector

if TYPE_CHECKING:
    from mop.backends.cluster.context import ClusterContext
    from mop.backends.cluster.tables import SubscriptionRegistry

__all__ = ["ClusterConsumer"]

log = logging.getLogger("mop.cluster")

_TYPES: Final = {
    SubscriptionKind.EXCLUSIVE: SubType.Exclusive,
    SubscriptionKind.SHARED: SubType.Shared,
    SubscriptionKind.FAILOVER: SubType.Failover,
    SubscriptionKind.KEY_SHARED: SubType.Key_Shared,
}
# A negative acknowledgement is redelivered after at least this long (as pulsar-client does),
# so that a consumer that nacks everything at once does not spin.
NACK_DELAY: Final = 0.1
# Acknowledgements that arrived after their pulsar consumer closed (its topic left the listing
# for a while, say), kept to acknowledge the redelivery: at most this many.
_LATE_ACKS: Final = 10_000


# (consumer, message id, leg) of a delivery handed out and not yet acknowledged.
_Held = tuple[ClientConsumer, MessageId, Leg]


class ClusterConsumer:
    """A subscription's consumer; one task at a time may wait in `receive`."""

    def __init__(
        self,
        context: ClusterContext,
        spec: SubscriptionSpec,
        since: dict[str, int],
        *,
        registry: SubscriptionRegistry,
        gone: Callable[[ClusterConsumer], None],
        leave_topics: Callable[[SubscriptionSpec, str, frozenset[str]], Awaitable[None]],
    ) -> None:
        """`since` is when each selector was first subscribed (see `SubscriptionRegistry`);
        the consumer records its selectors in `registry`, tells `gone` when it closes, and
        calls `leave_topics` when a removed selector's topics are to be left."""
        self._context = context
        self._registry = registry
        self._gone = gone
        self._leave_topics = leave_topics
        self._options = context.consumer_options
        self._spec = spec
        self._since = since
        self._legs: dict[str, Leg] = {}  # topic -> its leg
        self._exact: frozenset[str] = frozenset()  # the topics of exact selectors
        self._watch: Watch | None = None  # the filters' watch of the topic poller
        self._lock = trio.Lock()  # one change of the legs at a time
        # Topics the poller reported and not yet taken (True) or dropped (False).
        self._pending: dict[str, bool] = {}
        self._syncing = False
        self._buffer: deque[Delivery] = deque()
        self._held: dict[tuple[str, MessageId], _Held] = {}
        self._late_acks: OrderedDict[tuple[str, MessageId], None] = OrderedDict()
        self._thresholds: dict[str, int | None] = {}
        self._permits = 0
        self._paused = False
        self._closed = False
        self._wakeup: trio.Event | None = None

    # -- set-up ----------------------------------------------------------------------------

    @property
    def spec(self) -> SubscriptionSpec:
        return self._spec

    @property
    def closed(self) -> bool:
        return self._closed

    def _plan(self, selectors: Iterable[str]) -> SelectorPlan:
        return plan(selectors, tenant=self._context.tenant, namespace=self._context.namespace)

    async def open(self) -> None:
        """Attach to the subscription (called once, by the backend)."""
        try:
            async with self._lock:
                await self._follow(self._plan(self._spec.selectors))
        except BaseException:
            self.abort()
            raise

    async def _follow(self, selector_plan: SelectorPlan) -> None:
        """Follow what `selector_plan` covers: node-local topics, the filters' watch, and a
        leg for every covered topic that has none yet (legs no longer covered stay)."""
        context = self._context
        context.local.follow(self, self._spec.name, selector_plan.local)
        known: list[str] = []
        if not selector_plan.filters:
            self._close_watch()
        elif self._watch is not None:
            known = self._watch.update(selector_plan.filters)
        else:
            watch, known = await context.discovery.watch(
                context.tenant, context.namespace, selector_plan.filters, self
            )
            if self._closed:
                watch.close()
                return
            self._watch = watch
        self._exact = selector_plan.exact
        wanted = [t for t in dict.fromkeys([*sorted(self._exact), *known]) if t not in self._legs]
        failures = await self._open_legs(wanted)
        if failures:
            raise failures[0][1]

    def _close_watch(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()

    def _follows(self, topic: str) -> bool:
        return bool(
            matching_selectors(
                topic,
                self._spec.selectors,
                tenant=self._context.tenant,
                namespace=self._context.namespace,
            )
        )

    def _config(self, *, earliest: bool) -> ConsumerConfig:
        spec = self._spec
        return ConsumerConfig(
            sub_type=_TYPES[spec.kind],
            receiver_queue=self._options.receiver_queue,
            initial_position=InitialPosition.Earliest if earliest else InitialPosition.Latest,
            name=spec.consumer_name or None,
        )

    def _sink(self, leg: Leg) -> Callable[[ClientConsumer, list[Received]], None]:
        epoch = leg.epoch

        def sink(consumer: ClientConsumer, items: list[Received]) -> None:
            if self._closed or leg.closed or epoch != leg.epoch:
                return  # not acknowledged: it goes back to the subscription
            took = False
            for item in items:
                took = self._take(consumer, item, leg) or took
            if len(self._buffer) >= self._options.buffer:
                # Every time: it costs little, and no leg is missed whatever opened meanwhile.
                self._paused = True
                for other in self._legs.values():
                    if other.consumer is not None:
                        other.consumer.pause()
            if took and self._wakeup is not None:
                self._wakeup.set()

        return sink

    def _earliest(self, topic: str) -> bool:
        # A leg of a topic only exact selectors name subscribes before anything can be
        # published to it that it must see; a topic a filter matches may be found only after
        # its first messages, so it starts at the earliest one and skips by publish time.
        if self._spec.start is StartPosition.EARLIEST:
            return True
        found = matching_selectors(
            topic,
            self._spec.selectors,
            tenant=self._context.tenant,
            namespace=self._context.namespace,
        )
        return not all(is_exact_selector(selector) for selector in found)

    async def _open_legs(self, topics: list[str]) -> list[tuple[str, BackendError]]:
        """Open a leg for each of `topics`; the ones that failed."""
        opened: list[Leg] = []
        failures: list[tuple[str, BackendError]] = []
        client = self._context.client()
        name = self._spec.name

        async def open_one(topic: str) -> None:
            leg = Leg(topic)
            config = self._config(earliest=self._earliest(topic))
            try:
                await subscribe_leg(
                    client, leg, name, config, self._sink(leg), self._options.busy_timeout
                )
            except BackendError as exc:
                failures.append((topic, exc))
            else:
                opened.append(leg)

        try:
            await in_parallel(topics, open_one)
        except BaseException:
            for leg in opened:
                close_leg_soon(leg)
            raise
        for leg in opened:
            if self._closed or leg.topic in self._legs:
                close_leg_soon(leg)
                continue
            self._legs[leg.topic] = leg
            if self._paused and leg.consumer is not None:
                leg.consumer.pause()
        return failures

    # -- what the topic poller and the node-local topics report ---------------------------

    def topics_found(self, topics: list[str]) -> None:
        self._queue(topics, present=True)

    def topics_gone(self, topics: list[str]) -> None:
        self._queue(topics, present=False)

    def _queue(self, topics: list[str], *, present: bool) -> None:
        if self._closed:
            return
        for topic in topics:
            self._pending[topic] = present
        if not self._syncing:
            self._syncing = True
            self._context.nursery.start_soon(self._sync)

    async def _sync(self) -> None:
        """Open legs for topics that appeared, close those of topics that went (but not the
        topics of exact selectors: those are followed whether listed or not)."""
        try:
            async with self._lock:
                while self._pending and not self._closed:
                    pending, self._pending = self._pending, {}
                    gone = [
                        self._legs.pop(topic)
                        for topic, present in pending.items()
                        if not present and topic in self._legs and topic not in self._exact
                    ]
                    await self._close_legs(gone)
                    found = [
                        topic
                        for topic, present in pending.items()
                        if present and topic not in self._legs and self._follows(topic)
                    ]
                    failures = await self._open_legs(found)
                    if failures:
                        self._retry_later([topic for topic, _ in failures], failures[0][1])
        finally:
            self._syncing = False

    def _retry_later(self, topics: list[str], error: BackendError) -> None:
        log.warning(
            "subscription %r: %d new topic(s) not followed yet (%s); trying again",
            self._spec.name,
            len(topics),
            error,
        )
        self._context.delays.call_later(
            self._options.pattern_discovery, lambda: self.topics_found(topics)
        )

    def deliver_local(self, delivery: Delivery) -> None:
        """A message of a node-local topic. Its latest value is what counts, so a consumer
        whose buffer is full drops it rather than hold more."""
        if self._closed or len(self._buffer) >= self._options.buffer:
            return
        self._buffer.append(delivery)
        if self._wakeup is not None:
            self._wakeup.set()

    # -- what the legs hand over -----------------------------------------------------------

    def _take(self, consumer: ClientConsumer, item: Received, leg: Leg) -> bool:
        topic = leg.topic
        message_id = item.message_id
        key = (topic, message_id)
        if key in self._held:
            # A redelivery of a message still held (after a reconnect or a reopened leg): keep
            # the one handed out, acknowledge through the consumer that has it now.
            self._held[key] = (consumer, message_id, leg)
            return False
        if key in self._late_acks:
            del self._late_acks[key]
            consumer.ack(message_id)
            return False
        decoded = incoming(
            item.payload,
            item.properties,
            partition_key=item.key,
            publish_time=item.publish_time,
            event_time=item.event_time,
            producer_name=item.producer_name,
            encrypted=item.encrypted,
        )
        threshold = self._threshold(topic)
        expired = decoded.expires_at and decoded.expires_at <= now_ms()
        if threshold is None or decoded.publish_time < threshold or expired:
            consumer.ack(message_id)
            return False
        self._held[key] = (consumer, message_id, leg)
        self._buffer.append(
            Delivery(topic, message_id, decoded, redelivery_count=item.redelivery_count)
        )
        return True

    def _threshold(self, topic: str) -> int | None:
        """The earliest publish time delivered from `topic`; None when no selector matches."""
        if topic in self._thresholds:
            return self._thresholds[topic]
        found = matching_selectors(
            topic,
            self._spec.selectors,
            tenant=self._context.tenant,
            namespace=self._context.namespace,
        )
        threshold = min((self._since.get(s, 0) for s in found), default=None)
        self._thresholds[topic] = threshold
        return threshold

    # -- Consumer --------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ConsumerClosed(f"consumer of {self._spec.name!r} is closed")

    async def receive(self, max_messages: int) -> list[Delivery]:
        if max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        if self._wakeup is not None:
            raise trio.BusyResourceError("another task is already receiving from this consumer")
        await trio.lowlevel.checkpoint()
        while True:
            self._check_open()
            count = min(max_messages, len(self._buffer))
            if self._spec.permits:
                count = min(count, self._permits)
            if count > 0:
                self._permits -= count if self._spec.permits else 0
                taken = [self._buffer.popleft() for _ in range(count)]
                self._resume_if_low()
                return taken
            event = self._wakeup = trio.Event()
            try:
                await event.wait()
            finally:
                self._wakeup = None

    def _resume_if_low(self) -> None:
        if self._paused and len(self._buffer) <= self._options.buffer // 2:
            self._paused = False
            for leg in self._legs.values():
                if leg.consumer is not None and not leg.closed:
                    leg.consumer.resume()

    def ack(self, deliveries: Iterable[Delivery]) -> None:
        for delivery in deliveries:
            key = (delivery.topic, delivery.message_id)
            held = self._held.pop(key, None)
            if held is None:
                continue
            consumer, message_id, leg = held
            if leg.closed and not self._closed:
                self._late_acks[key] = None
                if len(self._late_acks) > _LATE_ACKS:
                    self._late_acks.popitem(last=False)
            elif not leg.closed:
                consumer.ack(message_id)

    def nack(self, deliveries: Iterable[Delivery], delay: float = 0.0) -> None:
        for delivery in deliveries:
            held = self._held.pop((delivery.topic, delivery.message_id), None)
            if held is None:
                continue
            consumer, message_id, leg = held
            if leg.closed:
                continue  # its consumer's close handed it back already
            self._context.delays.call_later(
                max(delay, NACK_DELAY), _later_nack(consumer, message_id, leg)
            )

    def ack_through(self, topic: str, message_id: MessageId) -> None:
        held = self._held.get((topic, message_id))
        if held is None:
            raise BackendError(
                "a cumulative acknowledgement needs a message this consumer holds in"
                " separated mode",
                reason="not_supported",
            )
        consumer, held_id, leg = held
        if not leg.closed:
            consumer.ack_cumulative(held_id)
        for key in [k for k in self._held if k[0] == topic and k[1] <= message_id]:
            del self._held[key]

    def grant(self, permits: int) -> None:
        self._permits += permits
        if self._wakeup is not None and self._buffer:
            self._wakeup.set()

    async def seek(
        self, topic: str, *, message_id: MessageId | None = None, publish_time: int | None = None
    ) -> None:
        self._check_open()
        leg = self._single_leg(topic, "seek")
        consumer = leg.consumer
        assert consumer is not None  # a leg that is not closed has its consumer
        self._forget_topic(topic)
        leg.epoch += 1
        try:
            if publish_time is not None:
                await consumer.seek(publish_time=publish_time)
            else:
                await consumer.seek(message_id or MessageId(-1, -1))
        except DriverError as exc:
            raise error_for(exc, f"seeking on {topic}") from None
        finally:
            leg.epoch += 1  # what arrived while the seek was on its way is from before it
            self._forget_topic(topic)
        # The leg's sink belongs to the epoch it was made in: give it the current one.
        consumer.set_sink(self._sink(leg))

    def _forget_topic(self, topic: str) -> None:
        self._buffer = deque(d for d in self._buffer if d.topic != topic)
        for key in [k for k in self._held if k[0] == topic]:
            del self._held[key]

    def _single_leg(self, topic: str, what: str) -> Leg:
        leg = self._legs.get(topic)
        if leg is not None and not leg.closed and topic in self._exact:
            return leg
        raise BackendError(
            f"{what} works on the topic of an exact selector in separated mode (a topic a"
            " filter matches may not be followed yet)",
            reason="not_supported",
        )

    async def position(self, topic: str) -> CursorPosition:
        self._check_open()
        raise BackendError(
            "the position of a subscription is not available in separated mode"
            " (the protocol does not tell a consumer its mark-delete position)",
            reason="not_supported",
        )

    @property
    def active(self) -> bool:
        raise BackendError(
            "failover activity is not available in separated mode",
            reason="not_supported",
        )

    async def active_changed(self) -> bool:
        await trio.lowlevel.checkpoint()
        return self.active

    # -- selectors -------------------------------------------------------------------------

    async def add_selector(self, selector: str) -> None:
        self._check_open()
        if selector in self._spec.selectors:
            await trio.lowlevel.checkpoint()
            return
        selectors = self._spec.selectors | {selector}
        selector_plan = self._plan(selectors)
        self._since[selector] = 0 if self._spec.start is StartPosition.EARLIEST else now_ms()
        await self._registry.record(self._spec, self._since)
        async with self._lock:
            self._check_open()
            before = self._spec.selectors
            self._set_selectors(selectors)
            try:
                await self._follow(selector_plan)
            except BaseException:
                # Go back to the selectors that worked; if even that fails, the consumer ends.
                self._set_selectors(before)
                try:
                    await self._close_legs(self._uncovered())
                    await self._follow(self._plan(before))
                except BaseException:
                    self.abort()
                    raise
                raise

    async def remove_selector(self, selector: str) -> None:
        """Stop following `selector`: the legs of topics no other selector covers close, and
        the subscription leaves those topics (a removed selector's backlog is not kept)."""
        self._check_open()
        if selector not in self._spec.selectors:
            await trio.lowlevel.checkpoint()
            return
        selectors = self._spec.selectors - {selector}
        selector_plan = self._plan(selectors) if selectors else SelectorPlan()
        self._since.pop(selector, None)
        await self._registry.record(self._spec, self._since)
        async with self._lock:
            self._check_open()
            self._set_selectors(selectors)
            try:
                await self._close_legs(self._uncovered())
                await self._follow(selector_plan)
                await self._leave_topics(self._spec, selector, selectors)
            except BaseException:
                self.abort()
                raise

    def _set_selectors(self, selectors: frozenset[str]) -> None:
        self._spec = dataclasses.replace(self._spec, selectors=selectors)
        self._thresholds.clear()

    def _uncovered(self) -> list[Leg]:
        """Take out the legs of topics no selector covers any more."""
        return [self._legs.pop(t) for t in list(self._legs) if not self._follows(t)]

    # -- closing ---------------------------------------------------------------------------

    def _shutdown(self) -> list[Leg]:
        """Stop delivering and wake a waiting `receive` (which then raises)."""
        self._closed = True
        legs = list(self._legs.values())
        self._legs = {}
        for leg in legs:
            leg.closed = True
        self._close_watch()
        self._pending.clear()
        self._context.local.follow(self, self._spec.name, ())
        self._buffer.clear()
        self._held.clear()
        self._gone(self)
        if self._wakeup is not None:
            self._wakeup.set()
        return legs

    async def close(self) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        if not self._spec.durable:
            await self.unsubscribe()  # a non-durable subscription goes with its consumer
            return
        await self._close_legs(self._shutdown())

    async def unsubscribe(self) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        legs = self._shutdown()
        with trio.CancelScope(shield=True):
            others = await self._registry.leave(self._spec)
            if others:
                await self._close_legs(legs)  # the other members keep the subscription
            else:
                await self._unsubscribe_legs(legs)

    async def delete(self) -> None:
        """Delete the subscription on every topic this consumer covers (the backend's own
        clean-up; no member bookkeeping)."""
        with trio.CancelScope(shield=True):
            await self._unsubscribe_legs(self._shutdown())

    async def _unsubscribe_legs(self, legs: list[Leg]) -> None:
        await unsubscribe_legs(legs, self._spec.name)

    async def _close_legs(self, legs: list[Leg]) -> None:
        await close_legs(legs, self._options.busy_timeout)

    async def close_for_shutdown(self) -> None:
        """The backend stops: close now, waiting for the brokers' answers (no unsubscribing)."""
        await self._close_legs(self._shutdown())

    def abort(self) -> None:
        """The backend stops: close without waiting."""
        for leg in self._shutdown():
            close_leg_soon(leg)


def _later_nack(consumer: ClientConsumer, message_id: MessageId, leg: Leg) -> Callable[[], None]:
    def nack() -> None:
        if not leg.closed:
            consumer.redeliver([message_id])

    return nack
