"""Broker behaviour with plain calls: routing, the four subscription types, acknowledgement,
backlog limits, expiry, subscription lifetime, trimming and recovery; and `Broker.store_many`,
which stores and routes consecutive messages of one topic together, with the results of storing
them one at a time, and stores nothing when storage refuses them."""

from __future__ import annotations

import pytest

from mop.broker import (
    Broker,
    ConsumerBusy,
    Subscription,
    SubscriptionMismatch,
)
from mop.broker.storage import IdRanges, MemoryStorage, StorageFull
from mop.message import RETAINED, Message, MessageId
from mop.messaging import StartPosition, SubscriptionKind

from .support import Clock, Wakeups, msg, new_broker, payloads, subscribe, take_all, topic

SHARED = SubscriptionKind.SHARED


async def test_exact_subscription_gets_only_its_topic() -> None:
    broker = new_broker()
    att = await subscribe(broker, "c1", ["a/b"])
    first = await broker.publish(topic("a/b"), msg("1"))
    other = await broker.publish(topic("a/c"), msg("2"))
    assert (first.subscriptions, other.subscriptions) == (1, 0)
    deliveries = take_all(broker, att)
    assert payloads(deliveries) == ["1"]
    assert deliveries[0].topic == topic("a/b")
    assert deliveries[0].message_id == first.message_id
    assert deliveries[0].redelivery_count == 0


async def test_exact_selector_may_be_a_pulsar_name() -> None:
    broker = new_broker()
    att = await subscribe(broker, "c1", [topic("a/b")])
    await broker.publish(topic("a/b"), msg("1"))
    assert payloads(take_all(broker, att)) == ["1"]


async def test_wildcard_covers_existing_and_later_topics() -> None:
    broker = new_broker()
    await broker.publish(topic("a/old"), msg("before"))
    att = await subscribe(broker, "c1", ["a/+"])
    await broker.publish(topic("a/old"), msg("1"))
    # A topic created after the subscription joins it from its first message.
    result = await broker.publish(topic("a/new"), msg("2"))
    await broker.publish(topic("b/new"), msg("3"))
    await broker.publish(topic("a/new/deeper"), msg("4"))
    assert result.subscriptions == 1
    assert payloads(take_all(broker, att)) == ["1", "2"]


@pytest.mark.parametrize("before", [True, False], ids=["topic-first", "subscription-first"])
async def test_wildcards_do_not_reach_the_system_namespace(before: bool) -> None:
    """The deployment's tables are topics of the system namespace; a client's `#` must not
    get their writes (retained messages, sessions), as it gets no `$` topic."""
    broker = new_broker()
    table = "persistent://public/__mop/default%2Ftable%2Fretained"
    if before:
        await broker.publish(table, msg("0"))
    everything = await subscribe(broker, "c1", ["#"])
    reader = await subscribe(broker, "c2", [table])
    await broker.publish(table, msg("1"))
    await broker.publish(topic("a"), msg("2"))
    assert payloads(take_all(broker, everything)) == ["2"]
    assert payloads(take_all(broker, reader)) == ["1"]


async def test_consumer_is_woken_when_a_message_is_handed_to_it() -> None:
    broker = new_broker()
    wakeups = Wakeups()
    att = await subscribe(broker, "c1", ["a"], on_ready=wakeups)
    await broker.publish(topic("a"), msg("1"))
    await broker.publish(topic("a"), msg("2"))
    # Only the transition from empty to non-empty wakes the consumer.
    assert wakeups.count == 1
    assert payloads(take_all(broker, att)) == ["1", "2"]
    await broker.publish(topic("a"), msg("3"))
    assert wakeups.count == 2


async def test_qos0_publish_does_not_sync() -> None:
    storage = MemoryStorage()
    broker = new_broker(storage)
    await subscribe(broker, "c1", ["a"])
    syncs = storage.syncs
    await broker.publish(topic("a"), msg("fast", qos=0))
    assert storage.syncs == syncs
    await broker.publish(topic("a"), msg("safe", qos=1))
    assert storage.syncs == syncs + 1


