"""A broker killed (SIGKILL) and restarted under QoS 1 traffic: the ClusterBackend recovers
without a restart of its own, and every publish it acknowledged is delivered."""

from __future__ import annotations

from pathlib import Path

import trio

from mop.message import Message
from mop.processor.backend import BackendError, SubscriptionSpec
from mop.testing.cluster import open_cluster_backend
from mop.topic_names import mqtt_to_pulsar
from tests.e2e.nodeproc import broker_process

MESSAGES = 300
DEADLINE = 60.0


async def test_broker_kill_and_restart_loses_no_acknowledged_message(tmp_path: Path) -> None:
    broker = broker_process(tmp_path / "data")
    port = await trio.to_thread.run_sync(broker.start)
    topic = mqtt_to_pulsar("resilience/a")
    acknowledged: list[int] = []
    refused: list[int] = []
    received: set[int] = set()
    try:
        async with open_cluster_backend(broker.service_url) as backend:
            consumer = await backend.subscribe(
                SubscriptionSpec(name="resilience", selectors=frozenset(["resilience/+"]))
            )
            halfway = trio.Event()

            async def publish() -> None:
                for index in range(MESSAGES):
                    if index == MESSAGES // 3:
                        halfway.set()
                    try:
                        await backend.publish(topic, Message(b"%d" % index, qos=1))
                    except BackendError:
                        refused.append(index)  # failed, not lost: the client was told
                    else:
                        acknowledged.append(index)
                    await trio.sleep(0.005)

            published = trio.Event()
            all_in = trio.Event()

            def check() -> None:
                if published.is_set() and set(acknowledged) <= received:
                    all_in.set()

            async def consume() -> None:
                while True:
                    deliveries = await consumer.receive(100)
                    received.update(int(d.message.payload) for d in deliveries)
                    consumer.ack(deliveries)
                    check()

            with trio.fail_after(DEADLINE):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(consume)
                    async with trio.open_nursery() as publishers:
                        publishers.start_soon(publish)
                        await halfway.wait()
                        await trio.to_thread.run_sync(broker.kill)
                        await trio.to_thread.run_sync(
                            lambda: broker.start(MOP_PULSAR__PORT=str(port))
                        )
                    published.set()
                    check()
                    await all_in.wait()
                    nursery.cancel_scope.cancel()
    finally:
        broker.close()
    assert len(acknowledged) + len(refused) == MESSAGES
    assert acknowledged, "publishing went on after the restart"
    assert set(acknowledged) <= received
