"""`LocalBackend` through the `Backend` contract: consumers, tables, errors, batched publishing
(one sync for a batch) and at-most-once QoS 0 done by the broker."""

from __future__ import annotations

import errno
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
import trio.testing

from mop.backends.local import LocalBackend, open_local_backend
from mop.broker.storage import MemoryStorage, StorageError
from mop.broker.storage import durable as durable_module
from mop.broker.storage.durable import open_durable_storage
from mop.membership import Membership
from mop.message import Message
from mop.processor.backend import (
    Backend,
    BackendError,
    ConsumerClosed,
    ProducerSpec,
    PublishResult,
    QuotaExceeded,
    StartPosition,
    SubscriptionKind,
    SubscriptionSpec,
)
from mop.settings import StorageSettings
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


class FailingSync(MemoryStorage):
    """Memory storage whose writes fail (`sync` raises) while `failing` is set."""

    failing = False

    async def sync(self) -> None:
        if self.failing:
            await trio.lowlevel.checkpoint()
            raise StorageError("the disk went away")
        await super().sync()


@pytest.fixture
async def limited() -> AsyncIterator[LocalBackend]:
    """A backend over 20 bytes of storage whose writes fail while `failing` is set."""
    async with open_local_backend(FailingSync(max_bytes=20)) as running:
        yield running


def kinds(results: list[PublishResult | BackendError]) -> list[str]:
    return [type(r).__name__ for r in results]


async def test_batch_is_routed_in_order_with_one_sync(limited: LocalBackend) -> None:
    assert limited.capabilities.publish_batch
    consumer = await limited.subscribe(SubscriptionSpec("s", frozenset(["a"])))
    storage = limited.storage
    assert isinstance(storage, MemoryStorage)
    syncs = storage.syncs
    items = [(T("a"), message(str(n), qos=n % 2)) for n in range(6)]
    results = await limited.publish_batch(items)
    assert storage.syncs == syncs + 1
    assert all(isinstance(r, PublishResult) and r.subscriptions == 1 for r in results)
    ids = [r.message_id for r in results if isinstance(r, PublishResult)]
    assert ids == sorted(ids)
    received = await consumer.receive(10)
    assert [d.message.payload for d in received] == [b"0", b"1", b"2", b"3", b"4", b"5"]


async def test_qos0_only_batch_does_not_sync(limited: LocalBackend) -> None:
    storage = limited.storage
    assert isinstance(storage, MemoryStorage)
    syncs = storage.syncs
    await limited.publish_batch([(T("a"), message("x", qos=0))])
    assert storage.syncs == syncs


async def test_a_refused_item_does_not_stop_the_others(limited: LocalBackend) -> None:
    # 20 bytes of storage: the second message does not fit, the third (empty) does.
    items = [(T("a"), message("0123456789")), (T("a"), message("x" * 15)), (T("a"), message(""))]
    results = await limited.publish_batch(items)
    assert kinds(results) == ["PublishResult", "QuotaExceeded", "PublishResult"]
    assert isinstance(results[1], QuotaExceeded) and results[1].reason == "quota_exceeded"


async def test_a_failed_write_fails_every_item_that_waited_for_it(limited: LocalBackend) -> None:
    storage = limited.storage
    assert isinstance(storage, FailingSync)
    storage.failing = True
    items = [(T("a"), message("1", qos=1)), (T("a"), message("2", qos=0))]
    results = await limited.publish_batch(items)
    assert isinstance(results[0], BackendError) and results[0].reason == "storage_error"
    assert isinstance(results[1], PublishResult)  # QoS 0 never waited for the write


@pytest.mark.parametrize(("auto_ack", "back"), [(True, []), (False, [b"q0"])])
async def test_auto_ack_qos0_is_never_delivered_again(
    limited: LocalBackend, auto_ack: bool, back: list[bytes]
) -> None:
    spec = SubscriptionSpec("s", frozenset(["a"]), auto_ack_qos0=auto_ack)
    consumer = await limited.subscribe(spec)
    await limited.publish(T("a"), message("q0", qos=0))
    assert [d.message.payload for d in await consumer.receive(10)] == [b"q0"]
    await consumer.close()  # without acknowledging
    again = await limited.subscribe(spec)
    got: list[bytes] = []
    with trio.move_on_after(0.2):
        got = [d.message.payload for d in await again.receive(10)]
    assert got == back


