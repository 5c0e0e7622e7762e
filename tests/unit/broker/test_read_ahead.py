"""A cursor reads its stored backlog a chunk at a time: it holds at most a chunk and a half in
memory whatever the backlog, reads on as its consumers take messages, and gets what is
published meanwhile after it, once, in order; acknowledgements of the part not read yet
survive; a seek reads the same way."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio
import trio.testing

import mop.broker.broker as broker_module
from mop.broker import Broker, subscription
from mop.broker.dispatch import Attachment
from mop.broker.storage import MemoryStorage, StorageError
from mop.broker.subscription import READ_AHEAD
from mop.message import Delivery, Message, MessageId
from mop.messaging import StartPosition

from .support import Clock, msg, new_broker, payloads, subscribe, topic

STORED = 5 * READ_AHEAD


async def _stored(broker: Broker, count: int = STORED) -> None:
    for n in range(count):
        await broker.publish(topic("a"), msg(str(n)))


def _held(broker: Broker, name: str) -> int:
    sub = broker.subscription(name)
    assert sub is not None
    return len(sub.cursors[topic("a")].backlog)


async def _take(broker: Broker, att: Attachment, limit: int = 300) -> list[Delivery]:
    """What a consumer does: read ahead when asked to, then take."""
    if broker.wants_reading:
        await broker.read_ahead()
    return broker.take(att, limit)


async def _drain(broker: Broker, att: Attachment, name: str) -> list[Delivery]:
    got: list[Delivery] = []
    while batch := await _take(broker, att):
        assert _held(broker, name) < READ_AHEAD * 3 // 2
        broker.ack(att, batch)
        got += batch
    return got


async def test_a_reader_of_a_long_topic_holds_a_chunk_and_a_half_at_most() -> None:
    broker = new_broker()
    await _stored(broker)
    att = await subscribe(broker, "r", ["a"], start=StartPosition.EARLIEST, durable=False)
    assert _held(broker, "r") < READ_AHEAD * 3 // 2 and len(att.queue) <= 1000
    got = await _drain(broker, att, "r")
    assert payloads(got) == [str(n) for n in range(STORED)]


async def test_messages_published_while_it_catches_up_follow_once_in_order() -> None:
    broker = new_broker()
    await _stored(broker)
    att = await subscribe(broker, "r", ["a"], start=StartPosition.EARLIEST, durable=False)
    got: list[Delivery] = []
    more = STORED
    while batch := await _take(broker, att):
        got += batch
        broker.ack(att, batch)
        if more < STORED + 2000:  # published while the reader reads
            for n in range(more, more + 100):
                await broker.publish(topic("a"), msg(str(n)))
            more += 100
    assert payloads(got) == [str(n) for n in range(more)]


async def test_a_durable_subscription_keeps_what_it_acknowledged_ahead_across_a_restart() -> None:
    storage = MemoryStorage()
    first = new_broker(storage)
    att = await subscribe(first, "s", ["a"], capacity=STORED)
    await _stored(first)
    # Acknowledged out of order, far ahead of what a restarted cursor reads first.
    ahead = [d for d in first.take(att, 10_000) if int(d.message.payload) % 2]
    first.ack(att, ahead)
    second = Broker(storage, clock=Clock())
    await second.recover()
    att = await subscribe(second, "s", ["a"])
    assert _held(second, "s") < READ_AHEAD * 3 // 2
    state = storage.load_cursors()[(topic("a"), "s")]
    assert len(state.acked) >= len(ahead)  # saved while the cursor catches up
    got = await _drain(second, att, "s")
    assert payloads(got) == [str(n) for n in range(0, STORED, 2)]
    sub = second.subscription("s")
    assert sub is not None
    assert sub.cursors[topic("a")].mark_delete == MessageId(0, STORED - 1)


async def test_a_seek_reads_from_the_new_position_by_chunks_too() -> None:
    broker = new_broker()
    await _stored(broker)
    att = await subscribe(broker, "s", ["a"], start=StartPosition.EARLIEST)
    await broker.reset(att.sub, topic("a"), message_id=MessageId(0, STORED - 2 * READ_AHEAD))
    got = await _drain(broker, att, "s")
    assert payloads(got) == [str(n) for n in range(STORED - 2 * READ_AHEAD, STORED)]


async def test_a_cumulative_acknowledgement_past_what_it_read_skips_the_rest() -> None:
    storage = MemoryStorage()
    first = new_broker(storage)
    await subscribe(first, "s", ["a"], start=StartPosition.EARLIEST)
    await _stored(first)
    second = Broker(storage, clock=Clock())
    await second.recover()
    # Room for fewer than half a chunk: the acknowledgement, not the consumer, empties it.
    woken: list[bool] = []
    att = await subscribe(second, "s", ["a"], capacity=100, on_ready=lambda: woken.append(True))
    second.take(att, 100)
    woken.clear()
    through = MessageId(0, STORED - 10)
    second.ack_through(att, topic("a"), through)
    assert second.wants_reading and woken  # a consumer waiting to receive reads on
    sub = second.subscription("s")
    assert sub is not None
    assert sub.cursors[topic("a")].mark_delete == through
    got = await _drain(second, att, "s")
    assert payloads(got) == [str(n) for n in range(STORED - 9, STORED)]


async def test_a_cumulative_acknowledgement_while_a_chunk_is_read_is_not_undone() -> None:
    storage = MemoryStorage()
    first = new_broker(storage)
    await subscribe(first, "s", ["a"], start=StartPosition.EARLIEST)
    await _stored(first)
    second = Broker(storage, clock=Clock())
    await second.recover()
    att = await subscribe(second, "s", ["a"], capacity=STORED)
    taken = second.take(att, STORED)
    assert len(taken) == READ_AHEAD
    second.ack(att, taken)
    assert second.wants_reading
    read = storage.read
    release = trio.Event()

    async def slow_read(
        name: str, after: MessageId | None, limit: int, max_bytes: int | None = None
    ) -> list[tuple[MessageId, Message]]:
        page = await read(name, after, limit, max_bytes)
        await release.wait()
        return page

    storage.read = slow_read  # type: ignore[method-assign,assignment]
    through = MessageId(0, STORED - 10)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(second.read_ahead)
        await trio.testing.wait_all_tasks_blocked()
        second.ack_through(att, topic("a"), through)
        release.set()
    storage.read = read  # type: ignore[method-assign]
    got = await _drain(second, att, "s")
    assert payloads(got) == [str(n) for n in range(STORED - 9, STORED)]
    saved = storage.load_cursors()[(topic("a"), "s")].mark_delete
    assert saved is not None and saved >= through


class _SlowWrites(MemoryStorage):
    """A store whose writes finish when the test says so."""

    def __init__(self) -> None:
        super().__init__()
        self.deferring = False
        self.pending: list[Callable[[bool], None]] = []

    def when_written(self, callback: Callable[[bool], None]) -> None:
        if self.deferring:
            self.pending.append(callback)
        else:
            callback(True)

    def finish(self) -> None:
        pending, self.pending = self.pending, []
        for callback in pending:
            callback(True)


async def test_catching_up_delivers_no_message_before_its_write_is_done() -> None:
    storage = _SlowWrites()
    first = new_broker(storage)
    await subscribe(first, "s", ["a"], start=StartPosition.EARLIEST)
    await _stored(first)
    second = Broker(storage, clock=Clock())
    await second.recover()
    att = await subscribe(second, "s", ["a"], capacity=2 * STORED)
    storage.deferring = True
    await second.publish(topic("a"), msg("unwritten"))
    got = await _drain(second, att, "s")
    assert payloads(got) == [str(n) for n in range(STORED)]
    storage.finish()
    assert payloads(await _take(second, att)) == ["unwritten"]


async def test_a_subscription_made_while_a_write_is_pending_reads_it_once_written() -> None:
    storage = _SlowWrites()
    broker = new_broker(storage)
    await _stored(broker, 10)
    storage.deferring = True
    await broker.publish(topic("a"), msg("unwritten"))
    att = await subscribe(broker, "r", ["a"], start=StartPosition.EARLIEST, durable=False)
    got = await _drain(broker, att, "r")
    assert payloads(got) == [str(n) for n in range(10)]
    storage.finish()
    await broker.publish(topic("a"), msg("next"))
    storage.finish()
    got = await _drain(broker, att, "r")
    assert payloads(got) == ["unwritten", "next"]


async def test_a_consumer_reads_ahead_for_its_own_subscription_only() -> None:
    storage = MemoryStorage()
    first = new_broker(storage)
    await subscribe(first, "s", ["a"], start=StartPosition.EARLIEST)
    await subscribe(first, "t", ["a"], start=StartPosition.EARLIEST)
    await _stored(first)
    second = Broker(storage, clock=Clock())
    await second.recover()
    s = await subscribe(second, "s", ["a"], capacity=STORED)
    t = await subscribe(second, "t", ["a"], capacity=100)
    second.ack(s, second.take(s, STORED))
    assert second.wants_reading_for(s) and not second.wants_reading_for(t)

    async def failing_read(
        name: str, after: MessageId | None, limit: int, max_bytes: int | None = None
    ) -> list[tuple[MessageId, Message]]:
        raise StorageError("disk gone")

    read = storage.read
    storage.read = failing_read  # type: ignore[method-assign,assignment]
    await second.read_ahead(t)  # not s's read, nor its error
    storage.read = read  # type: ignore[method-assign]
    assert second.wants_reading_for(s)
    await second.read_ahead(s)
    assert payloads(second.take(s, STORED))[0] == str(READ_AHEAD)


async def test_a_failed_first_read_leaves_the_backlog_owed_and_reads_it_again() -> None:
    storage = MemoryStorage()
    first = new_broker(storage)
    await subscribe(first, "s", ["a"], start=StartPosition.EARLIEST)
    await _stored(first)
    second = Broker(storage, clock=Clock())

    async def failing_read(
        name: str, after: MessageId | None, limit: int, max_bytes: int | None = None
    ) -> list[tuple[MessageId, Message]]:
        raise StorageError("disk gone")

    read = storage.read
    storage.read = failing_read  # type: ignore[method-assign,assignment]
    await second.recover()  # reads the subscription's first chunk
    storage.read = read  # type: ignore[method-assign]
    att = await subscribe(second, "s", ["a"])
    assert storage.load_cursors()[(topic("a"), "s")].mark_delete is None
    assert second.wants_reading_for(att)
    got = await _drain(second, att, "s")
    assert payloads(got) == [str(n) for n in range(STORED)]


async def test_a_reader_of_large_messages_holds_a_chunk_and_a_half_of_bytes_at_most(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    budget = 64 * 1024
    monkeypatch.setattr(subscription, "READ_AHEAD_BYTES", budget)
    monkeypatch.setattr(broker_module, "READ_AHEAD_BYTES", budget)
    broker = new_broker()
    size = 4096
    for n in range(200):  # 800 KiB: a chunk's count, many chunks' bytes
        await broker.publish(topic("a"), msg(f"{n:04}" + "x" * (size - 4)))
    att = await subscribe(
        broker, "r", ["a"], start=StartPosition.EARLIEST, durable=False, capacity=5
    )
    got: list[Delivery] = []
    while batch := await _take(broker, att, 5):
        sub = broker.subscription("r")
        assert sub is not None
        held = sum(len(e.message.payload) for e in sub.cursors[topic("a")].backlog)
        assert held <= budget * 3 // 2
        broker.ack(att, batch)
        got += batch
    assert [p[:4] for p in payloads(got)] == [f"{n:04}" for n in range(200)]
