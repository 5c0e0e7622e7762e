"""The processor's fallbacks for a backend that lacks a capability (see
`BackendCapabilities`): one publish per item instead of a batch, and acknowledging QoS 0
itself for at-most-once subscriptions."""

from __future__ import annotations

import dataclasses
import logging
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
from mop.processor.drops import DropLog
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


async def test_messages_the_backend_drops_are_counted_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with open_local_backend(MemoryStorage()) as local:
        processor = MessagingProcessor(local)
        processor.drop_log = DropLog(clock=lambda: 0.0)  # no time passes: one line
        spec = SubscriptionSpec("slow", frozenset(["a"]), max_backlog=2)
        consumer = await processor.subscribe(CTX, spec)
        await consumer.close()
        with caplog.at_level(logging.WARNING, logger="mop.processor"):
            for n in range(50):
                await local.publish(T("a"), message(str(n)))
        assert processor.stats.messages_dropped == 48 == local.stats().messages_dropped
        lines = [r.getMessage() for r in caplog.records if r.name == "mop.processor"]
        assert lines == ["subscription 'slow': 1 message(s) dropped (queue full)"]


def test_the_drop_log_sums_drops_per_subscription_and_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    log = DropLog(interval=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="mop.processor"):
        for second in range(25):
            now[0] = float(second)
            for _ in range(100):
                log.note("a", "queue full", 1)
            log.note("b", "queue full", 2)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "subscription 'a': 1 message(s) dropped (queue full)",
        "subscription 'b': 2 message(s) dropped (queue full)",
        # At 10 s: a's first drop of that second is counted in, then b is logged by the sweep.
        "subscription 'a': 1000 message(s) dropped in the last 10 s (queue full)",
        "subscription 'b': 18 message(s) dropped in the last 10 s (queue full)",
        "subscription 'a': 1000 message(s) dropped in the last 10 s (queue full)",
        "subscription 'b': 20 message(s) dropped in the last 10 s (queue full)",
    ]
