"""The optional parts of the backend contract on `LocalBackend`, and the processor's fallbacks
for a backend without them: batched publishing, at-most-once QoS 0, fencing callbacks."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

from mop.backends.local import LocalBackend, open_local_backend
from mop.broker.storage import MemoryStorage, StorageError
from mop.message import Message
from mop.processor import (
    BackendCapabilities,
    BackendError,
    ClientContext,
    Consumer,
    MessagingProcessor,
    PublishResult,
    QuotaExceeded,
    SubscriptionSpec,
)
from mop.topic_names import mqtt_to_pulsar as T

CTX = ClientContext(client_id="c", protocol="test")


def message(payload: str, qos: int = 1) -> Message:
    return Message(payload.encode(), qos=qos)


class FailingSync(MemoryStorage):
    """Memory storage whose writes fail (`sync` raises) while `failing` is set."""

    failing = False

    async def sync(self) -> None:
        if self.failing:
            await trio.lowlevel.checkpoint()
            raise StorageError("the disk went away")
        await super().sync()


@pytest.fixture
async def backend() -> AsyncIterator[LocalBackend]:
    async with open_local_backend(FailingSync(max_bytes=20)) as running:
        yield running


def kinds(results: list[PublishResult | BackendError]) -> list[str]:
    return [type(r).__name__ for r in results]


async def test_batch_is_routed_in_order_with_one_sync(backend: LocalBackend) -> None:
    assert backend.capabilities.publish_batch
    consumer = await backend.subscribe(SubscriptionSpec("s", frozenset(["a"])))
    storage = backend.storage
    assert isinstance(storage, MemoryStorage)
    syncs = storage.syncs
    items = [(T("a"), message(str(n), qos=n % 2)) for n in range(6)]
    results = await backend.publish_batch(items)
    assert storage.syncs == syncs + 1
    assert all(isinstance(r, PublishResult) and r.subscriptions == 1 for r in results)
    ids = [r.message_id for r in results if isinstance(r, PublishResult)]
    assert ids == sorted(ids)
    received = await consumer.receive(10)
    assert [d.message.payload for d in received] == [b"0", b"1", b"2", b"3", b"4", b"5"]


async def test_qos0_only_batch_does_not_sync(backend: LocalBackend) -> None:
    storage = backend.storage
    assert isinstance(storage, MemoryStorage)
    syncs = storage.syncs
    await backend.publish_batch([(T("a"), message("x", qos=0))])
    assert storage.syncs == syncs


async def test_a_refused_item_does_not_stop_the_others(backend: LocalBackend) -> None:
    # 20 bytes of storage: the second message does not fit, the third (empty) does.
    items = [(T("a"), message("0123456789")), (T("a"), message("x" * 15)), (T("a"), message(""))]
    results = await backend.publish_batch(items)
    assert kinds(results) == ["PublishResult", "QuotaExceeded", "PublishResult"]
    assert isinstance(results[1], QuotaExceeded) and results[1].reason == "quota_exceeded"


async def test_a_failed_write_fails_every_item_that_waited_for_it(backend: LocalBackend) -> None:
    storage = backend.storage
    assert isinstance(storage, FailingSync)
    storage.failing = True
    items = [(T("a"), message("1", qos=1)), (T("a"), message("2", qos=0))]
    results = await backend.publish_batch(items)
    assert isinstance(results[0], BackendError) and results[0].reason == "storage_error"
    assert isinstance(results[1], PublishResult)  # QoS 0 never waited for the write


class PlainBackend:
    """Only `publish` of the contract: what the processor needs for its fallback."""

    capabilities = BackendCapabilities()

    def __init__(self, backend: LocalBackend) -> None:
        self.inner = backend
        self.calls = 0

    async def publish(self, topic: str, message: Message) -> PublishResult:
        self.calls += 1
        return await self.inner.publish(topic, message)


async def test_processor_falls_back_to_one_publish_per_item(backend: LocalBackend) -> None:
    plain = PlainBackend(backend)
    processor = MessagingProcessor(plain)  # type: ignore[arg-type]
    items = [(T("a"), message("0123456789")), (T("a"), message("x" * 15))]
    results = await processor.publish_batch(CTX, items)
    assert plain.calls == 2
    assert kinds(results) == ["PublishResult", "QuotaExceeded"]
    assert processor.stats.messages_received == 2


async def test_processor_uses_the_batch_of_a_backend_that_has_one(backend: LocalBackend) -> None:
    processor = MessagingProcessor(backend)
    results = await processor.publish_batch(CTX, [(T("a"), message("1"))] * 3)
    assert len(results) == 3 and processor.stats.messages_received == 3
    assert isinstance(results[0], PublishResult)


@pytest.mark.parametrize(("auto_ack", "back"), [(True, []), (False, [b"q0"])])
async def test_auto_ack_qos0_is_never_delivered_again(
    backend: LocalBackend, auto_ack: bool, back: list[bytes]
) -> None:
    spec = SubscriptionSpec("s", frozenset(["a"]), auto_ack_qos0=auto_ack)
    consumer = await backend.subscribe(spec)
    await backend.publish(T("a"), message("q0", qos=0))
    assert [d.message.payload for d in await consumer.receive(10)] == [b"q0"]
    await consumer.close()  # without acknowledging
    again = await backend.subscribe(spec)
    got: list[bytes] = []
    with trio.move_on_after(0.2):
        got = [d.message.payload for d in await again.receive(10)]
    assert got == back


class NoAutoAck:
    """A backend that leaves `auto_ack_qos0` to the processor (it asks the broker for
    consumers that do not acknowledge anything themselves)."""

    capabilities = BackendCapabilities()

    def __init__(self, backend: LocalBackend) -> None:
        self.inner = backend

    async def publish(self, topic: str, message: Message) -> PublishResult:
        return await self.inner.publish(topic, message)

    async def subscribe(self, spec: SubscriptionSpec) -> Consumer:
        return await self.inner.subscribe(dataclasses.replace(spec, auto_ack_qos0=False))


async def test_processor_acknowledges_qos0_for_a_backend_that_does_not(
    backend: LocalBackend,
) -> None:
    processor = MessagingProcessor(NoAutoAck(backend))  # type: ignore[arg-type]
    spec = SubscriptionSpec("s", frozenset(["a"]), auto_ack_qos0=True)
    consumer = await processor.subscribe(CTX, spec)
    await backend.publish(T("a"), message("q0", qos=0))
    await backend.publish(T("a"), message("q1", qos=1))
    assert [d.message.payload for d in await consumer.receive(10)] == [b"q0", b"q1"]
    await consumer.close()  # without acknowledging anything
    again = await processor.subscribe(CTX, spec)
    assert [d.message.payload for d in await again.receive(10)] == [b"q1"]


async def test_fencing_calls_back_once(backend: LocalBackend) -> None:
    calls: list[str] = []
    first = await backend.open_client("dev")
    assert backend.capabilities.fence_callbacks
    first.on_fenced(lambda: calls.append("first"))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(backend.open_client, "dev")
        await trio.testing.wait_all_tasks_blocked()
        assert calls == ["first"]
        await first.release()
    # A lease fenced already calls back at once.
    first.on_fenced(lambda: calls.append("late"))
    assert calls == ["first", "late"]


async def test_a_released_lease_never_calls_back(backend: LocalBackend) -> None:
    calls: list[str] = []
    lease = await backend.open_client("dev")
    assert backend.capabilities.fence_callbacks
    lease.on_fenced(lambda: calls.append("fenced"))
    await lease.release()
    await backend.open_client("dev")
    assert calls == []
