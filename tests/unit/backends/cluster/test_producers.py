"""Send slots of the separated-mode producers: which sends carry a completion callback, and
how receipts free the slots of the qos-0 sends made without one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import _pulsar
import trio
import trio.testing

from mop.backends.cluster.bridge import Bridge
from mop.backends.cluster.options import ProducerOptions
from mop.backends.cluster.producers import NO_ID, ProducerCache
from mop.message import Message, MessageId

TOPIC = "persistent://public/default/t"
SendCallback = Callable[[Any, Any], None] | None


class _Id:
    def ledger_id(self) -> int:
        return 7

    def entry_id(self) -> int:
        return 3

    def batch_index(self) -> int:
        return -1


class _Producer:
    """Keeps each send's callback (None for a send without one) for the test to complete."""

    def __init__(self) -> None:
        self.callbacks: list[SendCallback] = []

    def send_async(self, _message: Any, callback: SendCallback) -> None:
        self.callbacks.append(callback)

    def close_async(self, callback: Callable[..., None]) -> None:
        callback(_pulsar.Result.Ok)


class _Client:
    def __init__(self) -> None:
        self.producer = _Producer()

    def create_producer_async(self, _topic: str, _conf: Any, done: Callable[..., None]) -> None:
        done(_pulsar.Result.Ok, self.producer)


def _cache(max_pending: int = 1000) -> tuple[ProducerCache, _Producer]:
    client = _Client()
    bridge = Bridge(trio.lowlevel.current_trio_token())
    return ProducerCache(bridge, client, ProducerOptions(max_pending=max_pending)), client.producer


def _pending(cache: ProducerCache) -> int:
    return cache._entries[TOPIC].pending


async def test_most_qos0_sends_go_without_a_callback() -> None:
    cache, producer = _cache()
    for _ in range(200):
        await cache.submit(TOPIC, Message(payload=b"x", qos=0))
    with_callback = [i for i, cb in enumerate(producer.callbacks) if cb is not None]
    assert with_callback == [64, 129, 194]
    assert _pending(cache) == 200


async def test_a_receipt_frees_the_slots_of_the_silent_sends_before_it() -> None:
    cache, producer = _cache()
    for _ in range(130):
        await cache.submit(TOPIC, Message(payload=b"x", qos=0))
    for callback in producer.callbacks:
        if callback is not None:
            callback(_pulsar.Result.Ok, _Id())
    await trio.testing.wait_all_tasks_blocked()
    # Two receipts, each for itself and the 64 silent sends before it.
    assert _pending(cache) == 0


async def test_a_qos1_send_has_its_callback_and_covers_earlier_silent_sends() -> None:
    cache, producer = _cache()
    for _ in range(3):
        await cache.submit(TOPIC, Message(payload=b"x", qos=0))
    receipt = await cache.submit(TOPIC, Message(payload=b"y", qos=1))
    assert receipt is not None
    assert producer.callbacks[:3] == [None, None, None]
    callback = producer.callbacks[3]
    assert callback is not None
    callback(_pulsar.Result.Ok, _Id())
    result = await receipt.wait()
    assert result.message_id == MessageId(7, 3, -1)
    assert _pending(cache) == 0


async def test_a_qos0_send_returns_at_once_with_no_id() -> None:
    cache, producer = _cache()
    result = await cache.send(TOPIC, Message(payload=b"x", qos=0))
    assert result.message_id == NO_ID
    assert producer.callbacks == [None]


async def test_few_slots_leave_most_of_them_to_sends_with_a_receipt() -> None:
    cache, producer = _cache(max_pending=3)  # at most one silent send in a row
    for _ in range(3):
        await cache.submit(TOPIC, Message(payload=b"x", qos=0))
    assert [cb is None for cb in producer.callbacks] == [True, False, True]
    # Every slot is taken: a next send would wait until the receipt frees two.
    assert cache._entries[TOPIC].slots.value == 0
    callback = producer.callbacks[1]
    assert callback is not None
    callback(_pulsar.Result.Ok, _Id())
    await trio.testing.wait_all_tasks_blocked()
    assert cache._entries[TOPIC].slots.value == 2
    assert _pending(cache) == 1
