"""Fan-out inside a separated-mode proxy for non-durable exclusive subscriptions.

A durable subscription needs its own cursor at the broker, so it gets its own consumers
(`consumers`). A non-durable exclusive one (an MQTT clean session) keeps nothing at the
broker, so the proxy follows each topic once, for all of them: one reader per topic per proxy
(a non-durable broker subscription whose name starts with the proxy's own `mop-proxy-<random>`
prefix), opened when the first local consumer needs the topic and closed a grace period after
the last one left. Each message is decoded once and handed, in
memory and in topic order, to every local consumer whose selectors match it; the broker sends
it to the proxy once, not once per subscriber.

Which consumers a message goes to is decided when it arrives (a trie of the consumers' filters
and a table of their exact topics), so a consumer gets the messages of a topic from the moment
it subscribes, whether or not the topic poller has reported the topic yet. Each consumer skips
what was published before it subscribed (by publish time, as `consumers` does: the
proxies' clocks must agree), since a reader shared with earlier consumers may hold older
messages. A reader of a topic that a filter matches starts at the topic's earliest message, so
that a topic found by the poller after its first messages loses nothing; one of a topic that
only exact selectors name starts at its end, and is open before the subscribe call returns.

Each consumer has a bounded backlog (`fanout_consumer`). A full consumer does not slow
the reader down, which would stall every other consumer of the topic; it loses messages
instead, with the rule of merged mode (counted in `FanOut.dropped`). A consumer that keeps up
loses nothing. A reader hands each frame it receives to the routing here, on the trio thread,
and gives the broker its permits back as it does; when the proxy as a whole falls behind, its
connections' reads slow down and the brokers stop sending: that is the only back-pressure,
and it is shared.
"""

from __future__ import annotations

import itertools
import logging
import secrets
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Final

import trio

from mop.backends.cluster.discovery import Watch
from mop.backends.cluster.errors import error_for
from mop.backends.cluster.fanout_consumer import FanOutConsumer
from mop.backends.cluster.legs import in_parallel, one_error_for_callers
from mop.backends.cluster.messages import incoming
from mop.backends.cluster.patterns import SelectorPlan
from mop.clock import now_ms
from mop.message import Delivery, MessageId
from mop.messaging import QUEUE_FULL
from mop.processor.backend import (
    BackendError,
    StartPosition,
    SubscriptionKind,
    SubscriptionSpec,
)
from mop.protocols.pulsar.driver import (
    ClientConsumer,
    ConsumerConfig,
    DriverError,
    Received,
    subscribe,
)
from mop.topic_names import pulsar_to_mqtt
from mop.topics import SubscriptionTrie, matches

if TYPE_CHECKING:
    from mop.backends.cluster.context import ClusterContext

__all__ = ["FanOut", "fans_out"]

log = logging.getLogger("mop.cluster")

# Seconds a reader no consumer needs stays open, in case one comes back (a reconnect).
GRACE: Final = 5.0
# Messages each reader prefetches.
_RECEIVER_QUEUE: Final = 1000


# Where a reader starts: the topic's first message, or its end (pulsar-client's
# MessageId.earliest and MessageId.latest).
_EARLIEST: Final = MessageId(-1, -1)
_LATEST: Final = MessageId((1 << 63) - 1, (1 << 63) - 1)


def fans_out(spec: SubscriptionSpec) -> bool:
    """Whether `spec` is served by the proxy's fan-out: non-durable, exclusive, starting now.
    Shared groups are dispatched by the broker; durable ones need their own cursors."""
    return (
        not spec.durable
        and spec.kind is SubscriptionKind.EXCLUSIVE
        and spec.start is StartPosition.LATEST
        and spec.start_at is None
        and not spec.whole_batches
    )


class _Follower:
    """The reader of one topic, shared by every local consumer its messages go to."""

    __slots__ = ("closed", "error", "mqtt", "opened", "reader", "route", "route_key", "topic")

    def __init__(self, topic: str, mqtt: str | None) -> None:
        self.topic = topic
        self.mqtt = mqtt  # the MQTT name, None outside the backend's namespace
        self.reader: ClientConsumer | None = None
        self.opened = trio.Event()
        self.error: BackendError | None = None
        self.closed = False
        # (consumer, earliest publish time it takes) of every consumer this topic goes to,
        # valid while the hub's routing key equals `route_key`.
        self.route: list[tuple[FanOutConsumer, int]] = []
        self.route_key: tuple[int, int] = (-1, -1)


