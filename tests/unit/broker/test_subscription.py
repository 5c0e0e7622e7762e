"""Subscriptions (`mop.broker.subscription`) through the broker's plain calls, as Pulsar
consumers rely on them: batch entries (one id, several messages, acknowledged one by one),
credit-based flow control, cumulative acknowledgement, messages held until their deliver_at,
failover activity and non-persistent topics; and what `take` does per message: QoS 0 taken by
an at-most-once consumer counts as acknowledged, and a first delivery is one shared object."""

from __future__ import annotations

from typing import Any

import pytest

from mop.broker.storage import MemoryStorage
from mop.message import Message, MessageId
from mop.messaging import SubscriptionKind

from .support import Clock, msg, new_broker, payloads, subscribe, take_all, topic

T = topic("t")
WHOLE: dict[str, Any] = {"whole_batches": True}
CREDIT: dict[str, Any] = {"permits": True, "whole_batches": True}


def batch(*payloads: str, **fields: object) -> Message:
    members = tuple(Message(p.encode()) for p in payloads)
    return Message(b"", batch=members, **fields)  # type: ignore[arg-type]


async def test_a_batch_is_one_entry_and_each_message_is_its_own_delivery() -> None:
    broker = new_broker()
    att = await subscribe(broker, "s", [T])
    published = await broker.publish(T, batch("a", "b", "c"))
    deliveries = take_all(broker, att)
    assert payloads(deliveries) == ["a", "b", "c"]
    mid = published.message_id
    assert [d.message_id for d in deliveries] == [
        MessageId(mid.ledger, mid.entry, i) for i in range(3)
    ]


async def test_batch_messages_acked_apart_complete_the_entry() -> None:
    storage = MemoryStorage()
    broker = new_broker(storage)
    att = await subscribe(broker, "s", [T])
    await broker.publish(T, batch("a", "b", "c"))
    deliveries = take_all(broker, att)
    broker.ack(att, [deliveries[0], deliveries[2]])
    cursor = att.sub.cursors[T]
    assert cursor.mark_delete is None
    # The unacknowledged one comes back alone to a new consumer.
    broker.close(att)
    again = await subscribe(broker, "s", [T])
    [back] = take_all(broker, again)
    assert (back.message.payload, back.redelivery_count) == (b"b", 1)
    broker.ack(again, [back])
    assert cursor.mark_delete == deliveries[0].message_id.whole


async def test_whole_batch_consumers_get_the_entry_with_its_acked_messages() -> None:
    broker = new_broker()
    att = await subscribe(broker, "s", [T], **WHOLE)
    published = await broker.publish(T, batch("a", "b", "c"))
    [entry] = take_all(broker, att)
    assert entry.message_id == published.message_id and entry.acked == frozenset()
    member = MessageId(entry.message_id.ledger, entry.message_id.entry, 1)
    broker.ack(att, [type(entry)(T, member, entry.message)])
    broker.nack(att, [entry])
    [again] = take_all(broker, att)
    assert again.acked == frozenset({1}) and again.redelivery_count == 1


async def test_credit_bounds_dispatch_and_a_batch_uses_one_per_message() -> None:
    broker = new_broker()
    att = await subscribe(broker, "s", [T], **CREDIT)
    await broker.publish(T, msg("1"))
    await broker.publish(T, batch("a", "b", "c"))
    await broker.publish(T, msg("2"))
    assert take_all(broker, att) == []  # nothing granted yet
    broker.grant(att, 2)
    first = take_all(broker, att)
    # The batch goes out on the last permit (and overdraws it), the single message waits.
    assert [d.message.count for d in first] == [1, 3]
    broker.grant(att, 1)
    assert take_all(broker, att) == []
    broker.grant(att, 2)
    assert payloads(take_all(broker, att)) == ["2"]


async def test_expired_messages_give_their_credit_back() -> None:
    clock = Clock()
    broker = new_broker(clock=clock)
    att = await subscribe(broker, "s", [T], **CREDIT)
    await broker.publish(T, msg("old", expires_at=int(clock.now) + 10))
    await broker.publish(T, msg("fresh"))
    broker.grant(att, 1)
    clock.now += 100
    assert take_all(broker, att) == []
    assert payloads(take_all(broker, att)) == ["fresh"]


async def test_cumulative_ack_covers_everything_up_to_the_id() -> None:
    broker = new_broker()
    att = await subscribe(broker, "s", [T])
    ids = [(await broker.publish(T, msg(str(i)))).message_id for i in range(4)]
    take_all(broker, att)
    broker.ack_through(att, T, ids[2])
    cursor = att.sub.cursors[T]
    assert cursor.mark_delete == ids[2]
    broker.close(att)
    again = await subscribe(broker, "s", [T])
    assert payloads(take_all(broker, again)) == ["3"]


async def test_cumulative_ack_into_a_batch() -> None:
    broker = new_broker()
    att = await subscribe(broker, "s", [T])
    first = (await broker.publish(T, msg("x"))).message_id
    entry = (await broker.publish(T, batch("a", "b", "c"))).message_id
    take_all(broker, att)
    broker.ack_through(att, T, MessageId(entry.ledger, entry.entry, 1))
    assert att.sub.cursors[T].mark_delete == first
    broker.close(att)
    again = await subscribe(broker, "s", [T])
    assert payloads(take_all(broker, again)) == ["c"]


