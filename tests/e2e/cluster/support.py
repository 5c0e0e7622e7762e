"""Helpers shared by the separated-deployment tests: subscription specs, bounded waits on a
backend consumer, `mop run` proxy processes and clusters of two brokers."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import trio

from mop.backends.cluster import ClusterBackend
from mop.message import Delivery
from mop.processor.backend import Consumer, SubscriptionSpec
from tests.e2e.nodeproc import NodeProcess, broker_process
from tests.e2e.pulsar.test_broker_cluster import free_ports

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


def two_brokers(
    root: Path, *, admins_of_each_other: bool = False
) -> tuple[list[str], list[str], list[NodeProcess]]:
    """The two members of one mop broker cluster on free loopback ports, not started yet: their
    Pulsar service URLs, their admin URLs and their processes. With `admins_of_each_other`
    each member's `cluster.admin_url` names both admins (the owner of a partitioned topic
    deletes the partitions the other member holds through it)."""
    ports = free_ports(4)
    urls = [f"pulsar://127.0.0.1:{port}" for port in ports[:2]]
    admins = [f"http://127.0.0.1:{port}" for port in ports[2:]]
    shared = {"MOP_CLUSTER__ADMIN_URL": ",".join(admins)} if admins_of_each_other else {}
    brokers = [
        broker_process(
            root / f"broker-{index}",
            MOP_PULSAR__PORT=str(ports[index]),
            MOP_ADMIN__PORT=str(ports[2 + index]),
            MOP_CLUSTER__BROKERS=json.dumps(urls),
            MOP_CLUSTER__ADVERTISED_URL=urls[index],
            **shared,
        )
        for index in range(2)
    ]
    return urls, admins, brokers