async def test_receiver_queue_bounds_dispatch_and_acks_free_it() -> None:
    broker = new_broker()
    att = await subscribe(broker, "c1", ["a"], capacity=2)
    for n in range(5):
        await broker.publish(topic("a"), msg(str(n)))
    first = take_all(broker, att)
    assert payloads(first) == ["0", "1"]
    assert take_all(broker, att) == []
    broker.ack(att, first[:1])
    assert payloads(take_all(broker, att)) == ["2"]
    assert broker.stats().messages_backlog == 2


async def test_order_is_kept_across_topics_and_between_them_in_turn() -> None:
    broker = new_broker()
    att = await subscribe(broker, "c1", ["#"], capacity=1)
    for n in range(3):
        await broker.publish(topic("x"), msg(f"x{n}"))
        await broker.publish(topic("y"), msg(f"y{n}"))
    seen = []
    for _ in range(6):
        deliveries = take_all(broker, att)
        seen += payloads(deliveries)
        broker.ack(att, deliveries)
    assert [p for p in seen if p[0] == "x"] == ["x0", "x1", "x2"]
    assert [p for p in seen if p[0] == "y"] == ["y0", "y1", "y2"]


async def test_a_queued_backlog_comes_one_topic_at_a_time_in_turn_not_in_publish_order() -> None:
    # What the README's "Order" paragraph tells users: a1, a2, b1 queued -> a1, b1, a2.
    broker = new_broker()
    att = await subscribe(broker, "away", ["#"], durable=True, capacity=0)
    for name, payload in (("a", "a1"), ("a", "a2"), ("b", "b1")):
        await broker.publish(topic(name), msg(payload))
    broker.close(att)
    back = await subscribe(broker, "away", ["#"], durable=True)
    assert payloads(take_all(broker, back)) == ["a1", "b1", "a2"]


async def test_shared_round_robin_and_leaving_member_hands_back_unacked() -> None:
    broker = new_broker()
    one = await subscribe(broker, "g", ["s/#"], kind=SHARED, member="m1")
    two = await subscribe(broker, "g", ["s/#"], kind=SHARED, member="m2")
    for n in range(4):
        await broker.publish(topic("s/t"), msg(str(n)))
    got_one = take_all(broker, one)
    got_two = take_all(broker, two)
    assert payloads(got_one) == ["0", "2"]
    assert payloads(got_two) == ["1", "3"]
    broker.ack(one, got_one[:1])
    broker.close(one)
    # m1 left with "2" unacknowledged: it goes to m2, counted as a redelivery.
    redelivered = take_all(broker, two)
    assert payloads(redelivered) == ["2"]
    assert redelivered[0].redelivery_count == 1


async def test_shared_skips_members_without_space() -> None:
    broker = new_broker()
    one = await subscribe(broker, "g", ["s"], kind=SHARED, member="m1", capacity=1)
    two = await subscribe(broker, "g", ["s"], kind=SHARED, member="m2", capacity=10)
    for n in range(4):
        await broker.publish(topic("s"), msg(str(n)))
    assert payloads(take_all(broker, one)) == ["0"]
    assert payloads(take_all(broker, two)) == ["1", "2", "3"]


async def test_failover_uses_the_lowest_member_and_fails_over() -> None:
    broker = new_broker()
    kind = SubscriptionKind.FAILOVER
    b = await subscribe(broker, "f", ["t"], kind=kind, member="b")
    a = await subscribe(broker, "f", ["t"], kind=kind, member="a")
    await broker.publish(topic("t"), msg("1"))
    await broker.publish(topic("t"), msg("2"))
    got = take_all(broker, a)
    assert payloads(got) == ["1", "2"]
    assert take_all(broker, b) == []
    broker.ack(att=a, deliveries=got[:1])
    broker.close(a)
    await broker.publish(topic("t"), msg("3"))
    taken = take_all(broker, b)
    assert payloads(taken) == ["2", "3"]
    assert [d.redelivery_count for d in taken] == [1, 0]