_Entry = tuple["FanOutConsumer", int]  # a consumer and the subscribe time of one selector


class FanOut:
    """The proxy's topic readers and the local consumers they feed (one per backend)."""

    def __init__(
        self, context: ClusterContext, *, report_dropped: Callable[[str, str, int], None]
    ) -> None:
        """`report_dropped(subscription, reason, count)` hears of each message a consumer's
        full queue drops."""
        self.context = self._context = context
        self._report_dropped = report_dropped
        self.subscription_prefix = f"mop-proxy-{secrets.token_hex(6)}"
        self._followers: dict[str, _Follower] = {}
        self._trie: SubscriptionTrie[int, _Entry] = SubscriptionTrie()
        self._exact: dict[str, dict[int, _Entry]] = {}
        self._exact_changes = 0
        # Filters of every consumer (how many hold each) and the poller's watch of them.
        self._filters: dict[str, int] = {}
        self._filters_ready: dict[str, trio.Event] = {}
        self._watch: Watch | None = None
        self._watch_lock = trio.Lock()
        self._discovered: set[str] = set()  # topics the poller reported for the filters
        self._keys = itertools.count()
        self._consumers: dict[int, FanOutConsumer] = {}
        self._closed = False
        self.dropped = 0

    @property
    def followed(self) -> list[str]:
        """The topics read now."""
        return [t for t, f in self._followers.items() if not f.closed]

    def key(self) -> int:
        return next(self._keys)

    def count_dropped(self, subscription: str) -> None:
        """A consumer's queue was full: one message dropped for `subscription` (counted, and
        reported to the processor, which logs it)."""
        self.dropped += 1
        self._report_dropped(subscription, QUEUE_FULL, 1)

    def _mqtt(self, topic: str) -> str | None:
        mqtt = pulsar_to_mqtt(topic, tenant=self._context.tenant, namespace=self._context.namespace)
        return None if mqtt.startswith(("persistent://", "non-persistent://")) else mqtt

    # -- consumers' selectors --------------------------------------------------------------

    async def subscribe(self, spec: SubscriptionSpec) -> FanOutConsumer:
        if self._closed:
            raise BackendError("backend is closed", reason="closed")
        consumer = FanOutConsumer(self, spec)
        self._consumers[consumer.key] = consumer
        await consumer.open()
        if self._closed:
            consumer.abort()
            raise BackendError("backend is closed", reason="closed")
        return consumer

    def consumer_gone(self, consumer: FanOutConsumer) -> None:
        self._consumers.pop(consumer.key, None)

    async def attach(
        self, consumer: FanOutConsumer, selector_plan: SelectorPlan, since: int
    ) -> None:
        """Route to `consumer` what `selector_plan`'s exact topics and filters match, from
        publish time `since` on, and return once their readers are open. Undone on failure."""
        key = consumer.key
        for topic in selector_plan.exact:
            self._exact.setdefault(topic, {})[key] = (consumer, since)
        self._exact_changes += 1
        for topic_filter in selector_plan.filters:
            self._trie.add(topic_filter, key, (consumer, since))
        try:
            async with one_error_for_callers(), trio.open_nursery() as nursery:
                for topic_filter in selector_plan.filters:
                    nursery.start_soon(self._hold_filter, topic_filter)
                for topic in selector_plan.exact:
                    nursery.start_soon(self._ensure, topic)
        except BaseException:
            await self.detach(consumer, selector_plan)
            raise

    async def detach(self, consumer: FanOutConsumer, selector_plan: SelectorPlan) -> None:
        """Stop routing `selector_plan` to `consumer`; readers no one needs close later."""
        key = consumer.key
        for topic in selector_plan.exact:
            holders = self._exact.get(topic)
            if holders is not None and holders.pop(key, None) is not None:
                if not holders:
                    del self._exact[topic]
                self._release_later(topic)
        self._exact_changes += 1
        released = []
        for topic_filter in selector_plan.filters:
            if self._trie.remove(topic_filter, key):
                released.append(topic_filter)
        with trio.CancelScope(shield=True):
            for topic_filter in released:
                await self._release_filter(topic_filter)

    async def _hold_filter(self, topic_filter: str) -> None:
        count = self._filters.get(topic_filter, 0)
        self._filters[topic_filter] = count + 1
        if count:
            # Another consumer opened its readers (or is opening them): wait for that.
            await self._filters_ready[topic_filter].wait()
            return
        ready = self._filters_ready[topic_filter] = trio.Event()
        # On failure the caller's `detach` lets go of the filter again.
        try:
            watch = await self._update_watch()
            if watch is None:
                return
            # Topics already followed for another filter need no wait: their readers began
            # at the earliest message (a filter matched them), and route to this one too.
            found = [t for t in watch.matching([topic_filter]) if t not in self._discovered]
            self._discovered.update(found)
            await self._ensure_all(found)
        finally:
            ready.set()

    async def _release_filter(self, topic_filter: str) -> None:
        count = self._filters.get(topic_filter, 0) - 1
        if count > 0:
            self._filters[topic_filter] = count
            return
        self._filters.pop(topic_filter, None)
        self._filters_ready.pop(topic_filter, None)
        watch = self._watch
        candidates = watch.matching([topic_filter]) if watch is not None else []
        try:
            await self._update_watch()
        except BackendError as exc:
            log.debug("fan-out: updating the topic watch: %s", exc)
        for topic in candidates:
            mqtt = self._mqtt(topic)
            if mqtt is None or not self._still_held(mqtt):
                self._discovered.discard(topic)
                self._release_later(topic)

    def _still_held(self, mqtt: str) -> list[str]:
        """The held filters that match the MQTT topic `mqtt`."""
        return [f for f, _key, _entry in self._trie.match(mqtt) if f in self._filters]

    def matches_topic(self, topic_filter: str, topic: str) -> bool:
        mqtt = self._mqtt(topic)
        return mqtt is not None and matches(topic_filter, mqtt)

    async def _update_watch(self) -> Watch | None:
        """Point the poller's watch at the filters held now (None: no filter is held)."""
        context = self._context
        async with self._watch_lock:
            filters = frozenset(self._filters)
            if not filters:
                watch, self._watch = self._watch, None
                if watch is not None:
                    watch.close()
                await trio.lowlevel.checkpoint()
                return None
            if self._watch is not None:
                self._watch.follow(filters)
                await trio.lowlevel.checkpoint()
                return self._watch
            watch, _known = await context.discovery.watch(
                context.tenant, context.namespace, filters, self
            )
            if self._closed:
                watch.close()
                return None
            self._watch = watch
            watch.follow(frozenset(self._filters))  # and those added meanwhile
            return watch

    # -- what the topic poller reports (TopicWatcher) -------------------------------------

    def topics_found(self, topics: list[str]) -> None:
        if self._closed:
            return
        self._discovered.update(topics)
        self._context.nursery.start_soon(self._ensure_found, topics)

    def topics_gone(self, topics: list[str]) -> None:
        for topic in topics:
            self._discovered.discard(topic)
            self._release_later(topic)

    async def _ensure_found(self, topics: list[str]) -> None:
        await self._ensure_all(topics)

    async def _ensure_all(self, topics: Iterable[str]) -> None:
        """Open readers for `topics`; those that fail are tried again after a while."""
        failed: list[str] = []

        async def one(topic: str) -> None:
            try:
                await self._ensure(topic)
            except BackendError as exc:
                failed.append(topic)
                log.debug("fan-out: reading %s: %s", topic, exc)

        await in_parallel([t for t in topics if self._needed(t)], one)
        if failed:
            log.warning(
                "fan-out: %d topic(s) not followed yet (%s, ...); trying again",
                len(failed),
                failed[0],
            )
            # A new topic may be refused for a moment (its broker is starting, say); the
            # poller reports it only once, so it is tried again here.
            self._context.delays.call_later(
                self._context.consumer_options.pattern_discovery,
                lambda: self.topics_found([t for t in failed if t in self._discovered]),
            )

    # -- readers ---------------------------------------------------------------------------

    def _needed(self, topic: str) -> bool:
        return not self._closed and (topic in self._exact or topic in self._discovered)

    async def _ensure(self, topic: str) -> None:
        """Return once `topic` has an open reader; raises BackendError if it cannot."""
        follower = self._followers.get(topic)
        if follower is None or follower.closed:
            follower = self._followers[topic] = _Follower(topic, self._mqtt(topic))
            # Opened by the backend's nursery: a subscriber that gives up waiting must not
            # leave a half-made reader to the others.
            self._context.nursery.start_soon(self._open, follower)
        await follower.opened.wait()
        if follower.error is not None:
            raise follower.error

    def _earliest(self, follower: _Follower) -> bool:
        # A filter's topic may have been found after its first messages: read from the start.
        return follower.mqtt is not None and bool(self._trie.match(follower.mqtt))

    async def _open(self, follower: _Follower) -> None:
        config = ConsumerConfig(
            durable=False,
            auto_ack=True,
            receiver_queue=_RECEIVER_QUEUE,
            start_message_id=_EARLIEST if self._earliest(follower) else _LATEST,
        )
        name = f"{self.subscription_prefix}-{secrets.token_hex(5)}"
        try:
            follower.reader = await subscribe(
                self._context.client(),
                follower.topic,
                name,
                lambda _reader, items: self._deliver(follower, items),
                config,
            )
        except DriverError as exc:
            follower.error = error_for(exc, f"reading {follower.topic}")
        except BackendError as exc:
            follower.error = exc
        finally:
            if follower.reader is None:
                follower.closed = True
                if self._followers.get(follower.topic) is follower:
                    del self._followers[follower.topic]
            follower.opened.set()
        if follower.reader is None:
            return
        if self._closed or follower.closed:
            _close_follower(follower)
            return
        if not self._needed(follower.topic):
            self._release_later(follower.topic)

    def _release_later(self, topic: str) -> None:
        if self._closed or self._needed(topic):
            return
        self._context.delays.call_later(GRACE, lambda: self._close_if_unneeded(topic))

    def _close_if_unneeded(self, topic: str) -> None:
        follower = self._followers.get(topic)
        if follower is None or self._needed(topic) or not follower.opened.is_set():
            return
        del self._followers[topic]
        _close_follower(follower)

    async def aclose(self, seconds: float) -> None:
        """The backend stops: close every reader, waiting up to `seconds`."""
        self._closed = True
        for consumer in list(self._consumers.values()):
            consumer.abort()
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()
        followers = list(self._followers.values())
        self._followers.clear()

        async def close(follower: _Follower) -> None:
            follower.closed = True
            reader, follower.reader = follower.reader, None
            if reader is not None:
                await reader.close(seconds)

        with trio.CancelScope(shield=True), trio.move_on_after(seconds):
            await in_parallel(followers, close)
        for follower in followers:
            _close_follower(follower)

    # -- routing ---------------------------------------------------------------------------

    def _route(self, follower: _Follower) -> list[tuple[FanOutConsumer, int]]:
        route_key = (self._trie.generation, self._exact_changes)
        if follower.route_key == route_key:
            return follower.route
        # A consumer whose selectors match the topic more than once takes the earliest time.
        best: dict[int, _Entry] = dict(self._exact.get(follower.topic, {}))
        if follower.mqtt is not None:
            for _filter, key, (consumer, since) in self._trie.match(follower.mqtt):
                held = best.get(key)
                if held is None or since < held[1]:
                    best[key] = (consumer, since)
        follower.route = list(best.values())
        follower.route_key = route_key
        return follower.route

    def _deliver(self, follower: _Follower, items: list[Received]) -> None:
        if follower.closed:
            return
        route = self._route(follower)
        if not route:
            return
        now = now_ms()
        topic = follower.topic
        for item in items:
            decoded = incoming(
                item.payload,
                item.properties,
                partition_key=item.key,
                publish_time=item.publish_time,
                event_time=item.event_time,
                producer_name=item.producer_name,
                encrypted=item.encrypted,
            )
            if decoded.expires_at and decoded.expires_at <= now:
                continue
            delivery = Delivery(topic, item.message_id, decoded)
            published = decoded.publish_time
            for consumer, since in route:
                if published >= since:
                    consumer.offer(delivery)


def _close_follower(follower: _Follower) -> None:
    follower.closed = True
    reader, follower.reader = follower.reader, None
    if reader is not None:
        reader.abort()


if TYPE_CHECKING:
    from mop.backends.cluster.discovery import TopicWatcher

    def _conforms(hub: FanOut) -> TopicWatcher:
        return hub
