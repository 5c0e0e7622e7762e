"""Producers of a topic (`mop.broker.producers`): access modes, fencing, and the sequence ids
that drop duplicates, with plain calls."""

from __future__ import annotations

import pytest

from mop.broker import Sequenced
from mop.broker.producers import ProducerRegistry
from mop.broker.storage import MemoryStorage
from mop.messaging import ProducerAccess, ProducerBusy, ProducerFenced

from .support import msg, new_broker, payloads, subscribe, take_all, topic

T = topic("t")


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
    # Pulsar's answers: an Exclusive producer finding the topic taken is fenced out, a shared
    # producer finding an exclusive one is told the topic is busy.
    registry = ProducerRegistry()
    shared = registry.add(T, "s", ProducerAccess.SHARED)
    with pytest.raises(ProducerFenced):
        registry.add(T, "x", ProducerAccess.EXCLUSIVE)
    registry.remove(shared)
    exclusive = registry.add(T, "x", ProducerAccess.EXCLUSIVE)
    assert exclusive.topic_epoch == 1
    with pytest.raises(ProducerBusy):
        registry.add(T, "s", ProducerAccess.SHARED)
    with pytest.raises(ProducerFenced):
        registry.add(T, "y", ProducerAccess.EXCLUSIVE)


def test_queued_exclusive_producers_keep_others_out() -> None:
    registry = ProducerRegistry()
    holder = registry.add(T, "holder", ProducerAccess.EXCLUSIVE)
    waiter = registry.add(T, "waiter", ProducerAccess.WAIT_FOR_EXCLUSIVE)
    registry.remove(holder)
    assert waiter.ready
    registry.add(T, "queued", ProducerAccess.WAIT_FOR_EXCLUSIVE)
    with pytest.raises(ProducerFenced):
        registry.add(T, "x", ProducerAccess.EXCLUSIVE)
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
    old = registry.add(T, "old", ProducerAccess.EXCLUSIVE, on_change=lambda: fenced.append("old"))
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