async def test_key_shared_maps_each_key_to_one_member() -> None:
    broker = new_broker()
    kind = SubscriptionKind.KEY_SHARED
    members = [await subscribe(broker, "k", ["t"], kind=kind, member=f"m{i}") for i in range(3)]
    keys = [f"key-{n}" for n in range(30)]
    for round_ in range(3):
        for key in keys:
            await broker.publish(topic("t"), msg(f"{key}/{round_}", key=key))
    owner: dict[str, int] = {}
    for index, att in enumerate(members):
        for delivery in take_all(broker, att):
            key = delivery.message.key
            assert key is not None
            assert owner.setdefault(key, index) == index
    assert len(owner) == len(keys)
    assert len(set(owner.values())) == 3  # keys are spread over every member
    # Per key, messages arrive in publish order.
    broker2 = new_broker()
    att = await subscribe(broker2, "k", ["t"], kind=kind, member="solo")
    for round_ in range(3):
        await broker2.publish(topic("t"), msg(str(round_), key="k"))
    assert payloads(take_all(broker2, att)) == ["0", "1", "2"]


async def test_key_shared_keeps_mapping_when_membership_is_unchanged() -> None:
    kind = SubscriptionKind.KEY_SHARED
    owners = []
    for _ in range(2):
        broker = new_broker()
        members = [await subscribe(broker, "k", ["t"], kind=kind, member=m) for m in "xyz"]
        await broker.publish(topic("t"), msg("1", key="stable"))
        owners.append([len(take_all(broker, att)) for att in members])
    assert owners[0] == owners[1]
    assert sorted(owners[0]) == [0, 0, 1]


async def test_nack_redelivers_first_with_count() -> None:
    broker = new_broker()
    att = await subscribe(broker, "c1", ["a"])
    for n in range(3):
        await broker.publish(topic("a"), msg(str(n)))
    got = take_all(broker, att)
    broker.ack(att, [got[0], got[2]])
    broker.nack(att, [got[1]])
    again = take_all(broker, att)
    assert payloads(again) == ["1"]
    assert again[0].redelivery_count == 1
    broker.nack(att, again)
    assert take_all(broker, att)[0].redelivery_count == 2


async def test_nack_with_delay_waits_for_release() -> None:
    broker = new_broker()
    att = await subscribe(broker, "c1", ["a"])
    await broker.publish(topic("a"), msg("1"))
    got = take_all(broker, att)
    broker.nack(att, got, due=10.0)
    assert broker.next_due() == 10.0
    assert broker.release_due(9.0) == 0
    assert take_all(broker, att) == []
    assert broker.release_due(10.0) == 1
    assert broker.next_due() is None
    again = take_all(broker, att)
    assert payloads(again) == ["1"]
    assert again[0].redelivery_count == 1


async def test_returned_messages_merge_in_id_order() -> None:
    broker = new_broker()
    att = await subscribe(broker, "c1", ["a"])
    for n in range(4):
        await broker.publish(topic("a"), msg(str(n)))
    got = take_all(broker, att)
    broker.nack(att, [got[1]], due=5.0)
    broker.close(att)  # "0", "2", "3" go back first
    broker.release_due(5.0)  # then "1" comes back behind them, but in id order
    att = await subscribe(broker, "c1", ["a"])
    assert payloads(take_all(broker, att)) == ["0", "1", "2", "3"]


async def test_max_backlog_drops_new_message_when_nothing_is_qos0() -> None:
    broker = new_broker()
    att = await subscribe(broker, "c1", ["a"], max_backlog=2)
    broker.close(att)
    for n in range(4):
        await broker.publish(topic("a"), msg(str(n)))
    att = await subscribe(broker, "c1", ["a"], max_backlog=2)
    assert payloads(take_all(broker, att)) == ["0", "1"]
    assert broker.stats().messages_dropped == 2


