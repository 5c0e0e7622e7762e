"""Fan-out inside a separated proxy, against a real broker process: clean-session MQTT subscribers
of a proxy share one reader per topic (seen from the broker's side through a relay that records
every SUBSCRIBE), persistent sessions keep their own subscriptions, clean sessions survive a
broker restart, and a slow consumer is held to its backlog without holding others back."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from mop.backends.cluster import FanOutConsumer
from mop.message import Message
from mop.messaging import QUEUE_FULL
from mop.processor.backend import ConsumerClosed
from mop.testing.cluster import open_cluster_backend, proxy_settings
from mop.testing.node import running_node
from mop.testing.pulsar_relay import CountingRelay
from mop.topic_names import mqtt_to_pulsar
from tests.e2e.clients import Client
from tests.e2e.cluster.support import spec
from tests.e2e.nodeproc import NodeProcess, broker_process

SUBSCRIBERS = 12
DEADLINE = 20.0  # bounds every wait; it measures nothing


@contextmanager
def relay_thread() -> Iterator[CountingRelay]:
    """A counting relay served by a trio run of its own (the tests here are synchronous); its
    broker port is set once the broker runs."""
    relay = CountingRelay("127.0.0.1", 0)
    ready = threading.Event()
    box: dict[str, object] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(relay.serve)
            box["token"] = trio.lowlevel.current_trio_token()
            box["scope"] = nursery.cancel_scope
            ready.set()

    thread = threading.Thread(target=lambda: trio.run(main), name="relay", daemon=True)
    thread.start()
    assert ready.wait(DEADLINE), "the relay did not start"
    try:
        yield relay
    finally:
        token = box["token"]
        scope = box["scope"]
        assert isinstance(token, trio.lowlevel.TrioToken)
        assert isinstance(scope, trio.CancelScope)
        token.run_sync_soon(scope.cancel)
        thread.join(DEADLINE)


@pytest.fixture(scope="module")
def relayed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CountingRelay]:
    """A broker whose lookups name the relay, so that every consumer's commands pass it."""
    with relay_thread() as relay:
        broker = broker_process(
            tmp_path_factory.mktemp("broker") / "data",
            MOP_CLUSTER__ADVERTISED_URL=relay.service_url,
        )
        relay.port = broker.start()
        try:
            yield relay
        finally:
            if broker.running:
                assert broker.stop() == 0, broker.log()
            broker.close()


def subscriptions_of(relay: CountingRelay, mqtt_topic: str) -> dict[str, int]:
    topic = mqtt_to_pulsar(mqtt_topic)
    return {name: n for (t, name), n in relay.subscriptions.items() if t == topic}


def test_clean_sessions_share_one_subscription_per_topic_per_proxy(
    relayed: CountingRelay, prefix: str
) -> None:
    url = relayed.service_url
    with running_node(proxy_settings(url)) as a, running_node(proxy_settings(url)) as b:
        subscribers = []
        for index in range(SUBSCRIBERS):
            node = a if index % 2 else b
            client = Client(node.mqtt_port, f"{prefix}-s{index}")
            # Half name the topic, half a filter; a quarter both.
            filters = [f"{prefix}/t"] if index % 3 else [f"{prefix}/+"]
            if index % 4 == 0:
                filters.append(f"{prefix}/#")
            for topic_filter in filters:
                assert client.subscribe(topic_filter, qos=1) == [1]
            subscribers.append(client)
        publisher = Client(a.mqtt_port, f"{prefix}-pub")
        for n in range(5):
            publisher.publish(f"{prefix}/t", f"{n}", qos=1)
        for client in subscribers:
            got = client.expect(5)
            assert [m.payload for m in got] == [f"{n}".encode() for n in range(5)]
        followed = subscriptions_of(relayed, f"{prefix}/t")
        # One non-durable subscription per proxy, named for the proxy, each subscribed once.
        assert len(followed) == 2, followed
        assert all(name.startswith("mop-proxy-") for name in followed), followed
        assert set(followed.values()) == {1}, followed


def test_a_persistent_session_keeps_a_subscription_of_its_own(
    relayed: CountingRelay, prefix: str
) -> None:
    with running_node(proxy_settings(relayed.service_url)) as node:
        clean = Client(node.mqtt_port, f"{prefix}-clean")
        clean.subscribe(f"{prefix}/t", qos=1)
        kept = Client(node.mqtt_port, f"{prefix}-kept", version=4, clean=False)
        kept.subscribe(f"{prefix}/t", qos=1)
        Client(node.mqtt_port, f"{prefix}-pub").publish(f"{prefix}/t", b"m", qos=1)
        assert [m.payload for m in clean.expect(1)] == [b"m"]
        assert [m.payload for m in kept.expect(1)] == [b"m"]
        followed = subscriptions_of(relayed, f"{prefix}/t")
        assert f"{prefix}-kept" in followed
        assert len([n for n in followed if n.startswith("mop-proxy-")]) == 1, followed


