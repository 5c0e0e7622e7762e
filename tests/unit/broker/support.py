"""Small helpers shared by the broker tests: message and topic builders, a settable clock, and
`subscribe` with the spec's fields as keywords."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from mop.broker import Attachment, Broker
from mop.broker.storage import MemoryStorage
from mop.message import Delivery, Message
from mop.messaging import SubscriptionSpec
from mop.topic_names import mqtt_to_pulsar


def topic(mqtt: str) -> str:
    return mqtt_to_pulsar(mqtt)


def msg(payload: str, *, qos: int = 1, key: str | None = None, expires_at: int = 0) -> Message:
    return Message(payload.encode(), key=key, qos=qos, expires_at=expires_at)


def payloads(deliveries: list[Delivery]) -> list[str]:
    return [d.message.payload.decode() for d in deliveries]


class Clock:
    """Wall clock in milliseconds that tests move by hand."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def new_broker(storage: MemoryStorage | None = None, clock: Clock | None = None) -> Broker:
    return Broker(storage or MemoryStorage(), clock=clock or Clock())


def take_all(broker: Broker, att: Attachment) -> list[Delivery]:
    return broker.take(att, 10_000)


class Wakeups:
    """An `on_ready` callback that counts its calls."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


async def subscribe(
    broker: Broker,
    name: str,
    selectors: Iterable[str],
    *,
    capacity: int = 1000,
    on_ready: Callable[[], None] | None = None,
    on_active: Callable[[bool], None] | None = None,
    **fields: Any,
) -> Attachment:
    """`broker.subscribe` with a `SubscriptionSpec` made of `name`, `selectors` and `fields`."""
    spec = SubscriptionSpec(name, frozenset(selectors), **fields)
    return await broker.subscribe(spec, capacity=capacity, on_ready=on_ready, on_active=on_active)