async def test_max_backlog_drops_oldest_qos0_first() -> None:
    broker = new_broker()
    att = await subscribe(broker, "c1", ["a"], max_backlog=3)
    broker.close(att)
    await broker.publish(topic("a"), msg("keep", qos=1))
    await broker.publish(topic("a"), msg("old0", qos=0))
    await broker.publish(topic("a"), msg("new0", qos=0))
    await broker.publish(topic("a"), msg("x", qos=1))  # evicts old0
    await broker.publish(topic("a"), msg("y", qos=0))  # evicts new0
    att = await subscribe(broker, "c1", ["a"], max_backlog=3)
    assert payloads(take_all(broker, att)) == ["keep", "x", "y"]
    assert broker.stats().messages_dropped == 2


async def test_a_stalled_subscription_saves_its_drops_as_one_run() -> None:
    # One message in flight and never acknowledged; everything after the backlog is dropped
    # and acknowledged one by one behind it: the saved cursor stays one run, not an id each.
    storage = MemoryStorage()
    broker = new_broker(storage)
    att = await subscribe(broker, "c1", ["a"], capacity=1, max_backlog=10)
    for n in range(5000):
        await broker.publish(topic("a"), msg(str(n)))
    assert len(broker.take(att, 1)) == 1
    state = storage.load_cursors()[(topic("a"), "c1")]
    assert state.mark_delete is None
    assert len(state.acked) == 5000 - 1 - 10  # one with the consumer, ten in the backlog
    assert len(state.acked.runs) == 1
    assert broker.stats().messages_dropped == len(state.acked)
    # Nor does the cursor keep an id for each message it dropped.
    sub = broker.subscription("c1")
    assert sub is not None
    assert len(sub.cursors[topic("a")].ids) <= 1 + 10 + 1024


async def test_a_stalled_subscription_reads_its_drops_back_as_one_run() -> None:
    storage = MemoryStorage()
    first = new_broker(storage)
    att = await subscribe(first, "c1", ["a"], capacity=1, max_backlog=10)
    for n in range(5000):
        await first.publish(topic("a"), msg(str(n)))
    assert len(first.take(att, 1)) == 1
    second = Broker(storage, clock=Clock())
    await second.recover()
    att = await subscribe(second, "c1", ["a"])
    sub = second.subscription("c1")
    assert sub is not None
    cursor = sub.cursors[topic("a")]
    # The messages still owed, and the last of the run dropped after them (the eleventh is
    # dropped again for the bound of ten as the backlog is read, and joins that run).
    assert len(cursor.ids) == 11
    got = take_all(second, att)
    assert payloads(got) == [str(n) for n in range(10)]
    second.ack(att, got)
    assert cursor.mark_delete == MessageId(0, 4999)
    assert not cursor.ids and not cursor.acked


async def test_expired_messages_are_dropped_at_dispatch() -> None:
    clock = Clock(now=1000.0)
    storage = MemoryStorage()
    broker = new_broker(storage, clock)
    att = await subscribe(broker, "c1", ["a"])
    await broker.publish(topic("a"), msg("short", expires_at=1500))
    await broker.publish(topic("a"), msg("long", expires_at=5000))
    await broker.publish(topic("a"), msg("forever"))
    clock.now = 2000.0
    assert payloads(take_all(broker, att)) == ["long", "forever"]
    assert broker.stats().messages_expired == 1
    # The expired message counts as handled, so it can be trimmed.
    sub = broker.subscription("c1")
    assert sub is not None
    assert sub.cursors[topic("a")].mark_delete == MessageId(0, 0)


async def test_durable_subscription_collects_while_offline() -> None:
    broker = new_broker()
    att = await subscribe(broker, "c1", ["a"])
    await broker.publish(topic("a"), msg("1"))
    await broker.publish(topic("a"), msg("2"))
    got = take_all(broker, att)
    broker.ack(att, got[:1])
    broker.close(att)
    result = await broker.publish(topic("a"), msg("3"))
    assert result.subscriptions == 1
    att = await subscribe(broker, "c1", ["a"])
    again = take_all(broker, att)
    assert payloads(again) == ["2", "3"]
    assert [d.redelivery_count for d in again] == [1, 0]


async def test_non_durable_subscription_goes_with_its_consumer() -> None:
    broker = new_broker()
    att = await subscribe(broker, "c1", ["a"], durable=False)
    broker.close(att)
    assert broker.subscription("c1") is None
    assert (await broker.publish(topic("a"), msg("1"))).subscriptions == 0