async def test_deliver_at_holds_messages_back_from_shared_subscriptions_only() -> None:
    clock = Clock()
    broker = new_broker(clock=clock)
    shared = await subscribe(broker, "shared", [T], kind=SubscriptionKind.SHARED)
    exclusive = await subscribe(broker, "exclusive", [T])
    await broker.publish(T, Message(b"later", deliver_at=int(clock.now) + 500))
    await broker.publish(T, msg("now"))
    assert payloads(take_all(broker, exclusive)) == ["later", "now"]
    assert payloads(take_all(broker, shared)) == ["now"]
    assert broker.next_scheduled() == clock.now + 500
    assert broker.release_scheduled() == 0
    clock.now += 500
    assert broker.release_scheduled() == 1
    assert payloads(take_all(broker, shared)) == ["later"]


async def test_held_messages_are_held_again_after_a_restart() -> None:
    clock = Clock()
    storage = MemoryStorage()
    broker = new_broker(storage, clock)
    await subscribe(broker, "shared", [T], kind=SubscriptionKind.SHARED)
    await broker.publish(T, Message(b"later", deliver_at=int(clock.now) + 500))
    restarted = new_broker(storage, clock)
    await restarted.recover()
    att = await subscribe(restarted, "shared", [T], kind=SubscriptionKind.SHARED)
    assert take_all(restarted, att) == []
    clock.now += 500
    restarted.release_scheduled()
    assert payloads(take_all(restarted, att)) == ["later"]


async def test_failover_tells_consumers_when_they_become_active() -> None:
    broker = new_broker()
    changes: list[tuple[str, bool]] = []

    def options(name: str) -> dict[str, Any]:
        return {"consumer_name": name, "on_active": lambda active: changes.append((name, active))}

    failover = SubscriptionKind.FAILOVER
    b = await subscribe(broker, "s", [T], kind=failover, **options("b"))
    a = await subscribe(broker, "s", [T], kind=failover, **options("a"))
    assert changes == [("b", True), ("a", True), ("b", False)]
    await broker.publish(T, msg("1"))
    assert payloads(take_all(broker, a)) == ["1"] and take_all(broker, b) == []
    broker.close(a)
    assert changes[-1] == ("b", True)


async def test_non_persistent_topics_store_nothing_and_skip_idle_subscriptions() -> None:
    storage = MemoryStorage()
    broker = new_broker(storage)
    name = "non-persistent://public/default/np"
    att = await subscribe(broker, "s", [name], durable=False)
    durable_idle = await subscribe(broker, "idle", [name])
    broker.close(durable_idle)
    first = await broker.publish(name, msg("1"))
    second = await broker.publish(name, msg("2"))
    assert second.message_id > first.message_id
    assert payloads(take_all(broker, att)) == ["1", "2"]
    assert storage.stats().messages == 0
    again = await subscribe(broker, "idle", [name])
    assert take_all(broker, again) == []


AT_MOST_ONCE: dict[str, Any] = {"auto_ack_qos0": True}
ACKNOWLEDGING: dict[str, Any] = {}


async def test_qos0_is_acknowledged_when_an_at_most_once_consumer_takes_it() -> None:
    broker = new_broker()
    att = await subscribe(broker, "c1", ["a"], **AT_MOST_ONCE)
    first = await broker.publish(topic("a"), msg("0", qos=0))
    second = await broker.publish(topic("a"), msg("1", qos=1))
    assert payloads(take_all(broker, att)) == ["0", "1"]
    # Only the QoS 1 message waits for an acknowledgement.
    assert list(att.unacked) == [(topic("a"), second.message_id)]
    assert att.sub.cursors[topic("a")].mark_delete == first.message_id
    assert broker.stats().messages_unacked == 1


async def test_qos0_taken_at_most_once_frees_the_receiver_queue() -> None:
    broker = new_broker()
    att = await subscribe(broker, "c1", ["a"], capacity=2, **AT_MOST_ONCE)
    for n in range(5):
        await broker.publish(topic("a"), msg(str(n), qos=0))
    assert payloads(take_all(broker, att)) == ["0", "1"]
    # Nothing was left to acknowledge, so the backlog moved on at once.
    assert payloads(take_all(broker, att)) == ["2", "3"]
    assert payloads(take_all(broker, att)) == ["4"]
    assert broker.stats().messages_backlog == 0


@pytest.mark.parametrize(("options", "back"), [(AT_MOST_ONCE, []), (ACKNOWLEDGING, ["0"])])
async def test_qos0_comes_back_only_to_a_consumer_that_acknowledges(
    options: dict[str, Any], back: list[str]
) -> None:
    broker = new_broker()
    att = await subscribe(broker, "c1", ["a"], **options)
    await broker.publish(topic("a"), msg("0", qos=0))
    assert payloads(take_all(broker, att)) == ["0"]
    broker.close(att)  # without acknowledging
    again = await subscribe(broker, "c1", ["a"], **options)
    assert payloads(take_all(broker, again)) == back


async def test_first_delivery_is_shared_and_a_redelivery_is_not() -> None:
    broker = new_broker()
    one = await subscribe(broker, "s1", ["a"])
    two = await subscribe(broker, "s2", ["a"])
    await broker.publish(topic("a"), msg("m"))
    (first,) = take_all(broker, one)
    (second,) = take_all(broker, two)
    assert first is second
    assert first.redelivery_count == 0
    broker.nack(one, [first])
    (again,) = take_all(broker, one)
    assert again is not first
    assert (again.message_id, again.redelivery_count) == (first.message_id, 1)
