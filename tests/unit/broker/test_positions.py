"""Broker positions (start ids, resets by id and by publish time, the last id and the mark-delete
position, topics of a namespace) and producers (access modes, fencing, sequence ids), with
plain calls."""

from __future__ import annotations

import pytest

from mop.broker import Sequenced, id_before
from mop.broker.producers import ProducerRegistry
from mop.broker.storage import MemoryStorage
from mop.message import Message, MessageId
from mop.messaging import ProducerAccess, ProducerBusy, ProducerFenced

from .support import msg, new_broker, payloads, subscribe, take_all, topic

T = topic("t")


async def publish_times(broker: object, *times: int) -> list[MessageId]:
    from mop.broker import Broker

    assert isinstance(broker, Broker)
    return [
        (await broker.publish(T, Message(f"m{t}".encode(), publish_time=t))).message_id
        for t in times
    ]


def test_id_before() -> None:
    assert id_before(MessageId(3, 5)) == MessageId(3, 4)
    assert id_before(MessageId(3, 5, 2)) == MessageId(3, 4)
    before_ledger = id_before(MessageId(3, 0))
    assert before_ledger is not None and before_ledger < MessageId(3, 0)
    assert before_ledger > MessageId(2, 1_000_000)
    assert id_before(MessageId(0, 0)) is None


async def test_a_new_subscription_can_start_at_an_id() -> None:
    broker = new_broker()
    await subscribe(broker, "keeper", [T])
    ids = await publish_times(broker, 1, 2, 3)
    att = await subscribe(broker, "s", [T], start_at=ids[1], durable=False)
    assert payloads(take_all(broker, att)) == ["m2", "m3"]


async def test_reset_to_an_id_forgets_later_acks_and_withdraws_deliveries() -> None:
    broker = new_broker()
    att = await subscribe(broker, "s", [T])
    ids = await publish_times(broker, 1, 2, 3)
    broker.ack(att, take_all(broker, att))
    await broker.reset(att.sub, T, message_id=ids[1])
    again = take_all(broker, att)
    assert payloads(again) == ["m2", "m3"]
    assert [d.redelivery_count for d in again] == [0, 0]
    await broker.reset(att.sub, T)  # neither id nor time: the first stored message
    assert payloads(take_all(broker, att)) == ["m1", "m2", "m3"]


async def test_reset_by_publish_time() -> None:
    broker = new_broker()
    att = await subscribe(broker, "s", [T])
    await publish_times(broker, 10, 20, 30)
    take_all(broker, att)
    await broker.reset(att.sub, T, publish_time=15)
    assert payloads(take_all(broker, att)) == ["m20", "m30"]
    await broker.reset(att.sub, T, publish_time=99)
    assert take_all(broker, att) == []


async def test_a_reset_survives_a_restart_for_durable_subscriptions() -> None:
    storage = MemoryStorage()
    broker = new_broker(storage)
    att = await subscribe(broker, "s", [T])
    ids = await publish_times(broker, 1, 2, 3)
    broker.ack(att, take_all(broker, att))
    await broker.reset(att.sub, T, message_id=ids[2])
    broker.close(att)
    restarted = new_broker(storage)
    await restarted.recover()
    again = await subscribe(restarted, "s", [T])
    assert payloads(take_all(restarted, again)) == ["m3"]


async def test_position_reports_the_last_batch_message_and_the_mark() -> None:
    storage = MemoryStorage()
    broker = new_broker(storage)
    att = await subscribe(broker, "s", [T])
    assert await broker.position(att.sub, T) == (None, None)
    first = (await broker.publish(T, msg("x"))).message_id
    entry = (await broker.publish(T, Message(b"", batch=(Message(b"a"), Message(b"b"))))).message_id
    broker.ack(att, take_all(broker, att)[:1])
    last, mark = await broker.position(att.sub, T)
    assert (last, mark) == (MessageId(entry.ledger, entry.entry, 1), first)
    restarted = new_broker(storage)  # the batch size is read back from storage
    await restarted.recover()
    again = await subscribe(restarted, "s", [T])
    assert (await restarted.position(again.sub, T))[0] == MessageId(entry.ledger, entry.entry, 1)