async def test_exclusive_is_busy_and_type_must_match() -> None:
    broker = new_broker()
    att = await subscribe(broker, "c1", ["a"])
    with pytest.raises(ConsumerBusy):
        await subscribe(broker, "c1", ["a"])
    with pytest.raises(SubscriptionMismatch):
        await subscribe(broker, "c1", ["a"], kind=SHARED, member="m")
    broker.close(att)
    await subscribe(broker, "c1", ["a"])


async def test_same_member_cannot_attach_twice_to_shared() -> None:
    broker = new_broker()
    await subscribe(broker, "g", ["a"], kind=SHARED, member="m")
    with pytest.raises(ConsumerBusy):
        await subscribe(broker, "g", ["a"], kind=SHARED, member="m")


async def test_delete_subscription_removes_offline_members() -> None:
    broker = new_broker()
    one = await subscribe(broker, "g", ["a"], kind=SHARED, member="m1")
    two = await subscribe(broker, "g", ["a"], kind=SHARED, member="m2")
    with pytest.raises(ConsumerBusy):
        await broker.delete_subscription("g", "m1")
    broker.close(one)
    broker.close(two)
    await broker.delete_subscription("g", "m1")
    assert broker.subscription("g") is not None
    await broker.delete_subscription("g", "m2")
    assert broker.subscription("g") is None
    await broker.delete_subscription("g", "m2")  # gone already: nothing to do


async def test_unsubscribe_of_last_member_deletes_subscription() -> None:
    storage = MemoryStorage()
    broker = new_broker(storage)
    att = await subscribe(broker, "c1", ["a"])
    await broker.publish(topic("a"), msg("1"))
    await broker.unsubscribe(att)
    assert broker.subscription("c1") is None
    assert storage.load_cursors() == {}
    assert list(storage.table_items("$broker/subscriptions")) == []


async def test_remove_selector_drops_backlog_and_add_selector_starts_now() -> None:
    broker = new_broker()
    att = await subscribe(broker, "c1", ["a/+", "a/b"], capacity=1)
    for name in ("a/b", "a/c", "a/b"):
        await broker.publish(topic(name), msg(name))
    sub = broker.subscription("c1")
    assert sub is not None
    await broker.remove_selector(sub, "a/+")
    # "a/b" is still covered by the exact selector; "a/c" leaves with its backlog.
    assert set(sub.cursors) == {topic("a/b")}
    await broker.publish(topic("z"), msg("early"))
    await broker.add_selector(sub, "z")
    await broker.publish(topic("z"), msg("z"))
    seen = []
    while deliveries := take_all(broker, att):
        seen += payloads(deliveries)
        broker.ack(att, deliveries)
    assert sorted(seen) == ["a/b", "a/b", "z"]


async def test_earliest_reads_stored_messages_first() -> None:
    broker = new_broker()
    for n in range(3):
        await broker.publish(topic("a"), msg(str(n)))
    att = await subscribe(broker, "r", ["a"], start=StartPosition.EARLIEST)
    await broker.publish(topic("a"), msg("3"))
    assert payloads(take_all(broker, att)) == ["0", "1", "2", "3"]


async def test_acknowledged_data_is_trimmed() -> None:
    storage = MemoryStorage()
    broker = new_broker(storage)
    await broker.publish(topic("nobody"), msg("x"))
    one = await subscribe(broker, "c1", ["a"])
    two = await subscribe(broker, "c2", ["a"])
    for n in range(3):
        await broker.publish(topic("a"), msg(str(n)))
    broker.trim_acknowledged()
    assert storage.stats().messages == 3  # "nobody" had no subscription
    got = take_all(broker, one)
    broker.ack(one, got)
    broker.trim_acknowledged()
    assert storage.stats().messages == 3  # c2 still needs them
    got = take_all(broker, two)
    broker.ack(two, got[:2])
    broker.trim_acknowledged()
    assert storage.stats().messages == 1
    # Out-of-order acks are kept beside the mark-delete position until the gap closes.
    broker.ack(two, got[2:])
    broker.trim_acknowledged()
    assert storage.stats().messages == 0


