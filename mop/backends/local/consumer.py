"""`LocalConsumer`: a consumer attached to the colocated broker, and following the node's own
`$SYS` topics (`mop.backends.node_local`), which are not the broker's."""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

import trio

from mop.backends.local.errors import translate, translated
from mop.backends.node_local import local_selectors
from mop.broker import Attachment, BrokerError
from mop.broker.storage import StorageError
from mop.message import Delivery, MessageId
from mop.processor.backend import ConsumerClosed, CursorPosition, SubscriptionSpec

if TYPE_CHECKING:
    from mop.backends.local.backend import LocalBackend

__all__ = ["LocalConsumer"]


class LocalConsumer:
    """A consumer attached to the broker; one task at a time may wait in `receive`.

    Messages of the node's `$SYS` topics come from the node itself (`deliver_local`), at
    most once: they wait in a buffer of `receiver_queue` messages (the newest are dropped
    when it is full, as notifications whose later values count), their acknowledgements
    are no-ops, and a permit-based consumer gets them within permits counted apart."""

    def __init__(self, backend: LocalBackend, spec: SubscriptionSpec) -> None:
        self._backend = backend
        self._spec = spec
        self._att: Attachment | None = None
        self._local: deque[Delivery] = deque()
        self._local_permits = 0
        # Whether it ever followed one of the node's own topics: until then no delivery of
        # one can be among those it acknowledges, so they go to the broker unfiltered.
        self._followed_local = False
        self._wakeup: trio.Event | None = None
        self._closed = False
        self._active = False
        self._seen_active = False  # what `active_changed` last reported
        self._active_event = trio.Event()

    @property
    def spec(self) -> SubscriptionSpec:
        return self._spec

    def _follow_local(self) -> None:
        """Follow the node's own topics that the selectors name (none once closed)."""
        backend = self._backend
        selectors = (
            frozenset()
            if self._closed
            else local_selectors(
                self._spec.selectors,
                tenant=backend.broker.tenant,
                namespace=backend.broker.namespace,
            )
        )
        if selectors:
            self._followed_local = True
        backend.local.follow(self, self._spec.name, selectors)

    def deliver_local(self, delivery: Delivery) -> None:
        """A message of one of the node's own topics."""
        if self._closed or len(self._local) >= self._backend.receiver_queue:
            return
        self._local.append(delivery)
        if self._wakeup is not None:
            self._wakeup.set()

    def _take_local(self, max_messages: int) -> list[Delivery]:
        count = min(max_messages, len(self._local))
        if self._spec.permits:
            count = min(count, self._local_permits)
            self._local_permits -= count
        return [self._local.popleft() for _ in range(count)]

    def _not_local(self, deliveries: Iterable[Delivery]) -> Iterable[Delivery]:
        if not self._followed_local:
            return deliveries
        owns = self._backend.local.owns
        return [delivery for delivery in deliveries if not owns(delivery.topic)]

    @property
    def closed(self) -> bool:
        return self._closed

    def _on_ready(self) -> None:
        # Called by the broker when messages are queued for this consumer.
        if self._wakeup is not None:
            self._wakeup.set()

    def _on_active(self, active: bool) -> None:
        # Called by the broker when a failover subscription's active consumer changes.
        self._active = active
        self._active_event.set()

    @property
    def active(self) -> bool:
        return self._active

    async def active_changed(self) -> bool:
        while True:
            self._attachment()
            if self._active != self._seen_active:
                self._seen_active = self._active
                return self._active
            self._active_event = trio.Event()
            await self._active_event.wait()

    def _attachment(self) -> Attachment:
        if self._closed or self._att is None:
            raise ConsumerClosed(f"consumer of {self._spec.name!r} is closed")
        return self._att

    async def receive(self, max_messages: int) -> list[Delivery]:
        if max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        if self._wakeup is not None:
            raise trio.BusyResourceError("another task is already receiving from this consumer")
        await trio.lowlevel.checkpoint_if_cancelled()
        att = self._att
        if att is not None and (att.queue or self._local):
            # Messages are there: other tasks run before the take rather than after it, so
            # that what they publish meanwhile (a round of many publishers' reads) goes out
            # with this batch, in this turn, instead of waiting taken for the next. It also
            # keeps a long backlog from holding the loop. Meanwhile the consumer counts as
            # receiving, as it does while it waits (see `SubscriberPressure`). With nothing
            # there, the wait below is what lets others run.
            att.receiving = True
            try:
                await trio.lowlevel.cancel_shielded_checkpoint()
            finally:
                att.receiving = False
        broker = self._backend.broker
        while True:
            att = self._attachment()
            if broker.wants_reading_for(att):
                # Its subscription, catching up with a stored backlog, read it down: read on.
                try:
                    await broker.read_ahead(att)
                except (StorageError, BrokerError) as exc:
                    raise translate(exc) from exc
                att = self._attachment()
            if self._local:
                deliveries = self._take_local(max_messages)
                if deliveries:
                    return deliveries
            try:
                deliveries = broker.take(att, max_messages)
            except (StorageError, BrokerError) as exc:
                raise translate(exc) from exc
            if deliveries:
                self._backend.pressure.taken(att.sub)
                return deliveries
            event = self._wakeup = trio.Event()
            att.receiving = True  # not stalled, whatever waits: see `SubscriberPressure`
            try:
                await event.wait()
            finally:
                self._wakeup = None
                att.receiving = False

    def ack(self, deliveries: Iterable[Delivery]) -> None:
        # Acknowledging after close is a no-op: the messages went back to the subscription.
        if not self._closed and self._att is not None:
            try:
                self._backend.broker.ack(self._att, self._not_local(deliveries))
            except (StorageError, BrokerError) as exc:
                raise translate(exc) from exc

    def nack(self, deliveries: Iterable[Delivery], delay: float = 0.0) -> None:
        if self._closed or self._att is None:
            return
        deliveries = self._not_local(deliveries)
        with translated():
            if delay > 0:
                self._backend.broker.nack(self._att, deliveries, due=trio.current_time() + delay)
                self._backend._delays_changed()
            else:
                self._backend.broker.nack(self._att, deliveries)

    def ack_through(self, topic: str, message_id: MessageId) -> None:
        if self._closed or self._att is None:
            return
        if not self._followed_local or not self._backend.local.owns(topic):
            with translated():
                self._backend.broker.ack_through(self._att, topic, message_id)

    def grant(self, permits: int) -> None:
        if not self._closed and self._att is not None:
            self._local_permits += permits
            with translated():
                self._backend.broker.grant(self._att, permits)
            if self._local and self._wakeup is not None:
                self._wakeup.set()

    async def seek(
        self, topic: str, *, message_id: MessageId | None = None, publish_time: int | None = None
    ) -> None:
        att = self._attachment()
        with translated():
            await self._backend.broker.reset(
                att.sub, topic, message_id=message_id, publish_time=publish_time
            )
        self._backend._delays_changed()

    async def position(self, topic: str) -> CursorPosition:
        att = self._attachment()
        with translated():
            last, mark = await self._backend.broker.position(att.sub, topic)
        return CursorPosition(last, mark)

    async def add_selector(self, selector: str) -> None:
        att = self._attachment()
        if not self._backend.is_local(selector):
            with translated():
                await self._backend.broker.add_selector(att.sub, selector)
        else:
            await trio.lowlevel.checkpoint()
        self._spec = dataclasses.replace(self._spec, selectors=self._spec.selectors | {selector})
        self._follow_local()

    async def remove_selector(self, selector: str) -> None:
        att = self._attachment()
        if not self._backend.is_local(selector):
            with translated():
                await self._backend.broker.remove_selector(att.sub, selector)
        else:
            await trio.lowlevel.checkpoint()
        self._spec = dataclasses.replace(self._spec, selectors=self._spec.selectors - {selector})
        self._follow_local()

    async def close(self) -> None:
        self._shutdown()
        await trio.lowlevel.checkpoint()

    async def unsubscribe(self) -> None:
        att = self._att
        already_closed = self._closed
        self._shutdown()
        if att is not None and not already_closed:
            with translated():
                await self._backend.broker.unsubscribe(att)
        else:
            await trio.lowlevel.checkpoint()

    def _shutdown(self) -> None:
        """Detach from the broker and wake a waiting `receive`, which then raises."""
        if self._closed:
            return
        self._closed = True
        self._follow_local()
        self._local.clear()
        self._backend._consumers.discard(self)
        if self._att is not None:
            with translated():
                self._backend.broker.close(self._att)
            self._backend.pressure.detached(self._att.sub)
        if self._wakeup is not None:
            self._wakeup.set()
        self._active_event.set()
