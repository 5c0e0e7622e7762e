"""`SubscriptionSpec.auto_ack_qos0` for a backend that does not do it itself: the processor
wraps its consumers so that messages with qos 0 are acknowledged as `receive` returns them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from mop.message import Delivery, MessageId
from mop.processor.backend import Consumer, CursorPosition, SubscriptionSpec


class AtMostOnceConsumer:
    """A consumer whose qos-0 messages count as acknowledged once received; everything else
    is the wrapped consumer's."""

    __slots__ = ("_consumer",)

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer

    @property
    def spec(self) -> SubscriptionSpec:
        return self._consumer.spec

    async def receive(self, max_messages: int) -> list[Delivery]:
        deliveries = await self._consumer.receive(max_messages)
        done = [d for d in deliveries if d.message.qos == 0]
        if done:
            self._consumer.ack(done)
        return deliveries

    def ack(self, deliveries: Iterable[Delivery]) -> None:
        self._consumer.ack(deliveries)

    def nack(self, deliveries: Iterable[Delivery], delay: float = 0.0) -> None:
        self._consumer.nack(deliveries, delay)

    def ack_through(self, topic: str, message_id: MessageId) -> None:
        self._consumer.ack_through(topic, message_id)

    def grant(self, permits: int) -> None:
        self._consumer.grant(permits)

    async def seek(
        self, topic: str, *, message_id: MessageId | None = None, publish_time: int | None = None
    ) -> None:
        await self._consumer.seek(topic, message_id=message_id, publish_time=publish_time)

    async def position(self, topic: str) -> CursorPosition:
        return await self._consumer.position(topic)

    @property
    def active(self) -> bool:
        return self._consumer.active

    async def active_changed(self) -> bool:
        return await self._consumer.active_changed()

    async def add_selector(self, selector: str) -> None:
        await self._consumer.add_selector(selector)

    async def remove_selector(self, selector: str) -> None:
        await self._consumer.remove_selector(selector)

    async def close(self) -> None:
        await self._consumer.close()

    async def unsubscribe(self) -> None:
        await self._consumer.unsubscribe()


if TYPE_CHECKING:

    def _conforms(consumer: AtMostOnceConsumer) -> Consumer:
        return consumer