async def test_out_of_order_acks_are_saved_individually() -> None:
    storage = MemoryStorage()
    broker = new_broker(storage)
    att = await subscribe(broker, "c1", ["a"])
    for n in range(3):
        await broker.publish(topic("a"), msg(str(n)))
    got = take_all(broker, att)
    broker.ack(att, [got[1]])
    state = storage.load_cursors()[(topic("a"), "c1")]
    assert state.mark_delete is None
    assert state.acked == IdRanges.of([got[1].message_id])
    broker.ack(att, [got[0]])
    state = storage.load_cursors()[(topic("a"), "c1")]
    assert (state.mark_delete, state.acked) == (got[1].message_id, IdRanges())


async def test_recover_rebuilds_durable_state_from_storage() -> None:
    storage = MemoryStorage()
    first = new_broker(storage)
    durable = await subscribe(first, "c1", ["a/#"])
    shared = await subscribe(first, "g", ["a/x"], kind=SHARED, member="m1")
    await subscribe(first, "temp", ["a/#"], durable=False)
    for n in range(4):
        await first.publish(topic("a/x"), msg(str(n)))
    got = take_all(first, durable)
    first.ack(durable, [got[0], got[2]])
    first.ack(shared, take_all(first, shared))

    second = Broker(storage, clock=Clock())
    await second.recover()
    assert second.subscription("temp") is None
    sub = second.subscription("g")
    assert sub is not None and sub.members == {"m1"}
    att = await subscribe(second, "c1", ["a/#"])
    assert payloads(take_all(second, att)) == ["1", "3"]
    # The wildcard still picks up new topics after recovery.
    await second.publish(topic("a/new"), msg("new"))
    assert payloads(take_all(second, att)) == ["new"]
    # Ids keep increasing on recovered topics.
    result = await second.publish(topic("a/x"), msg("4"))
    assert result.message_id == MessageId(0, 4)
    assert result.subscriptions == 2


async def test_recover_without_saved_cursor_starts_from_first_stored_message() -> None:
    storage = MemoryStorage()
    first = new_broker(storage)
    await subscribe(first, "c1", ["t/#"])
    await first.publish(topic("t/1"), msg("1"))
    # Lose the cursor, as if the process died before saving it.
    storage.save_cursors({(topic("t/1"), "c1"): None})
    second = Broker(storage, clock=Clock())
    await second.recover()
    att = await subscribe(second, "c1", ["t/#"])
    assert payloads(take_all(second, att)) == ["1"]


async def test_stats_count_what_the_broker_holds() -> None:
    broker = new_broker()
    att = await subscribe(broker, "c1", ["a"], capacity=1)
    await broker.publish(topic("a"), msg("1"))
    await broker.publish(topic("a"), msg("2"))
    stats = broker.stats()
    assert (stats.topics, stats.subscriptions, stats.consumers) == (1, 1, 1)
    assert (stats.messages_stored, stats.messages_backlog, stats.messages_unacked) == (2, 1, 1)
    broker.close(att)
    assert broker.stats().messages_backlog == 2


async def test_messages_no_subscription_takes_are_counted() -> None:
    broker = new_broker()
    await subscribe(broker, "c1", ["a"])
    await broker.publish(topic("a"), msg("routed"))
    await broker.publish(topic("b"), msg("unrouted"))
    broker.store_many(topic("c"), [msg("1"), msg("2")])
    assert broker.stats().messages_unrouted == 3


async def test_the_largest_backlogs_are_named_by_subscription_and_topic() -> None:
    broker = new_broker()
    for name, selectors in (("large", ["a/#"]), ("small", ["a/2"])):
        att = await subscribe(broker, name, selectors, capacity=1)
        broker.close(att)  # durable: the backlog stays
    await subscribe(broker, "busy", ["a/1"], capacity=100)  # takes what comes: no backlog
    for n in range(3):
        await broker.publish(topic("a/1"), msg(str(n)))
    await broker.publish(topic("a/2"), msg("x"))
    assert broker.largest_backlogs(1) == [("large", topic("a/1"), 3)]
    assert sorted(broker.largest_backlogs(10)) == [
        ("large", topic("a/1"), 3),
        ("large", topic("a/2"), 1),
        ("small", topic("a/2"), 1),
    ]
    assert broker.largest_backlogs(0) == []


