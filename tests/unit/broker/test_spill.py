"""A cursor that has caught up but whose consumers stop taking messages holds a bounded backlog
in memory: past `SPILL_AT` entries (or `SPILL_AT_BYTES`) it drops what its consumers cannot take
soon and reads it back from storage when they take messages again, every message once, in
order, with acknowledgements and redeliveries as before. QoS 0 messages and non-persistent
topics are not spilled, nor subscriptions bounded by their own `max_backlog` rule."""

from __future__ import annotations

from mop.broker import Broker
from mop.broker.cursor import Cursor
from mop.broker.dispatch import Attachment
from mop.broker.subscription import READ_AHEAD, SPILL_AT, SPILL_AT_BYTES
from mop.message import Delivery, Message

from .support import msg, new_broker, payloads, subscribe, topic

PUBLISHED = 5 * SPILL_AT


def _cursor(broker: Broker, name: str, selector: str = "a") -> Cursor:
    sub = broker.subscription(name)
    assert sub is not None
    return sub.cursors[topic(selector)]


async def _publish(broker: Broker, first: int, count: int, name: str, *, qos: int = 1) -> None:
    for n in range(first, first + count):
        await broker.publish(topic("a"), msg(str(n), qos=qos))
        assert len(_cursor(broker, name).backlog) <= SPILL_AT


async def _drain(
    broker: Broker, att: Attachment, name: str, held: int = READ_AHEAD * 3 // 2
) -> list[Delivery]:
    got: list[Delivery] = []
    while True:
        if broker.wants_reading:
            await broker.read_ahead()
        batch = broker.take(att, 8)
        if not batch:
            return got
        assert len(_cursor(broker, name).backlog) <= held
        broker.ack(att, batch)
        got += batch


async def test_a_stalled_consumer_holds_a_bounded_backlog_and_gets_everything_once() -> None:
    broker = new_broker()
    att = await subscribe(broker, "s", ["a"], capacity=8)
    await _publish(broker, 0, PUBLISHED, "s")
    assert _cursor(broker, "s").catching_up
    got = await _drain(broker, att, "s")
    assert payloads(got) == [str(n) for n in range(PUBLISHED)]
    assert not _cursor(broker, "s").catching_up  # caught up again: routed to once more
    await broker.publish(topic("a"), msg("last"))
    assert payloads(broker.take(att, 8)) == ["last"]


async def test_what_is_published_while_it_reads_back_follows_once_in_order() -> None:
    broker = new_broker()
    att = await subscribe(broker, "s", ["a"], capacity=8)
    await _publish(broker, 0, PUBLISHED, "s")
    got: list[Delivery] = []
    more = PUBLISHED
    while True:
        if broker.wants_reading:
            await broker.read_ahead()
        batch = broker.take(att, 8)
        if not batch:
            break
        broker.ack(att, batch)
        got += batch
        if more < 2 * PUBLISHED:
            await _publish(broker, more, 50, "s")
            more += 50
    assert payloads(got) == [str(n) for n in range(more)]


async def test_redeliveries_and_acknowledgements_out_of_order_survive_a_spill() -> None:
    broker = new_broker()
    att = await subscribe(broker, "s", ["a"], capacity=8)
    await _publish(broker, 0, 8, "s")
    held = broker.take(att, 8)
    broker.ack(att, held[1::2])  # out of order: 0, 2, 4, 6 still owed
    await _publish(broker, 8, PUBLISHED, "s")
    assert _cursor(broker, "s").catching_up
    broker.nack(att, held[0::2])
    got = await _drain(broker, att, "s")
    # What the consumer's receive queue held comes first, then the messages handed back.
    redelivered = [d for d in got if d.redelivery_count]
    assert payloads(redelivered) == ["0", "2", "4", "6"]
    assert all(d.redelivery_count == 1 for d in redelivered)
    rest = [d for d in got if not d.redelivery_count]
    assert payloads(rest) == [str(n) for n in range(8, 8 + PUBLISHED)]
    cursor = _cursor(broker, "s")
    assert cursor.owed() == 0 and not cursor.ids


async def test_the_payload_bytes_held_are_bounded_too() -> None:
    broker = new_broker()
    att = await subscribe(broker, "s", ["a"], capacity=8)
    payload = b"x" * (64 * 1024)
    count = 2 * SPILL_AT_BYTES // len(payload)
    for n in range(count):
        await broker.publish(topic("a"), Message(payload, key=str(n), qos=1))
        assert _cursor(broker, "s").backlog_bytes <= SPILL_AT_BYTES
    got = await _drain(broker, att, "s")
    assert [d.message.key for d in got] == [str(n) for n in range(count)]


async def test_qos0_messages_stay_in_memory_but_the_backlog_stops_growing() -> None:
    broker = new_broker()
    att = await subscribe(broker, "s", ["a"], capacity=8)
    for n in range(2 * PUBLISHED):
        await broker.publish(topic("a"), msg(str(n), qos=n % 2))
        # Only the QoS 1 entries routed last are dropped: a QoS 0 one may not be written yet.
        assert len(_cursor(broker, "s").backlog) <= SPILL_AT + 1
    assert any(entry.message.qos == 0 for entry in _cursor(broker, "s").backlog)
    got = await _drain(broker, att, "s", held=SPILL_AT + 1)
    assert payloads(got) == [str(n) for n in range(2 * PUBLISHED)]


async def test_a_subscription_with_its_own_max_backlog_rule_is_not_spilled() -> None:
    broker = new_broker()
    await subscribe(broker, "s", ["a"], capacity=8, max_backlog=3 * SPILL_AT)
    for n in range(3 * SPILL_AT):
        await broker.publish(topic("a"), msg(str(n)))
    assert len(_cursor(broker, "s").backlog) == 3 * SPILL_AT - 8
    assert not _cursor(broker, "s").catching_up


async def test_a_non_persistent_topic_is_not_spilled() -> None:
    broker = new_broker()
    await subscribe(broker, "s", ["a"], capacity=8)
    name = "non-persistent://public/default/a"
    await subscribe(broker, "n", [name], capacity=8)
    for n in range(2 * SPILL_AT):
        await broker.publish(name, msg(str(n)))
    sub = broker.subscription("n")
    assert sub is not None
    assert len(sub.cursors[name].backlog) == 2 * SPILL_AT - 8


async def test_a_subscription_without_consumers_spills_and_a_new_one_gets_everything() -> None:
    broker = new_broker()
    broker.close(await subscribe(broker, "s", ["a"], capacity=8))
    await _publish(broker, 0, PUBLISHED, "s")
    assert _cursor(broker, "s").catching_up
    att = await subscribe(broker, "s", ["a"], capacity=8)
    got = await _drain(broker, att, "s")
    assert payloads(got) == [str(n) for n in range(PUBLISHED)]


async def test_messages_larger_than_half_a_chunk_are_all_read_back() -> None:
    broker = new_broker()
    att = await subscribe(broker, "s", ["a"], capacity=1)
    payload = b"x" * (SPILL_AT_BYTES // 2 + 1)  # none is kept in memory past the first
    for n in range(6):
        await broker.publish(topic("a"), Message(payload, key=str(n), qos=1))
        assert _cursor(broker, "s").backlog_bytes <= SPILL_AT_BYTES
    got = await _drain(broker, att, "s")
    assert [d.message.key for d in got] == [str(n) for n in range(6)]
