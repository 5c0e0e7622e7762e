"""The legs of a separated-mode consumer: one consumer of the proxy's Pulsar client per topic
it follows.

A consumer may follow thousands of topics (a `#` filter), so legs are subscribed, closed and
unsubscribed a few at a time in parallel, each within the client's operation timeout, rather
than one after the other.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Final, TypeVar

import trio

from mop.backends.cluster.errors import error_for
from mop.processor.backend import BackendError
from mop.protocols.pulsar.driver import (
    ClientConsumer,
    ConsumerConfig,
    DriverError,
    PulsarClient,
    ServerRefused,
    subscribe,
)
from mop.protocols.pulsar.driver.consumer import Sink
from mop.protocols.pulsar.errors import ServerError

__all__ = [
    "Leg",
    "close_leg_soon",
    "close_legs",
    "in_parallel",
    "subscribe_leg",
    "unsubscribe_legs",
]

log = logging.getLogger("mop.cluster")

# Subscribes (closes, unsubscribes) one consumer has in flight at once.
PARALLEL: Final = 16

T = TypeVar("T")


class Leg:
    """One consumer of a ClusterConsumer: the one of `topic`."""

    __slots__ = ("closed", "consumer", "epoch", "topic")

    def __init__(self, topic: str) -> None:
        self.consumer: ClientConsumer | None = None
        self.closed = False
        self.topic = topic
        # Bumped by a seek: messages the listener tagged with an older epoch are dropped.
        self.epoch = 0


async def in_parallel(items: Iterable[T], call: Callable[[T], Awaitable[None]]) -> None:
    """`call(item)` for every item, at most PARALLEL at a time; returns when all are done."""
    limiter = trio.CapacityLimiter(PARALLEL)

    async def one(item: T) -> None:
        async with limiter:
            await call(item)

    async with one_error_for_callers(), trio.open_nursery() as nursery:
        for item in items:
            nursery.start_soon(one, item)


@asynccontextmanager
async def one_error_for_callers() -> AsyncIterator[None]:
    """Let a nursery's failure out as its first BackendError when that is all it holds.

    trio groups what a nursery's tasks raise; callers of the backend (the MQTT layer refusing
    one filter with a reason code, say) expect a BackendError, and a group would instead end
    their connection. A group with anything else in it (a cancellation, a bug) is left as is.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        matched, rest = group.split(BackendError)
        if matched is None or rest is not None:
            raise
        first: BaseException = matched
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from group


async def subscribe_leg(
    client: PulsarClient,
    leg: Leg,
    name: str,
    config: ConsumerConfig,
    sink: Sink,
    busy_timeout: float,
) -> None:
    """Subscribe `leg` to its topic under subscription `name`, retrying for `busy_timeout`
    seconds while another consumer still holds the subscription."""
    delay = 0.05
    what = f"subscribing {name!r} to {leg.topic}"
    with trio.move_on_after(busy_timeout) as scope:
        while True:
            try:
                leg.consumer = await subscribe(client, leg.topic, name, sink, config)
                return
            except ServerRefused as exc:
                if exc.error is not ServerError.ConsumerBusy:
                    raise error_for(exc, what) from None
                # Still held by a consumer that is closing (e.g. a session taken over).
                await trio.sleep(delay)
                delay = min(delay * 2, 0.5)
            except DriverError as exc:
                raise error_for(exc, what) from None
    assert scope.cancelled_caught
    raise BackendError(f"subscription {name!r} on {leg.topic} stays busy", reason="consumer_busy")


async def close_legs(legs: list[Leg], seconds: float) -> None:
    """Close the legs' consumers, waiting up to `seconds`; the ones still closing then are
    dropped without waiting."""
    for leg in legs:
        leg.closed = True

    async def close(leg: Leg) -> None:
        consumer, leg.consumer = leg.consumer, None
        if consumer is not None:
            await consumer.close(seconds)

    with trio.CancelScope(shield=True), trio.move_on_after(seconds):
        await in_parallel(legs, close)
    for leg in legs:
        close_leg_soon(leg)  # those the timeout cut off


async def unsubscribe_legs(legs: list[Leg], name: str) -> None:
    """Delete subscription `name` on each leg's topic (closing the leg)."""

    async def unsubscribe(leg: Leg) -> None:
        leg.closed = True
        consumer, leg.consumer = leg.consumer, None
        if consumer is None:
            return
        try:
            await consumer.unsubscribe()
        except DriverError as exc:
            log.warning("%s", error_for(exc, f"unsubscribing {name!r} from {leg.topic}"))
            consumer.abort()

    await in_parallel(legs, unsubscribe)


def close_leg_soon(leg: Leg) -> None:
    """Close without waiting."""
    leg.closed = True
    consumer, leg.consumer = leg.consumer, None
    if consumer is not None:
        consumer.abort()