async def test_returned_messages_come_before_other_topics_backlog() -> None:
    broker = new_broker()
    att = await subscribe(broker, "c1", ["s/#"])
    for n in range(3):
        await broker.publish(topic("s/x"), msg(f"x{n}"))
    got = take_all(broker, att)
    broker.ack(att, got[:1])
    broker.close(att)
    await broker.publish(topic("s/y"), msg("y0"))
    await broker.publish(topic("s/x"), msg("x3"))
    att = await subscribe(broker, "c1", ["s/#"])
    again = take_all(broker, att)
    assert payloads(again)[:2] == ["x1", "x2"]
    assert [d.redelivery_count for d in again[:2]] == [1, 1]
    assert sorted(payloads(again)[2:]) == ["x3", "y0"]


async def test_subscribing_again_replaces_selectors() -> None:
    broker = new_broker()
    att = await subscribe(broker, "c1", ["a", "b"])
    broker.close(att)
    att = await subscribe(broker, "c1", ["b", "c"])
    for name in ("a", "b", "c"):
        await broker.publish(topic(name), msg(name))
    assert payloads(take_all(broker, att)) == ["b", "c"]


async def test_becoming_durable_saves_existing_cursors() -> None:
    storage = MemoryStorage()
    broker = new_broker(storage)
    await subscribe(broker, "g", ["a"], kind=SHARED, durable=False, member="m1")
    await broker.publish(topic("a"), msg("1"))
    assert storage.load_cursors() == {}
    await subscribe(broker, "g", ["a"], kind=SHARED, durable=True, member="m2")
    assert (topic("a"), "g") in storage.load_cursors()


async def test_invalid_selector_leaves_no_subscription() -> None:
    broker = new_broker()
    with pytest.raises(ValueError):
        await subscribe(broker, "c1", ["ok/#", "bad\udc80"])
    assert broker.subscription("c1") is None
    assert (await broker.publish(topic("ok/1"), msg("1"))).subscriptions == 0


async def test_messages_are_routed_in_order_with_consecutive_ids() -> None:
    broker = new_broker()
    exact = await subscribe(broker, "exact", ["a/1"])
    wildcard = await subscribe(broker, "wild", ["a/+"], auto_ack_qos0=True)
    await broker.publish(topic("a/1"), msg("first"))
    ids, count = broker.store_many(topic("a/1"), [msg(str(n), qos=n % 2) for n in range(5)])
    assert count == 2
    assert [i.entry for i in ids] == list(range(ids[0].entry, ids[0].entry + 5))
    assert broker.topic(topic("a/1")).last_id == ids[-1]  # type: ignore[union-attr]
    for att in (exact, wildcard):
        assert payloads(take_all(broker, att)) == ["first", "0", "1", "2", "3", "4"]
    stored = await broker.storage.read(topic("a/1"), None, 10)
    assert [m.payload for _, m in stored] == [b"first", b"0", b"1", b"2", b"3", b"4"]


async def test_a_new_topic_is_created_and_joins_matching_subscriptions() -> None:
    broker = new_broker()
    att = await subscribe(broker, "wild", ["b/#"])
    ids, count = broker.store_many(topic("b/new"), [msg("x"), msg("y")])
    assert count == 1 and len(ids) == 2
    assert payloads(take_all(broker, att)) == ["x", "y"]


async def test_without_subscriptions_the_messages_are_kept_for_trimming() -> None:
    broker = new_broker()
    ids, count = broker.store_many(topic("c"), [msg("x"), msg("y")])
    assert count == 0
    assert broker.trim_acknowledged() == 1
    assert await broker.storage.read(topic("c"), None, 10) == []
    assert len(ids) == 2