@pytest.mark.parametrize("fsync", ["always", "never"])  # a worker thread's write, an inline one
async def test_a_publish_refused_by_a_full_disk_is_neither_delivered_nor_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fsync: str
) -> None:
    monkeypatch.setattr(durable_module, "_FULL_BACKOFF", 0.0)
    settings = StorageSettings(fsync=fsync)  # type: ignore[arg-type]
    storage = await open_durable_storage(tmp_path, settings)
    topic = T("a")
    async with open_local_backend(storage) as backend:
        consumer = await backend.subscribe(spec("s", "a", max_backlog=100))
        await backend.publish(topic, message("before"))
        assert [d.message.payload for d in await consumer.receive(10)] == [b"before"]

        def full(fd: int, data: memoryview, offset: int) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(os, "pwrite", full)
        results = await backend.publish_batch([(topic, message("refused"))])
        assert isinstance(results[0], QuotaExceeded)
        with trio.move_on_after(0.2):
            delivered = await consumer.receive(10)
            pytest.fail(f"a refused publish was delivered: {delivered}")
        monkeypatch.undo()
        await backend.publish(topic, message("after"))
        assert [d.message.payload for d in await consumer.receive(10)] == [b"after"]
    await storage.aclose()
    storage = await open_durable_storage(tmp_path, settings)
    try:
        kept = [m.payload for _, m in await storage.read(topic, None, 10)]
        assert kept == [b"before", b"after"]
    finally:
        await storage.aclose()


# -- the node's own topics ------------------------------------------------------------------------

SYS_EVENT = T("$SYS/brokers/n/clients/c/connected")


async def test_sys_topics_skip_the_broker_and_its_storage(
    backend: Backend, storage: MemoryStorage
) -> None:
    consumer = await backend.subscribe(spec("watch", "$SYS/brokers/+/clients/+/+", "a"))
    results = await backend.publish_batch(
        [(SYS_EVENT, message("1", qos=0)), (T("a"), message("2"))]
    )
    assert [r.subscriptions for r in results if isinstance(r, PublishResult)] == [1, 1]
    got = await consumer.receive(10)
    got += await consumer.receive(10) if len(got) < 2 else []
    assert sorted(d.message.payload for d in got) == [b"1", b"2"]
    consumer.ack(got)  # the `$SYS` one is nobody's to acknowledge: a no-op
    assert await backend.topics("public/default") == [T("a")]
    assert storage.last_id(SYS_EVENT) is None


async def test_sys_selectors_come_and_go_with_the_consumer(backend: Backend) -> None:
    consumer = await backend.subscribe(spec("watch", "a"))
    assert (await backend.publish(SYS_EVENT, message("before", qos=0))).subscriptions == 0
    await consumer.add_selector("$SYS/#")
    await backend.publish(SYS_EVENT, message("during", qos=0))
    assert [d.message.payload for d in await consumer.receive(10)] == [b"during"]
    await consumer.remove_selector("$SYS/#")
    assert (await backend.publish(SYS_EVENT, message("after", qos=0))).subscriptions == 0
    await consumer.close()
    assert SYS_EVENT not in await backend.topics("public/default")


async def test_a_permit_based_consumer_gets_sys_messages_within_its_permits(
    backend: Backend,
) -> None:
    consumer = await backend.subscribe(
        SubscriptionSpec(name="p", selectors=frozenset({SYS_EVENT}), permits=True)
    )
    for n in range(3):
        await backend.publish(SYS_EVENT, message(str(n), qos=0))
    with trio.move_on_after(0.1) as waited:
        await consumer.receive(10)
    assert waited.cancelled_caught  # no permits yet
    consumer.grant(2)
    assert [d.message.payload for d in await consumer.receive(10)] == [b"0", b"1"]
    consumer.grant(5)
    assert [d.message.payload for d in await consumer.receive(10)] == [b"2"]


class GatedSync(MemoryStorage):
    """Memory storage whose syncs wait for `gate` while there is one."""

    gate: trio.Event | None = None

    async def sync(self) -> None:
        if self.gate is not None:
            await self.gate.wait()
        await super().sync()


async def test_a_second_producer_of_a_new_topic_waits_for_its_record() -> None:
    """A producer opened while the topic's record is being written is not told it exists
    before that record is durable."""
    storage = GatedSync()
    async with open_local_backend(storage) as backend:
        storage.gate = gate = trio.Event()
        opened: list[str] = []

        async def open_one(name: str) -> None:
            await backend.open_producer(ProducerSpec(T("new"), name))
            opened.append(name)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(open_one, "first")
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(open_one, "second")
            await trio.testing.wait_all_tasks_blocked()
            assert opened == []
            gate.set()
        assert sorted(opened) == ["first", "second"]
