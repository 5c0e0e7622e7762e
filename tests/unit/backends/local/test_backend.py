"""`LocalBackend` through the `Backend` contract only: leases, consumers, tables, errors."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

from mop.backends.local import open_local_backend
from mop.broker.storage import MemoryStorage
from mop.membership import Membership
from mop.message import Message
from mop.processor.backend import (
    Backend,
    BackendError,
    ConsumerClosed,
    QuotaExceeded,
    StartPosition,
    SubscriptionKind,
    SubscriptionSpec,
)
from mop.topic_names import mqtt_to_pulsar


def spec(
    name: str,
    *selectors: str,
    kind: SubscriptionKind = SubscriptionKind.EXCLUSIVE,
    member: str = "",
    start: StartPosition = StartPosition.LATEST,
    max_backlog: int = 0,
) -> SubscriptionSpec:
    return SubscriptionSpec(
        name=name,
        selectors=frozenset(selectors),
        kind=kind,
        member=member,
        start=start,
        max_backlog=max_backlog,
    )


def message(payload: str, qos: int = 1) -> Message:
    return Message(payload.encode(), qos=qos)


T = mqtt_to_pulsar


@pytest.fixture
def storage() -> MemoryStorage:
    return MemoryStorage()


@pytest.fixture
async def backend(storage: MemoryStorage) -> AsyncIterator[Backend]:
    async with open_local_backend(storage, fence_timeout=5.0, trim_interval=0.5) as running:
        yield running


async def test_publish_subscribe_receive_ack(backend: Backend) -> None:
    consumer = await backend.subscribe(spec("c1", "a/+", max_backlog=1000))
    result = await backend.publish(T("a/b"), message("hello"))
    assert result.subscriptions == 1
    nobody = await backend.publish(T("z"), message("void"))
    assert nobody.subscriptions == 0
    deliveries = await consumer.receive(10)
    assert [d.message.payload for d in deliveries] == [b"hello"]
    assert deliveries[0].message_id == result.message_id
    consumer.ack(deliveries)
    assert consumer.spec.name == "c1"


async def test_receive_waits_for_a_publish(backend: Backend) -> None:
    consumer = await backend.subscribe(spec("c1", "a"))
    received: list[bytes] = []

    async def receiver() -> None:
        received.extend(d.message.payload for d in await consumer.receive(5))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receiver)
        await trio.testing.wait_all_tasks_blocked()
        assert received == []
        await backend.publish(T("a"), message("1", qos=0))
    assert received == [b"1"]


async def test_close_wakes_receiver_with_consumer_closed(backend: Backend) -> None:
    consumer = await backend.subscribe(spec("c1", "a"))
    async with trio.open_nursery() as nursery:

        async def receiver() -> None:
            with pytest.raises(ConsumerClosed):
                await consumer.receive(1)

        nursery.start_soon(receiver)
        await trio.testing.wait_all_tasks_blocked()
        await consumer.close()
    with pytest.raises(ConsumerClosed):
        await consumer.receive(1)
    consumer.ack([])  # harmless after close
    with pytest.raises(ConsumerClosed):
        await consumer.add_selector("b")


async def test_persistent_session_gets_unacked_then_backlog(backend: Backend) -> None:
    consumer = await backend.subscribe(spec("c1", "s/#", max_backlog=1000))
    for n in range(3):
        await backend.publish(T("s/x"), message(str(n)))
    got = await consumer.receive(3)
    consumer.ack(got[:1])
    await consumer.close()
    await backend.publish(T("s/x"), message("3"))
    await backend.publish(T("s/new"), message("4"))
    consumer = await backend.subscribe(spec("c1", "s/#", max_backlog=1000))
    again = await consumer.receive(10)
    assert [(d.message.payload, d.redelivery_count) for d in again[:2]] == [(b"1", 1), (b"2", 1)]
    assert sorted(d.message.payload for d in again[2:]) == [b"3", b"4"]
    consumer.ack(again)
    await consumer.unsubscribe()
    assert (await backend.publish(T("s/x"), message("5"))).subscriptions == 0


async def test_selectors_can_change(backend: Backend) -> None:
    consumer = await backend.subscribe(spec("c1", "a"))
    await consumer.add_selector("b/#")
    assert consumer.spec.selectors == {"a", "b/#"}
    await backend.publish(T("b/1"), message("b"))
    assert [d.message.payload for d in await consumer.receive(5)] == [b"b"]
    await consumer.remove_selector("b/#")
    assert (await backend.publish(T("b/1"), message("b"))).subscriptions == 0


async def test_shared_members_and_delete_subscription(backend: Backend) -> None:
    kind = SubscriptionKind.SHARED
    one = await backend.subscribe(spec("g", "t", kind=kind, member="m1"))
    two = await backend.subscribe(spec("g", "t", kind=kind, member="m2"))
    await backend.publish(T("t"), message("1"))
    await backend.publish(T("t"), message("2"))
    assert len(await one.receive(5)) == 1
    assert len(await two.receive(5)) == 1
    with pytest.raises(BackendError) as busy:
        await backend.delete_subscription("g", "m1")
    assert busy.value.reason == "consumer_busy"
    await one.close()
    await backend.delete_subscription("g", "m1")
    await two.unsubscribe()
    assert (await backend.publish(T("t"), message("3"))).subscriptions == 0


async def test_exclusive_consumer_busy(backend: Backend) -> None:
    await backend.subscribe(spec("c1", "a"))
    with pytest.raises(BackendError) as busy:
        await backend.subscribe(spec("c1", "a"))
    assert busy.value.reason == "consumer_busy"


async def test_nack_with_delay(backend: Backend, autojump_clock: trio.abc.Clock) -> None:
    consumer = await backend.subscribe(spec("c1", "a"))
    await backend.publish(T("a"), message("1"))
    got = await consumer.receive(1)
    start = trio.current_time()
    consumer.nack(got, delay=2.0)
    again = await consumer.receive(1)
    assert trio.current_time() - start >= 2.0
    assert again[0].redelivery_count == 1


async def test_earliest_start(backend: Backend) -> None:
    await backend.publish(T("log"), message("old"))
    consumer = await backend.subscribe(spec("reader", "log", start=StartPosition.EARLIEST))
    assert [d.message.payload for d in await consumer.receive(5)] == [b"old"]


async def test_lease_fencing_waits_for_release(backend: Backend) -> None:
    first = await backend.open_client("dev")
    assert first.client_id == "dev"
    second_lease = []
    async with trio.open_nursery() as nursery:

        async def take_over() -> None:
            second_lease.append(await backend.open_client("dev"))

        nursery.start_soon(take_over)
        with trio.fail_after(1):
            await first.wait_fenced()
        await trio.testing.wait_all_tasks_blocked()
        assert second_lease == []  # still waiting for the first to let go
        await first.release()
    second = second_lease[0]
    with trio.move_on_after(0.01) as scope:
        await second.wait_fenced()
    assert scope.cancelled_caught  # the new holder is not fenced
    await second.release()
    third = await backend.open_client("dev")  # nobody holds it: no wait
    await third.release()


async def test_lease_takeover_is_bounded(
    storage: MemoryStorage, autojump_clock: trio.abc.Clock
) -> None:
    async with open_local_backend(storage, fence_timeout=3.0) as backend:
        stuck = await backend.open_client("dev")
        start = trio.current_time()
        second = await backend.open_client("dev")
        assert trio.current_time() - start == pytest.approx(3.0)
        with trio.fail_after(1):
            await stuck.wait_fenced()
        await stuck.release()  # late release must not drop the new holder
        third_started = trio.current_time()
        await backend.open_client("dev")
        assert trio.current_time() - third_started == pytest.approx(3.0)
        await second.release()


async def test_tables_write_through(storage: MemoryStorage) -> None:
    async with open_local_backend(storage) as backend:
        table = backend.table("retained")
        assert table.name == "retained"
        await table.put("a/b", b"1")
        await table.put("c", b"2")
        await table.put("c", None)
        assert table.get("a/b") == b"1"
        assert table.get("c") is None
        assert backend.table("retained") is table
        with pytest.raises(ValueError):
            backend.table("$broker/subscriptions")
    storage.reopen()
    async with open_local_backend(storage) as backend:
        assert list(backend.table("retained").items()) == [("a/b", b"1")]


async def test_durable_state_survives_a_restart(storage: MemoryStorage) -> None:
    async with open_local_backend(storage) as backend:
        consumer = await backend.subscribe(spec("c1", "a/#"))
        await backend.publish(T("a/1"), message("1"))
        await backend.publish(T("a/1"), message("2"))
        consumer.ack((await consumer.receive(1))[:1])
    storage.reopen()
    async with open_local_backend(storage) as backend:
        consumer = await backend.subscribe(spec("c1", "a/#"))
        assert [d.message.payload for d in await consumer.receive(5)] == [b"2"]


async def test_aclose_closes_consumers_and_refuses_calls(storage: MemoryStorage) -> None:
    async with open_local_backend(storage) as backend:
        consumer = await backend.subscribe(spec("c1", "a"))
        lease = await backend.open_client("x")
        async with trio.open_nursery() as nursery:

            async def receiver() -> None:
                with pytest.raises(ConsumerClosed):
                    await consumer.receive(1)

            nursery.start_soon(receiver)
            await trio.testing.wait_all_tasks_blocked()
            await backend.aclose()
        with trio.fail_after(1):
            await lease.wait_fenced()
        with pytest.raises(BackendError):
            await backend.publish(T("a"), message("late"))


async def test_full_storage_is_a_quota_error() -> None:
    async with open_local_backend(MemoryStorage(max_bytes=8)) as backend:
        await backend.publish(T("a"), message("1234"))
        with pytest.raises(QuotaExceeded):
            await backend.publish(T("a"), message("56789"))


async def test_lookup_stats_and_trimming(
    storage: MemoryStorage, autojump_clock: trio.abc.Clock
) -> None:
    async with open_local_backend(
        storage, membership=Membership((), "pulsar://node:6650"), trim_interval=1.0
    ) as backend:
        assert await backend.lookup(T("a")) == "pulsar://node:6650"
        consumer = await backend.subscribe(spec("c1", "a"))
        await backend.publish(T("a"), message("1"))
        await backend.publish(T("b"), message("2"))
        stats = backend.stats()
        assert (stats.topics, stats.subscriptions, stats.consumers) == (2, 1, 1)
        assert stats.messages_stored == 2
        consumer.ack(await consumer.receive(5))
        await trio.sleep(1.5)
        assert backend.stats().messages_stored == 0