async def test_storage_refusing_the_batch_stores_none_of_it() -> None:
    storage = MemoryStorage(max_bytes=10)
    broker = new_broker(storage)
    att = await subscribe(broker, "s", ["d"])
    with pytest.raises(StorageFull):
        broker.store_many(topic("d"), [msg("12345"), msg("67890"), msg("x")])
    assert take_all(broker, att) == []
    assert await storage.read(topic("d"), None, 10) == []
    # Room for one: the next call stores it.
    ids, _ = broker.store_many(topic("d"), [msg("ok")])
    assert payloads(take_all(broker, att)) == ["ok"]
    assert len(ids) == 1


async def test_non_persistent_topics_get_ids_without_storage() -> None:
    broker = new_broker()
    name = "non-persistent://public/default/np"
    att = await subscribe(broker, "s", [name])
    ids, count = broker.store_many(name, [Message(b"1"), Message(b"2"), Message(b"3")])
    assert count == 1
    assert [i.entry for i in ids] == [0, 1, 2]
    assert payloads(take_all(broker, att)) == ["1", "2", "3"]
    assert broker.storage.topics() == []


def batch(*payloads: str) -> Message:
    return Message(b"", qos=1, batch=tuple(Message(p.encode(), qos=1) for p in payloads))


async def test_the_stats_count_the_messages_of_a_batch() -> None:
    broker = new_broker()
    await broker.publish(topic("nobody"), batch("1", "2", "3"))
    broker.store_many(topic("nobody"), [batch("4", "5"), msg("6")])
    assert broker.stats().messages_unrouted == 6
    await subscribe(broker, "c1", ["a"], capacity=0)
    await broker.publish(topic("a"), batch("1", "2", "3", "4"))
    broker.store_many(topic("a"), [batch("5", "6"), msg("7")])
    assert broker.stats().messages_backlog == 7
    assert broker.largest_backlogs(5) == [("c1", topic("a"), 7)]


async def test_a_backlog_read_from_storage_counts_the_messages_of_its_batches() -> None:
    storage = MemoryStorage()
    broker = new_broker(storage)
    await subscribe(broker, "c1", ["a"], durable=True, capacity=0)
    await broker.publish(topic("a"), batch("1", "2", "3"))
    await broker.publish(topic("a"), msg("4"))
    again = new_broker(storage)
    await again.recover()
    assert again.stats().messages_backlog == 4


async def test_a_retained_message_without_subscribers_is_not_counted_unrouted() -> None:
    broker = new_broker()
    retained = Message(b"kept", properties=(RETAINED,))
    await broker.publish(topic("nobody"), retained)
    broker.store_many(topic("nobody"), [retained, msg("gone")])
    assert broker.stats().messages_unrouted == 1


async def test_a_subscription_its_publisher_waits_for_queues_beyond_max_backlog() -> None:
    broker = new_broker()
    asked: list[tuple[str, str]] = []

    def waits_for(sub: Subscription, producer: str) -> bool:
        asked.append((sub.name, producer))
        return producer == "patient"

    broker.wait_for_subscribers(waits_for)
    att = await subscribe(broker, "c1", ["a"], max_backlog=2, capacity=1)
    broker.note_behind()
    broker.store_many(topic("a"), [msg(str(n), qos=0) for n in range(5)])
    assert [sub.name for sub in broker.take_behind()] == []  # nobody waited: "" is not patient
    assert broker.stats().messages_dropped == 2  # 1 taken by the consumer, 2 queued
    broker.note_behind()
    patient = [Message(b"p%d" % n, qos=0, producer="patient") for n in range(5)]
    broker.store_many(topic("a"), patient)
    assert [sub.name for sub in broker.take_behind()] == ["c1"]
    assert broker.stats().messages_dropped == 2  # queued beyond max_backlog instead
    assert asked == [("c1", ""), ("c1", "patient")]  # once per subscription and publish
    assert att.sub.queued_bytes() == 2 + 10
    # Not noting: the rule applies again.
    broker.store_many(topic("a"), [msg("late", qos=0)])
    assert broker.stats().messages_dropped == 3
