"""Cursors (`mop.broker.cursor`): cumulative acknowledgement into a batch entry (the Pulsar
client's batch-index ack) while the entry is not out with a consumer: the messages after the
acknowledged index stay owed, and the acknowledged ones are left out when the entry is
delivered again."""

from __future__ import annotations

from typing import Any

from mop.message import Message, MessageId

from .support import new_broker, payloads, subscribe, take_all, topic

T = topic("batch-cumulative")
CREDIT: dict[str, Any] = {"permits": True, "whole_batches": True}


def batch(*members: str) -> Message:
    return Message(b"", batch=tuple(Message(m.encode()) for m in members))


def at(entry: MessageId, index: int) -> MessageId:
    return MessageId(entry.ledger, entry.entry, index)


async def test_into_a_batch_that_went_back_to_the_backlog() -> None:
    broker = new_broker()
    # A Pulsar consumer: it is sent what it granted permits for, and they are used up.
    att = await subscribe(broker, "s", [T], **CREDIT)
    entry = (await broker.publish(T, batch("a", "b", "c", "d", "e"))).message_id
    broker.grant(att, 5)
    broker.nack(att, take_all(broker, att)[:1])  # the client asked for a redelivery
    assert att.sub.cursors[T].backlog  # the entry waits for permits
    broker.ack_through(att, T, at(entry, 1))
    broker.close(att)
    again = await subscribe(broker, "s", [T])
    assert payloads(take_all(broker, again)) == ["c", "d", "e"]


async def test_into_a_batch_queued_for_a_consumer_that_has_not_taken_it() -> None:
    broker = new_broker()
    att = await subscribe(broker, "s", [T])
    entry = (await broker.publish(T, batch("a", "b", "c"))).message_id
    assert att.queue and not att.unacked
    broker.ack_through(att, T, at(entry, 0))
    assert payloads(take_all(broker, att)) == ["b", "c"]


async def test_a_whole_batch_delivery_carries_the_acknowledged_indexes() -> None:
    broker = new_broker()
    att = await subscribe(broker, "s", [T], whole_batches=True)
    entry = (await broker.publish(T, batch("a", "b", "c", "d"))).message_id
    broker.nack(att, take_all(broker, att))
    broker.ack_through(att, T, at(entry, 1))
    [delivery] = take_all(broker, att)
    assert delivery.acked == frozenset({0, 1})


async def test_through_the_last_index_acknowledges_the_entry() -> None:
    broker = new_broker()
    att = await subscribe(broker, "s", [T])
    entry = (await broker.publish(T, batch("a", "b"))).message_id
    broker.nack(att, take_all(broker, att)[:1])
    broker.ack_through(att, T, at(entry, 1))
    cursor = att.sub.cursors[T]
    assert cursor.mark_delete == entry
    assert not cursor.backlog and not cursor.partial
    assert take_all(broker, att) == []


async def test_a_prefix_that_completes_earlier_acknowledgements_acknowledges_the_entry() -> None:
    broker = new_broker()
    att = await subscribe(broker, "s", [T])
    entry = (await broker.publish(T, batch("a", "b", "c"))).message_id
    deliveries = take_all(broker, att)
    broker.ack(att, deliveries[2:])  # "c" on its own
    broker.ack_through(att, T, at(entry, 1))
    assert att.sub.cursors[T].mark_delete == entry
    assert not att.unacked
