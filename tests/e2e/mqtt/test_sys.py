"""`$SYS/broker/...` end to end: the node describes itself in retained messages that follow its
state, and clients cannot publish into `$SYS`."""

from __future__ import annotations

import queue
import re
import time
from collections.abc import Callable, Iterator

import pytest

from mop.testing.node import RunningNode, node_settings, running_node
from tests.e2e.clients import Client, Received

pytestmark = [pytest.mark.e2e, pytest.mark.both_modes]

INTERVAL = 0.2
NOT_AUTHORIZED = 0x87


@pytest.fixture
def sys_node() -> Iterator[RunningNode]:
    with running_node(node_settings(sys_interval=INTERVAL)) as running:
        yield running


def await_value(
    client: Client, topic: str, predicate: Callable[[str], bool], timeout: float = 5.0
) -> Received:
    """The first message on `topic` whose payload satisfies `predicate` (other topics and
    earlier values are skipped)."""
    deadline = time.monotonic() + timeout
    seen: list[bytes] = []
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"no wanted value on {topic} in {timeout}s; saw {seen}")
        try:
            msg = client.messages.get(timeout=remaining)
        except queue.Empty:
            continue
        if msg.topic != topic:
            continue
        seen.append(msg.payload)
        if predicate(msg.payload.decode()):
            return msg


def latest(
    client: Client,
    topic: str,
    current: str | None = None,
    *,
    settle: float = 3 * INTERVAL,
    timeout: float = 5.0,
) -> str:
    """The last value on `topic` (`current` when none comes) once nothing new has arrived for
    `settle` seconds; fails when the value keeps changing for `timeout` seconds."""
    deadline = time.monotonic() + timeout
    values = [] if current is None else [current]
    while True:
        try:
            msg = client.messages.get(timeout=settle)
        except queue.Empty:
            assert values, f"nothing on {topic}"
            return values[-1]
        if msg.topic == topic:
            values.append(msg.payload.decode())
        if time.monotonic() > deadline:
            raise AssertionError(f"{topic} never settled in {timeout}s: {values}")


def test_broker_topics_are_retained_values(sys_node: RunningNode) -> None:
    client = Client(sys_node.mqtt_port, "sys-reader")
    topics = [
        "$SYS/broker/version",
        "$SYS/broker/clients/connected",
        "$SYS/broker/messages/received",
        "$SYS/broker/uptime",
    ]
    for topic in topics:
        assert client.subscribe(topic, 0) == [0]
    got: dict[str, Received] = {}
    deadline = time.monotonic() + 5
    while len(got) < len(topics):
        [msg] = client.expect(1, timeout=max(0.01, deadline - time.monotonic()))
        if msg.retain:
            got.setdefault(msg.topic, msg)
    assert sorted(got) == sorted(topics)
    assert got["$SYS/broker/version"].payload.decode().startswith("mop ")
    assert re.fullmatch(rb"\d+ seconds", got["$SYS/broker/uptime"].payload)
    assert int(got["$SYS/broker/clients/connected"].payload) >= 0
    assert int(got["$SYS/broker/messages/received"].payload) >= 0


def test_sys_topics_are_matched_by_sys_wildcards(sys_node: RunningNode) -> None:
    client = Client(sys_node.mqtt_port, "sys-all")
    client.subscribe("$SYS/broker/#", 0)
    topics = {m.topic for m in client.expect(4)}
    assert all(t.startswith("$SYS/broker/") for t in topics)


def test_clients_connected_follows_connections(sys_node: RunningNode) -> None:
    watch = Client(sys_node.mqtt_port, "sys-watch")
    watch.subscribe("$SYS/broker/clients/connected", 0)
    topic = "$SYS/broker/clients/connected"
    await_value(watch, topic, lambda v: v == "1")
    others = [Client(sys_node.mqtt_port, f"sys-other-{i}") for i in range(3)]
    await_value(watch, topic, lambda v: v == "4")
    for other in others:
        other.disconnect()
    await_value(watch, topic, lambda v: v == "1")


def test_uptime_advances(sys_node: RunningNode) -> None:
    watch = Client(sys_node.mqtt_port, "sys-up")
    watch.subscribe("$SYS/broker/uptime", 0)
    first = int(watch.expect(1)[0].payload.split()[0])
    later = await_value(watch, "$SYS/broker/uptime", lambda v: int(v.split()[0]) > first)
    assert later.retain is False  # a live update to an existing subscription


def test_messages_received_counts_client_publishes(sys_node: RunningNode) -> None:
    topic = "$SYS/broker/messages/received"
    watch = Client(sys_node.mqtt_port, "sys-count")
    watch.subscribe(topic, 0)
    before = int(latest(watch, topic))
    pub = Client(sys_node.mqtt_port, "sys-count-pub")
    for i in range(3):
        pub.publish("count/t", f"{i}".encode(), 1)
    seen = await_value(watch, topic, lambda v: int(v) >= before + 3)
    # Only the three client messages count, not the node's own $SYS updates.
    assert int(latest(watch, topic, seen.payload.decode(), settle=6 * INTERVAL)) == before + 3


def test_idle_node_does_not_republish_unchanged_values(sys_node: RunningNode) -> None:
    watch = Client(sys_node.mqtt_port, "sys-idle")
    watch.subscribe("$SYS/broker/messages/received", 0)
    watch.subscribe("$SYS/broker/clients/connected", 0)
    retained = {m.topic: m.payload.decode() for m in watch.expect(2)}
    topic = "$SYS/broker/messages/received"
    latest(watch, topic, retained[topic])  # let the first updates settle ...
    watch.expect_none(6 * INTERVAL)  # ... then nothing changes while no client does anything


def test_v5_client_cannot_publish_to_sys(sys_node: RunningNode) -> None:
    watch = Client(sys_node.mqtt_port, "sys-guard")
    watch.subscribe("$SYS/broker/fake", 1)
    intruder = Client(sys_node.mqtt_port, "sys-intruder")
    assert intruder.publish("$SYS/broker/fake", b"x", 1) == NOT_AUTHORIZED
    assert intruder.publish("$SYS/broker/version", b"forged", 1, retain=True) == NOT_AUTHORIZED
    intruder.publish("$SYS/broker/fake", b"y", 0)
    intruder.publish("barrier", b"", 1)  # the connection is still served
    watch.expect_none(0.5)
    reader = Client(sys_node.mqtt_port, "sys-reader2")
    reader.subscribe("$SYS/broker/version", 0)
    [msg] = reader.expect(1)
    assert msg.payload.startswith(b"mop ")


def test_v311_client_cannot_publish_to_sys(sys_node: RunningNode) -> None:
    watch = Client(sys_node.mqtt_port, "sys-guard311", version=4)
    watch.subscribe("$SYS/broker/fake", 1)
    intruder = Client(sys_node.mqtt_port, "sys-intruder311", version=4)
    intruder.publish("$SYS/broker/fake", b"ignored", 0)
    intruder.publish("ok/t", b"", 1)  # QoS 0 is dropped silently; the connection stays
    watch.expect_none(0.5)
    intruder.client.publish("$SYS/broker/fake", b"refused", 1)  # 3.1.1 has no refusing ack
    intruder.disconnects.get(timeout=5)  # ... so the server closes the connection
    watch.expect_none(0.3)