async def test_topics_of_a_namespace() -> None:
    broker = new_broker()
    await broker.publish(T, msg("x"))
    await broker.publish("persistent://public/other/y", msg("y"))
    await subscribe(broker, "np", ["non-persistent://public/default/z"], durable=False)
    assert sorted(broker.topics("public/default")) == [
        "non-persistent://public/default/z", T
    ]
    assert broker.topics("public/other") == ["persistent://public/other/y"]


# -- producers ------------------------------------------------------------------------------


def test_shared_producers_coexist_but_names_are_unique() -> None:
    registry = ProducerRegistry()
    registry.add(T, "a", ProducerAccess.SHARED)
    registry.add(T, "b", ProducerAccess.SHARED)
    with pytest.raises(ProducerBusy):
        registry.add(T, "a", ProducerAccess.SHARED)
    # The same producer reconnecting (a higher epoch) replaces its stale registration.
    again = registry.add(T, "a", ProducerAccess.SHARED, epoch=1)
    assert [h.name for h in registry.producers(T)] == ["b", "a"] and again.ready


def test_exclusive_producers() -> None:
    registry = ProducerRegistry()
    shared = registry.add(T, "s", ProducerAccess.SHARED)
    with pytest.raises(ProducerBusy):
        registry.add(T, "x", ProducerAccess.EXCLUSIVE)
    registry.remove(shared)
    exclusive = registry.add(T, "x", ProducerAccess.EXCLUSIVE)
    assert exclusive.topic_epoch == 1
    with pytest.raises(ProducerBusy):
        registry.add(T, "s", ProducerAccess.SHARED)


def test_wait_for_exclusive_queues_until_the_topic_is_free() -> None:
    registry = ProducerRegistry()
    changes: list[str] = []
    holder = registry.add(T, "holder", ProducerAccess.EXCLUSIVE)
    waiter = registry.add(
        T, "waiter", ProducerAccess.WAIT_FOR_EXCLUSIVE, on_change=lambda: changes.append("w")
    )
    assert not waiter.ready
    registry.remove(holder)
    assert waiter.ready and changes == ["w"]
    assert waiter.topic_epoch is not None and holder.topic_epoch is not None
    assert waiter.topic_epoch > holder.topic_epoch


def test_fencing_takes_the_topic_and_keeps_the_fenced_out() -> None:
    registry = ProducerRegistry()
    fenced: list[str] = []
    old = registry.add(
        T, "old", ProducerAccess.EXCLUSIVE, on_change=lambda: fenced.append("old")
    )
    new = registry.add(T, "new", ProducerAccess.EXCLUSIVE_WITH_FENCING)
    assert old.fenced and fenced == ["old"] and not new.fenced
    # The old producer reconnects with the epoch it held: it stays fenced.
    with pytest.raises(ProducerFenced):
        registry.add(T, "old", ProducerAccess.EXCLUSIVE, epoch=1, topic_epoch=old.topic_epoch)


async def test_duplicates_are_dropped_and_named_sequences_survive_a_restart() -> None:
    storage = MemoryStorage()
    broker = new_broker(storage)
    att = await subscribe(broker, "s", [T])
    named = Sequenced("app", 0, 0, durable=True)
    await broker.publish(T, msg("0"), sequence=named)
    await broker.publish(T, msg("1-3"), sequence=Sequenced("app", 1, 3, durable=True))
    dup = await broker.publish(T, msg("again"), sequence=Sequenced("app", 2, 2, durable=True))
    assert dup.duplicate
    assert broker.sequences.last(T, "app") == 3
    await broker.publish(T, msg("x"), sequence=Sequenced("assigned", 0, 0))
    assert payloads(take_all(broker, att)) == ["0", "1-3", "x"]
    restarted = new_broker(storage)
    await restarted.recover()
    assert restarted.sequences.last(T, "app") == 3
    assert restarted.sequences.last(T, "assigned") == -1  # broker-assigned names are not kept
