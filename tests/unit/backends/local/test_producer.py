"""`LocalProducer` through the `Producer` contract: ordered sends awaited for durability,
unawaited sends, access modes and fencing."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from mop.message import Message
from mop.processor.backend import (
    Backend,
    ProducerAccess,
    ProducerBusy,
    ProducerFenced,
    ProducerSpec,
)
from tests.unit.backends.local.support import T, spec


@pytest.fixture
def backend_options() -> dict[str, Any]:
    return {}  # the backend's own defaults


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
