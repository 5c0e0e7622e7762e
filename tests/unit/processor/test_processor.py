"""The processor's fallbacks for a backend that lacks a capability (see
`BackendCapabilities`): one publish per item instead of a batch, and acknowledging QoS 0
itself for at-most-once subscriptions."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import pytest

from mop.backends.local import LocalBackend, open_local_backend
from mop.broker.storage import MemoryStorage
from mop.message import Message
from mop.processor import (
    BackendCapabilities,
    BackendError,
    ClientContext,
    Consumer,
    MessagingProcessor,
    PublishResult,
    SubscriptionSpec,
)
from mop.topic_names import mqtt_to_pulsar as T

CTX = ClientContext(client_id="c", protocol="test")


def message(payload: str, qos: int = 1) -> Message:
    return Message(payload.encode(), qos=qos)


@pytest.fixture
async def backend() -> AsyncIterator[LocalBackend]:
    async with open_local_backend(MemoryStorage(max_bytes=20)) as running:
        yield running


def kinds(results: list[PublishResult | BackendError]) -> list[str]:
    return [type(r).__name__ for r in results]


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
