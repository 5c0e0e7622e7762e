"""`LocalBackend` through the contract added for Pulsar: producers (access modes, fencing,
ordered sends, deduplication), permits, seek, positions, failover activity, deliver_at."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import trio

from mop.backends.local import open_local_backend
from mop.broker.storage import MemoryStorage
from mop.message import Message, MessageId
from mop.processor.backend import (
    Backend,
    ProducerAccess,
    ProducerBusy,
    ProducerFenced,
    ProducerSpec,
    StartPosition,
    SubscriptionKind,
    SubscriptionSpec,
)

T = "persistent://public/default/t"


def spec(name: str = "s", **fields: object) -> SubscriptionSpec:
    return SubscriptionSpec(name=name, selectors=frozenset([T]), **fields)  # type: ignore[arg-type]


@pytest.fixture
async def backend() -> AsyncIterator[Backend]:
    async with open_local_backend(MemoryStorage()) as running:
        yield running


async def test_sends_are_stored_in_call_order_and_awaited_for_durability(
    backend: Backend,
) -> None:
    consumer = await backend.subscribe(spec())
    producer = await backend.open_producer(ProducerSpec(T, "p"))
    pending = [producer.send(Message(f"m{i}".encode()), sequence_id=i) for i in range(5)]
    results = [await stored for stored in pending]
    assert [r.message_id for r in results] == sorted(r.message_id for r in results)
    assert producer.last_sequence_id == 4
    duplicate = await producer.send(Message(b"again"), sequence_id=3)
    assert duplicate.duplicate
    deliveries = await consumer.receive(10)
    assert [d.message.payload for d in deliveries] == [f"m{i}".encode() for i in range(5)]


async def test_an_unawaited_send_is_stored_anyway(backend: Backend) -> None:
    consumer = await backend.subscribe(spec())
    producer = await backend.open_producer(ProducerSpec(T, "p"))
    producer.send(Message(b"fire and forget"))
    assert [d.message.payload for d in await consumer.receive(1)] == [b"fire and forget"]


async def test_access_modes_through_the_backend(backend: Backend) -> None:
    holder = await backend.open_producer(ProducerSpec(T, "a", ProducerAccess.EXCLUSIVE))
    assert holder.ready and holder.topic_epoch is not None
    with pytest.raises(ProducerBusy):
        await backend.open_producer(ProducerSpec(T, "b"))
    waiter = await backend.open_producer(ProducerSpec(T, "c", ProducerAccess.WAIT_FOR_EXCLUSIVE))
    assert not waiter.ready
    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter.wait_ready)
        await trio.sleep(0.05)
        await holder.close()
    assert waiter.ready
    fencer = await backend.open_producer(
        ProducerSpec(T, "d", ProducerAccess.EXCLUSIVE_WITH_FENCING)
    )
    with trio.fail_after(1):
        await waiter.wait_fenced()
    with pytest.raises(ProducerFenced):
        waiter.send(Message(b"late"))
    await fencer.send(Message(b"mine"))


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
