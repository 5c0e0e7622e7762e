"""The local consumers of the proxy's fan-out (`fanout`): a non-durable exclusive
subscription's consumer, fed in memory by the proxy's shared topic readers.

Its backlog is bounded (`SubscriptionSpec.max_backlog`, else `FANOUT_BACKLOG`): messages
buffered plus those received and not yet acknowledged. Past the bound the rule of merged mode
applies: the oldest buffered qos-0 message makes room, otherwise the new message is dropped for
this consumer (counted; a qos >= 1 drop is logged). Nothing waits for a full consumer, so it
never holds back the others of its topics.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

import trio

from mop.backends.cluster.patterns import SelectorPlan, plan
from mop.clock import now_ms
from mop.message import Delivery, MessageId
from mop.processor.backend import (
    BackendError,
    ConsumerClosed,
    CursorPosition,
    SubscriptionSpec,
)

if TYPE_CHECKING:
    from mop.backends.cluster.fanout import FanOut
    from mop.processor.backend import Consumer

__all__ = ["FANOUT_BACKLOG", "FanOutConsumer"]


# A consumer's backlog when its spec sets none (messages buffered or not yet acknowledged).
FANOUT_BACKLOG: Final = 10_000


class FanOutConsumer:
    """A local non-durable consumer fed by the proxy's readers; one task at a time may wait
    in `receive`.

    Nothing is acknowledged at the broker: `ack` only frees room in the consumer's backlog.
    `nack` hands messages back to this consumer, which receives them again (first, with a
    higher `redelivery_count`) after `delay`, as long as it stays open; a non-durable
    subscription keeps nothing once its consumer is gone.
    """

    def __init__(self, hub: FanOut, spec: SubscriptionSpec) -> None:
        self._hub = hub
        self._context = hub.context
        self._spec = spec
        self.key = hub.key()
        self._plans: dict[str, SelectorPlan] = {}  # selector -> its own plan
        self._buffer: deque[Delivery] = deque()
        self._qos0 = 0  # qos-0 deliveries in the buffer
        self._unacked: set[tuple[str, MessageId]] = set()
        self._backlog = spec.max_backlog if spec.max_backlog > 0 else FANOUT_BACKLOG
        self._permits = 0
        self._dropped = 0
        self._closed = False
        self._wakeup: trio.Event | None = None

    @property
    def spec(self) -> SubscriptionSpec:
        return self._spec

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def dropped(self) -> int:
        """Messages this consumer lost to its backlog bound."""
        return self._dropped

    def _plan(self, selectors: Iterable[str]) -> SelectorPlan:
        return plan(selectors, tenant=self._context.tenant, namespace=self._context.namespace)

    async def open(self) -> None:
        """Start receiving what the spec's selectors match (called once, by the hub)."""
        self._plan(self._spec.selectors)  # refuses a bad selector before anything changes
        try:
            for selector in sorted(self._spec.selectors):
                await self._attach(selector)
        except BaseException:
            await self._shutdown()
            raise

    async def _attach(self, selector: str) -> None:
        selector_plan = self._plan([selector])
        self._plans[selector] = selector_plan
        since = now_ms()
        self._follow_local()
        try:
            await self._hub.attach(self, selector_plan, since)
        except BaseException:
            del self._plans[selector]
            self._follow_local()
            raise

    def _follow_local(self) -> None:
        local = frozenset(s for p in self._plans.values() for s in p.local)
        self._context.local.follow(self, self._spec.name, local)

    # -- what the hub hands over -----------------------------------------------------------

    def offer(self, delivery: Delivery) -> None:
        if self._closed:
            return
        buffer = self._buffer
        if len(buffer) + len(self._unacked) >= self._backlog and not self._make_room(delivery):
            return
        buffer.append(delivery)
        if delivery.message.qos == 0:
            self._qos0 += 1
        if self._wakeup is not None:
            self._wakeup.set()

    def _make_room(self, delivery: Delivery) -> bool:
        """The backlog is full: drop the oldest buffered qos-0 message, else refuse
        `delivery` (False). Either way one message is lost for this consumer."""
        self._dropped += 1
        self._hub.count_dropped(self._spec.name)
        if self._qos0:
            for index, held in enumerate(self._buffer):
                if held.message.qos == 0:
                    del self._buffer[index]
                    self._qos0 -= 1
                    return True
        return False

    def deliver_local(self, delivery: Delivery) -> None:
        """A message of a node-local topic (`mop.backends.node_local`)."""
        self.offer(delivery)

    # -- Consumer --------------------------------------------------------------------------

    async def receive(self, max_messages: int) -> list[Delivery]:
        if max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        if self._wakeup is not None:
            raise trio.BusyResourceError("another task is already receiving from this consumer")
        await trio.lowlevel.checkpoint()
        while True:
            if self._closed:
                raise ConsumerClosed(f"consumer of {self._spec.name!r} is closed")
            count = min(max_messages, len(self._buffer))
            if self._spec.permits:
                count = min(count, self._permits)
                self._permits -= count
            if count > 0:
                return self._take(count)
            event = self._wakeup = trio.Event()
            try:
                await event.wait()
            finally:
                self._wakeup = None

    def _take(self, count: int) -> list[Delivery]:
        buffer = self._buffer
        taken = [buffer.popleft() for _ in range(count)]
        unacked = self._unacked
        auto_ack = self._spec.auto_ack_qos0
        for delivery in taken:
            if delivery.message.qos == 0:
                self._qos0 -= 1
                if auto_ack:
                    continue  # acknowledged as it is received
            unacked.add((delivery.topic, delivery.message_id))
        return taken

    def ack(self, deliveries: Iterable[Delivery]) -> None:
        unacked = self._unacked
        for delivery in deliveries:
            unacked.discard((delivery.topic, delivery.message_id))

    def nack(self, deliveries: Iterable[Delivery], delay: float = 0.0) -> None:
        again = [
            dataclasses.replace(d, redelivery_count=d.redelivery_count + 1)
            for d in deliveries
            if (d.topic, d.message_id) in self._unacked
        ]
        if not again:
            return
        if delay <= 0:
            self._redeliver(again)
        else:
            self._context.delays.call_later(delay, lambda: self._redeliver(again))

    def _redeliver(self, deliveries: list[Delivery]) -> None:
        # Still counted in the backlog (as unacknowledged) until taken again.
        if self._closed:
            return
        for delivery in reversed(deliveries):
            if (delivery.topic, delivery.message_id) not in self._unacked:
                continue
            self._unacked.discard((delivery.topic, delivery.message_id))
            self._buffer.appendleft(delivery)
            if delivery.message.qos == 0:
                self._qos0 += 1
        if self._wakeup is not None and self._buffer:
            self._wakeup.set()

    def ack_through(self, topic: str, message_id: MessageId) -> None:
        self._unacked = {k for k in self._unacked if k[0] != topic or k[1] > message_id}

    def grant(self, permits: int) -> None:
        self._permits += permits
        if self._wakeup is not None and self._buffer:
            self._wakeup.set()

    async def seek(
        self, topic: str, *, message_id: MessageId | None = None, publish_time: int | None = None
    ) -> None:
        await trio.lowlevel.checkpoint()
        raise BackendError(
            "seek is not available on a non-durable subscription in separated mode (its"
            " topics are read once per proxy, for every such subscription)",
            reason="not_supported",
        )

    async def position(self, topic: str) -> CursorPosition:
        await trio.lowlevel.checkpoint()
        raise BackendError(
            "a non-durable subscription has no position at the broker in separated mode",
            reason="not_supported",
        )

    @property
    def active(self) -> bool:
        return True  # an exclusive subscription's one consumer

    async def active_changed(self) -> bool:
        await trio.sleep_forever()  # an exclusive consumer never changes
        raise AssertionError("unreachable")  # pragma: no cover

    async def add_selector(self, selector: str) -> None:
        if self._closed:
            raise ConsumerClosed(f"consumer of {self._spec.name!r} is closed")
        if selector in self._plans:
            await trio.lowlevel.checkpoint()
            return
        self._plan([selector])
        await self._attach(selector)
        self._spec = dataclasses.replace(self._spec, selectors=frozenset(self._plans))

    async def remove_selector(self, selector: str) -> None:
        """Stop receiving what only `selector` matched; buffered messages of topics no other
        selector matches are dropped."""
        if self._closed:
            raise ConsumerClosed(f"consumer of {self._spec.name!r} is closed")
        selector_plan = self._plans.pop(selector, None)
        if selector_plan is None:
            await trio.lowlevel.checkpoint()
            return
        self._spec = dataclasses.replace(self._spec, selectors=frozenset(self._plans))
        self._follow_local()
        await self._hub.detach(self, selector_plan)
        remaining = self._plan(self._plans) if self._plans else SelectorPlan()
        self._buffer = deque(d for d in self._buffer if self._covers(remaining, d.topic))
        self._qos0 = sum(1 for d in self._buffer if d.message.qos == 0)

    def _covers(self, selector_plan: SelectorPlan, topic: str) -> bool:
        if topic in selector_plan.exact or self._context.local.owns(topic):
            return True
        return any(self._hub.matches_topic(f, topic) for f in selector_plan.filters)

    def abort(self) -> None:
        """Stop delivering and wake a waiting `receive` (which then raises); the hub's
        routes are left as they are (the backend is stopping)."""
        self._closed = True
        self._buffer.clear()
        self._unacked.clear()
        self._context.local.follow(self, self._spec.name, ())
        self._hub.consumer_gone(self)
        if self._wakeup is not None:
            self._wakeup.set()

    async def _shutdown(self) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self.abort()
        plans, self._plans = list(self._plans.values()), {}
        with trio.CancelScope(shield=True):
            for selector_plan in plans:
                await self._hub.detach(self, selector_plan)

    async def close(self) -> None:
        """Detach; a non-durable subscription goes with its consumer."""
        await self._shutdown()

    async def unsubscribe(self) -> None:
        await self._shutdown()


if TYPE_CHECKING:

    def _conforms(consumer: FanOutConsumer) -> Consumer:
        return consumer
