"""`LocalConsumer` through the contract added for Pulsar: permits, seek, positions, failover
activity, deliver_at, start ids."""

from __future__ import annotations

import time
from typing import Any

import pytest
import trio

from mop.message import Message, MessageId
from mop.processor.backend import (
    Backend,
    ProducerSpec,
    StartPosition,
    SubscriptionKind,
)
from tests.unit.backends.local.support import T, spec


@pytest.fixture
def backend_options() -> dict[str, Any]:
    return {}  # the backend's own defaults


async def test_permits_seek_and_position(backend: Backend) -> None:
    consumer = await backend.subscribe(spec(permits=True))
    producer = await backend.open_producer(ProducerSpec(T, "p"))
    ids = [(await producer.send(Message(f"m{i}".encode()))).message_id for i in range(3)]
    with trio.move_on_after(0.1):
        await consumer.receive(10)
        raise AssertionError("received without permits")
    consumer.grant(3)
    deliveries = await consumer.receive(10)
    consumer.ack_through(T, ids[2])
    position = await consumer.position(T)
    assert (position.last, position.mark_delete) == (ids[2], ids[2])
    await consumer.seek(T, message_id=ids[1])
    consumer.grant(10)
    again = await consumer.receive(10)
    assert [d.message.payload for d in again] == [b"m1", b"m2"]
    assert len(deliveries) == 3


async def test_failover_activity_changes_are_reported(backend: Backend) -> None:
    failover = SubscriptionKind.FAILOVER
    second = await backend.subscribe(spec(kind=failover, consumer_name="b"))
    assert second.active
    first = await backend.subscribe(spec(kind=failover, consumer_name="a"))
    assert first.active
    with trio.fail_after(1):
        assert await second.active_changed() is False
    async with trio.open_nursery() as nursery:

        async def close_first() -> None:
            await trio.sleep(0.05)
            await first.close()

        nursery.start_soon(close_first)
        with trio.fail_after(1):
            assert await second.active_changed() is True


async def test_deliver_at_is_released_on_time(backend: Backend) -> None:
    consumer = await backend.subscribe(spec(kind=SubscriptionKind.SHARED))
    due = int(time.time() * 1000) + 200
    await backend.publish(T, Message(b"later", deliver_at=due))
    with trio.fail_after(2):
        [delivery] = await consumer.receive(1)
    assert time.time() * 1000 >= due - 5
    assert delivery.message.payload == b"later"


async def test_topics_and_start_ids(backend: Backend) -> None:
    keeper = await backend.subscribe(spec("keeper"))
    ids = [(await backend.publish(T, Message(f"m{i}".encode()))).message_id for i in range(3)]
    reader = await backend.subscribe(
        spec("reader", durable=False, start=StartPosition.LATEST, start_at=ids[1])
    )
    assert [d.message.payload for d in await reader.receive(10)] == [b"m1", b"m2"]
    assert await backend.topics("public/default") == [T]
    assert MessageId(0, 0) in ids
    await keeper.close()
