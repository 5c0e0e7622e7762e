"""Helpers shared by the separated-deployment tests: subscription specs, bounded waits on a
backend consumer, and `mop run` proxy processes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import trio

from mop.backends.cluster import ClusterBackend
from mop.message import Delivery
from mop.processor.backend import Consumer, SubscriptionSpec
from tests.e2e.nodeproc import NodeProcess

DEADLINE = 10.0  # bounds every wait; it measures nothing
QUIET = 0.5  # how long to watch for a message that must not come
SESSION_TAKEN_OVER = 0x8E  # the DISCONNECT reason code of a connection taken over

# What the `open_backend` fixture gives: opens a `ClusterBackend` and closes it at the end.
OpenBackend = Callable[[], AbstractAsyncContextManager[ClusterBackend]]


def spec(name: str, *selectors: str, **options: object) -> SubscriptionSpec:
    return SubscriptionSpec(name=name, selectors=frozenset(selectors), **options)  # type: ignore[arg-type]


def payloads(deliveries: Sequence[Delivery]) -> list[bytes]:
    return [d.message.payload for d in deliveries]


async def receive(consumer: Consumer, count: int, *, ack: bool = False) -> list[Delivery]:
    """Exactly `count` deliveries within DEADLINE, each batch acknowledged as it comes if
    `ack`."""
    got: list[Delivery] = []
    with trio.move_on_after(DEADLINE):
        while len(got) < count:
            deliveries = await consumer.receive(count - len(got))
            if ack:
                consumer.ack(deliveries)
            got.extend(deliveries)
    assert len(got) == count, f"{len(got)} of {count} in {DEADLINE}s: {payloads(got)}"
    return got


async def expect_nothing(consumer: Consumer, seconds: float = QUIET) -> None:
    with trio.move_on_after(seconds):
        got = await consumer.receive(100)
        unexpected = [(d.topic, d.message.payload) for d in got]
        raise AssertionError(f"unexpected deliveries: {unexpected}")


def proxy_process(data_dir: Path, service_url: str, **overrides: str) -> NodeProcess:
    """`mop run` as a separated-mode proxy (MQTT only unless `overrides` say otherwise) in
    front of the brokers at `service_url`."""
    return NodeProcess(
        data_dir, MOP_MODE="separated", MOP_CLUSTER__SERVICE_URL=service_url, **overrides
    )