def test_clean_sessions_survive_a_broker_restart(tmp_path: Path, prefix: str) -> None:
    broker = broker_process(tmp_path / "data")
    port = broker.start()
    try:
        with running_node(proxy_settings(broker.service_url)) as node:
            exact = Client(node.mqtt_port, f"{prefix}-exact")
            exact.subscribe(f"{prefix}/t", qos=1)
            wide = Client(node.mqtt_port, f"{prefix}-wide")
            wide.subscribe(f"{prefix}/#", qos=1)
            publisher = Client(node.mqtt_port, f"{prefix}-pub")
            publisher.publish(f"{prefix}/t", b"before", qos=1)
            assert [m.payload for m in exact.expect(1)] == [b"before"]
            assert [m.payload for m in wide.expect(1)] == [b"before"]
            broker.kill()
            broker.start(MOP_PULSAR__PORT=str(port))
            # The proxy's producer and readers reconnect on their own; the publish waits for
            # its receipt across the reconnect.
            publisher.publish(f"{prefix}/t", b"after", qos=1)
            assert [m.payload for m in exact.expect(1, timeout=DEADLINE)] == [b"after"]
            assert [m.payload for m in wide.expect(1, timeout=DEADLINE)] == [b"after"]
    finally:
        if broker.running:
            broker.stop()
        broker.close()


async def test_a_slow_consumer_keeps_to_its_backlog(broker: NodeProcess, prefix: str) -> None:
    topic = mqtt_to_pulsar(f"{prefix}/t")
    async with open_cluster_backend(broker.service_url) as backend:
        reported: list[tuple[str, str, int]] = []
        backend.on_dropped(lambda *report: reported.append(report))
        slow = await backend.subscribe(spec("slow", f"{prefix}/t", durable=False, max_backlog=10))
        fast = await backend.subscribe(spec("fast", f"{prefix}/t", durable=False, max_backlog=1000))
        got: list[bytes] = []
        with trio.fail_after(DEADLINE):
            async with trio.open_nursery() as nursery:

                async def keep_up() -> None:
                    while len(got) < 60:
                        deliveries = await fast.receive(100)
                        fast.ack(deliveries)
                        got.extend(d.message.payload for d in deliveries)

                nursery.start_soon(keep_up)
                for n in range(50):
                    await backend.publish(topic, Message(b"%d" % n, qos=0))
                for n in range(50, 60):
                    await backend.publish(topic, Message(b"%d" % n, qos=1))
        assert got == [b"%d" % n for n in range(60)]
        # The slow one's backlog of 10 ended with the qos-1 messages: they pushed the qos-0
        # ones out, and none was dropped.
        deliveries = await slow.receive(100)
        assert [d.message.payload for d in deliveries] == [b"%d" % n for n in range(50, 60)]
        assert isinstance(slow, FanOutConsumer)
        assert slow.dropped == 50
        # Each drop is reported, for the processor to count and log (`DropNotifier`).
        assert reported == [("slow", QUEUE_FULL, 1)] * 50


async def test_closing_the_backend_wakes_a_waiting_receive(
    broker: NodeProcess, prefix: str
) -> None:
    async with open_cluster_backend(broker.service_url) as backend:
        consumer = await backend.subscribe(spec("c", f"{prefix}/+", durable=False))
        outcome: list[BaseException] = []

        async def wait() -> None:
            try:
                await consumer.receive(1)
            except ConsumerClosed as exc:
                outcome.append(exc)

        with trio.fail_after(DEADLINE):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait)
                await trio.testing.wait_all_tasks_blocked()
                await backend.aclose()
    assert len(outcome) == 1


async def test_backends_opened_and_closed_in_one_process_leave_no_descriptors(
    broker: NodeProcess, prefix: str
) -> None:
    # pulsar-client keeps a reader that has a listener, and its whole client (threads and
    # six descriptors), alive after both are closed: the fan-out must not use listeners.
    def descriptors() -> int:
        return len(os.listdir("/proc/self/fd"))

    async def one_backend() -> None:
        async with open_cluster_backend(broker.service_url) as backend:
            consumer = await backend.subscribe(spec("c", f"{prefix}/#", durable=False))
            await backend.publish(mqtt_to_pulsar(f"{prefix}/t"), Message(b"x"))
            with trio.fail_after(DEADLINE):
                assert [d.message.payload for d in await consumer.receive(1)] == [b"x"]
            await consumer.close()

    await one_backend()  # the first run loads what stays loaded for good
    before = descriptors()
    for _ in range(3):
        await one_backend()
    assert descriptors() <= before + 2, (before, descriptors())
