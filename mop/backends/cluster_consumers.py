"""Consumers in separated mode: a processor `Consumer` over pulsar-client consumers.

The selectors of a consumer become one pattern consumer per namespace (or a plain consumer
for a lone exact topic), all under the subscription's name. pulsar-client's listener thread
appends messages to an inbox and wakes the trio thread, which turns them into deliveries in a
bounded buffer; past the bound the listener is paused, so a slow reader holds at most the
buffer plus the client's receiver queue in memory.

New subscriptions start at the earliest message so that a topic created after the subscription
(found by the pattern consumer's next poll) loses nothing; messages published before a
selector was first subscribed (kept per selector, see `SubscriptionRegistry`) are acknowledged
and skipped. Publish times come from the publishing proxy's clock, so proxies' clocks must
agree (NTP) to better than the time between a subscription and the first message it must see.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import _pulsar
import trio

from mop.backends.cluster_bridge import ignore_result
from mop.backends.cluster_messages import incoming
from mop.backends.cluster_patterns import (
    SelectorPlan,
    UnsupportedSelector,
    matching_selectors,
    plan,
)
from mop.backends.cluster_producers import message_id_of
from mop.backends.cluster_timing import now_ms
from mop.message import Delivery, MessageId
from mop.processor.backend import (
    BackendError,
    ConsumerClosed,
    CursorPosition,
    StartPosition,
    SubscriptionKind,
    SubscriptionSpec,
)

if TYPE_CHECKING:
    from mop.backends.cluster import ClusterBackend

__all__ = ["ClusterConsumer", "ConsumerOptions"]

log = logging.getLogger("mop.cluster")

_TYPES: Final = {
    SubscriptionKind.EXCLUSIVE: _pulsar.ConsumerType.Exclusive,
    SubscriptionKind.SHARED: _pulsar.ConsumerType.Shared,
    SubscriptionKind.FAILOVER: _pulsar.ConsumerType.Failover,
    SubscriptionKind.KEY_SHARED: _pulsar.ConsumerType.KeyShared,
}
# pulsar-client redelivers a negative acknowledgement after at least this long; a longer delay
# is waited out here before the nack is handed to the client.
NACK_DELAY: Final = 0.1
# Acknowledgements that arrived after their pulsar consumer closed (a selector change rebuilds
# it), kept to acknowledge the redelivery: at most this many.
_LATE_ACKS: Final = 10_000


@dataclass(frozen=True, slots=True)
class ConsumerOptions:
    # Messages taken from pulsar-client and not yet received before the listener pauses.
    buffer: int = 1000
    # pulsar-client's prefetch per topic (and, times four, across the topics of a pattern).
    receiver_queue: int = 500
    # Seconds between the topic-list polls of a pattern consumer.
    pattern_discovery: int = 1
    # How long a subscribe retries while the subscription is held by a consumer that is going.
    busy_timeout: float = 10.0


class _Leg:
    """One pulsar-client consumer of a ClusterConsumer."""

    __slots__ = ("closed", "consumer", "epoch", "single")

    def __init__(self, single: str | None) -> None:
        self.consumer: Any = None
        self.closed = False
        self.single = single  # the topic of a plain consumer, None for a pattern consumer
        # Bumped by a seek: messages the listener tagged with an older epoch are dropped.
        self.epoch = 0


# (pulsar consumer, pulsar message id, leg) of a delivery handed out and not yet acknowledged.
_Held = tuple[Any, Any, _Leg]


class ClusterConsumer:
    """A subscription's consumer; one task at a time may wait in `receive`."""

    def __init__(
        self, backend: ClusterBackend, spec: SubscriptionSpec, since: dict[str, int]
    ) -> None:
        self._backend = backend
        self._bridge = backend.bridge
        self._options = backend.consumer_options
        self._spec = spec
        self._since = since
        self._legs: list[_Leg] = []
        self._inbox: deque[tuple[_Leg, Any, Any, int]] = deque()
        self._drain_scheduled = False
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
        try:
            return plan(selectors, tenant=self._backend.tenant, namespace=self._backend.namespace)
        except UnsupportedSelector as exc:
            raise BackendError(str(exc), reason="not_supported") from None

    async def open(self) -> None:
        """Attach to the subscription (called once, by the backend)."""
        self._legs = await self._open_legs(self._plan(self._spec.selectors))

    def _config(self, leg: _Leg) -> Any:
        options = self._options
        spec = self._spec
        conf = _pulsar.ConsumerConfiguration()
        conf.consumer_type(_TYPES[spec.kind])
        conf.receiver_queue_size(options.receiver_queue)
        conf.max_total_receiver_queue_size_across_partitions(options.receiver_queue * 4)
        conf.pattern_auto_discovery_period(options.pattern_discovery)
        conf.regex_subscription_mode(_pulsar.RegexSubscriptionMode.PersistentOnly)
        conf.negative_ack_redelivery_delay_ms(int(NACK_DELAY * 1000))
        # A plain consumer of an exact topic subscribes before anything can be published to
        # it that it must see; a pattern consumer may find a topic only after its first
        # messages, so it starts at the earliest one and skips by publish time.
        earliest = leg.single is None or spec.start is StartPosition.EARLIEST
        conf.subscription_initial_position(
            _pulsar.InitialPosition.Earliest if earliest else _pulsar.InitialPosition.Latest
        )
        if spec.consumer_name:
            conf.consumer_name(spec.consumer_name)

        def listener(consumer: Any, message: Any) -> None:
            # On a pulsar-client listener thread: hand over, wake the trio thread once.
            self._inbox.append((leg, consumer, message, leg.epoch))
            if not self._drain_scheduled:
                self._drain_scheduled = True
                self._bridge.soon(self._drain)

        conf.message_listener(listener)
        return conf

    async def _open_legs(self, selector_plan: SelectorPlan) -> list[_Leg]:
        legs: list[_Leg] = []
        try:
            if selector_plan.single is not None:
                legs.append(await self._open_leg(selector_plan.single, pattern=False))
            for pattern in selector_plan.patterns.values():
                legs.append(await self._open_leg(pattern, pattern=True))
        except BaseException:
            for leg in legs:
                self._close_leg_soon(leg)
            raise
        return legs

    async def _open_leg(self, target: str, *, pattern: bool) -> _Leg:
        leg = _Leg(None if pattern else target)
        conf = self._config(leg)
        client = self._backend.client
        name = self._spec.name
        subscribe = client.subscribe_async_pattern if pattern else client.subscribe_async
        delay = 0.05
        with trio.move_on_after(self._options.busy_timeout) as scope:
            while True:
                try:
                    leg.consumer = await self._bridge.call(
                        lambda done: subscribe(target, name, conf, done),
                        f"subscribing {name!r} to {target}",
                        cleanup=_close_quietly,
                    )
                    return leg
                except BackendError as exc:
                    if exc.reason != "consumer_busy":
                        raise
                    # Still held by a consumer that is closing (e.g. a session taken over).
                    await trio.sleep(delay)
                    delay = min(delay * 2, 0.5)
        assert scope.cancelled_caught
        raise BackendError(f"subscription {name!r} on {target} stays busy", reason="consumer_busy")

    # -- the listener's side ---------------------------------------------------------------

    def _drain(self) -> None:
        self._drain_scheduled = False
        inbox = self._inbox
        took = False
        while inbox:
            leg, consumer, message, epoch = inbox.popleft()
            if self._closed or leg.closed or epoch != leg.epoch:
                continue  # not acknowledged: it goes back to the subscription
            took = self._take(consumer, message, leg) or took
        if len(self._buffer) >= self._options.buffer:
            # Every time: discovering a topic lets pulsar-client resume a paused listener.
            self._paused = True
            for leg in self._legs:
                if leg.consumer is not None:
                    leg.consumer.pause_message_listener()
        if took and self._wakeup is not None:
            self._wakeup.set()

    def _take(self, consumer: Any, message: Any, leg: _Leg) -> bool:
        topic = message.topic_name()
        pulsar_id = message.message_id()
        key = (topic, message_id_of(pulsar_id))
        if key in self._held:
            # A redelivery of a message still held (after a reconnect or a rebuild): keep the
            # one handed out, acknowledge through the consumer that has it now.
            self._held[key] = (consumer, pulsar_id, leg)
            return False
        if key in self._late_acks:
            del self._late_acks[key]
            consumer.acknowledge_async(pulsar_id, ignore_result)
            return False
        decoded = incoming(
            message.data(),
            message.properties(),
            partition_key=message.partition_key(),
            publish_time=message.publish_timestamp(),
            event_time=message.event_timestamp(),
            producer_name=message.producer_name(),
        )
        threshold = self._threshold(topic)
        expired = decoded.expires_at and decoded.expires_at <= now_ms()
        if threshold is None or decoded.publish_time < threshold or expired:
            consumer.acknowledge_async(pulsar_id, ignore_result)
            return False
        self._held[key] = (consumer, pulsar_id, leg)
        self._buffer.append(
            Delivery(topic, key[1], decoded, redelivery_count=message.redelivery_count())
        )
        return True

    def _threshold(self, topic: str) -> int | None:
        """The earliest publish time delivered from `topic`; None when no selector matches."""
        if topic in self._thresholds:
            return self._thresholds[topic]
        found = matching_selectors(
            topic,
            self._spec.selectors,
            tenant=self._backend.tenant,
            namespace=self._backend.namespace,
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
            for leg in self._legs:
                if leg.consumer is not None and not leg.closed:
                    leg.consumer.resume_message_listener()

    def ack(self, deliveries: Iterable[Delivery]) -> None:
        for delivery in deliveries:
            key = (delivery.topic, delivery.message_id)
            held = self._held.pop(key, None)
            if held is None:
                continue
            consumer, pulsar_id, leg = held
            if leg.closed and not self._closed:
                self._late_acks[key] = None
                if len(self._late_acks) > _LATE_ACKS:
                    self._late_acks.popitem(last=False)
            elif not leg.closed:
                consumer.acknowledge_async(pulsar_id, ignore_result)

    def nack(self, deliveries: Iterable[Delivery], delay: float = 0.0) -> None:
        for delivery in deliveries:
            held = self._held.pop((delivery.topic, delivery.message_id), None)
            if held is None:
                continue
            consumer, pulsar_id, leg = held
            if leg.closed:
                continue  # its consumer's close handed it back already
            if delay <= NACK_DELAY:
                consumer.negative_acknowledge(pulsar_id)
            else:
                self._backend.delays.call_later(
                    delay - NACK_DELAY, _later_nack(consumer, pulsar_id, leg)
                )

    def ack_through(self, topic: str, message_id: MessageId) -> None:
        held = self._held.get((topic, message_id))
        if held is None:
            raise BackendError(
                "a cumulative acknowledgement needs a message this consumer holds in"
                " separated mode",
                reason="not_supported",
            )
        consumer, pulsar_id, leg = held
        if not leg.closed:
            consumer.acknowledge_cumulative_async(pulsar_id, ignore_result)
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
        target: Any
        if publish_time is not None:
            target = publish_time
        elif message_id is not None:
            target = _pulsar.MessageId(
                -1, message_id.ledger, message_id.entry, message_id.batch_index
            )
        else:
            target = _pulsar.MessageId.earliest
        self._forget_topic(topic)
        leg.epoch += 1
        try:
            await self._bridge.call(
                lambda done: leg.consumer.seek_async(target, done), f"seeking on {topic}"
            )
        finally:
            leg.epoch += 1  # what arrived while the seek was on its way is from before it
            self._forget_topic(topic)

    def _forget_topic(self, topic: str) -> None:
        self._buffer = deque(d for d in self._buffer if d.topic != topic)
        for key in [k for k in self._held if k[0] == topic]:
            del self._held[key]

    def _single_leg(self, topic: str, what: str) -> _Leg:
        for leg in self._legs:
            if leg.single == topic and not leg.closed:
                return leg
        raise BackendError(
            f"{what} works on a consumer of one exact topic in separated mode"
            " (pulsar-client cannot reposition one topic of a pattern consumer)",
            reason="not_supported",
        )

    async def position(self, topic: str) -> CursorPosition:
        self._check_open()
        raise BackendError(
            "the position of a subscription is not available in separated mode"
            " (pulsar-client does not expose the mark-delete position)",
            reason="not_supported",
        )

    @property
    def active(self) -> bool:
        raise BackendError(
            "failover activity is not available in separated mode"
            " (pulsar-client for Python has no consumer event listener)",
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
        await self._backend.registry.record(self._spec, self._since)
        await self._rebuild(selectors, selector_plan)

    async def remove_selector(self, selector: str) -> None:
        self._check_open()
        if selector not in self._spec.selectors:
            await trio.lowlevel.checkpoint()
            return
        selectors = self._spec.selectors - {selector}
        selector_plan = self._plan(selectors) if selectors else SelectorPlan()
        self._since.pop(selector, None)
        await self._backend.registry.record(self._spec, self._since)
        await self._rebuild(selectors, selector_plan, dropped=selector)

    async def _rebuild(
        self, selectors: frozenset[str], selector_plan: SelectorPlan, dropped: str | None = None
    ) -> None:
        """Replace the pulsar consumers for new selectors; the durable cursors stay (same
        subscription), and deliveries still held are acknowledged through the new ones."""
        old, before = self._legs, self._spec.selectors
        self._legs = []
        await self._close_legs(old)
        self._spec = dataclasses.replace(self._spec, selectors=selectors)
        self._thresholds.clear()
        self._paused = False  # new consumers start with their listeners running
        try:
            if dropped is not None:
                await self._backend.leave_topics(self._spec, dropped, selectors)
            if selectors:
                self._legs = await self._open_legs(selector_plan)
        except BaseException:
            # Go back to the selectors that worked; if even that fails, the consumer ends.
            self._spec = dataclasses.replace(self._spec, selectors=before)
            self._thresholds.clear()
            try:
                self._legs = await self._open_legs(self._plan(before)) if before else []
            except BaseException:
                self.abort()
                raise
            raise

    # -- closing ---------------------------------------------------------------------------

    def _shutdown(self) -> list[_Leg]:
        """Stop delivering and wake a waiting `receive` (which then raises)."""
        self._closed = True
        legs, self._legs = self._legs, []
        for leg in legs:
            leg.closed = True
        self._buffer.clear()
        self._held.clear()
        self._backend.consumer_gone(self)
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
            others = await self._backend.registry.leave(self._spec)
            if others:
                await self._close_legs(legs)  # the other members keep the subscription
            else:
                await self._unsubscribe_legs(legs)

    async def delete(self) -> None:
        """Delete the subscription on every topic this consumer covers (the backend's own
        clean-up; no member bookkeeping)."""
        with trio.CancelScope(shield=True):
            await self._unsubscribe_legs(self._shutdown())

    async def _unsubscribe_legs(self, legs: list[_Leg]) -> None:
        for leg in legs:
            consumer, leg.consumer = leg.consumer, None  # see _close_leg_soon
            if consumer is None:
                continue
            try:
                await self._bridge.call(
                    consumer.unsubscribe_async, f"unsubscribing {self._spec.name!r}"
                )
            except BackendError as exc:
                log.warning("%s", exc)
                _close_quietly(consumer)

    async def _close_legs(self, legs: list[_Leg]) -> None:
        for leg in legs:
            leg.closed = True
        with trio.CancelScope(shield=True), trio.move_on_after(self._options.busy_timeout):
            for leg in legs:
                consumer, leg.consumer = leg.consumer, None
                if consumer is None:
                    continue
                try:
                    await self._bridge.call(consumer.close_async, "closing a consumer")
                except BackendError as exc:
                    log.debug("%s", exc)

    def _close_leg_soon(self, leg: _Leg) -> None:
        # Dropping the handle matters: pulsar-client keeps the listener, which refers to the
        # leg, so a leg that kept its consumer would keep the client's threads alive forever.
        leg.closed = True
        consumer, leg.consumer = leg.consumer, None
        if consumer is not None:
            _close_quietly(consumer)

    async def close_for_shutdown(self) -> None:
        """The backend stops: close now, waiting for pulsar-client (no unsubscribing)."""
        await self._close_legs(self._shutdown())

    def abort(self) -> None:
        """The backend stops: close without waiting."""
        for leg in self._shutdown():
            self._close_leg_soon(leg)


def _later_nack(consumer: Any, pulsar_id: Any, leg: _Leg) -> Callable[[], None]:
    def nack() -> None:
        if not leg.closed:
            consumer.negative_acknowledge(pulsar_id)

    return nack


def _close_quietly(handle: Any) -> None:
    handle.close_async(ignore_result)
