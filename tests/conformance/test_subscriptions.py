"""Subscriptions over their lifetime: durable ones keep collecting while no consumer is attached,
non-durable ones go with their consumer, unsubscribe and `delete_subscription` delete, selectors
change, acknowledgements are final, and closing a consumer wakes a task waiting on it."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from mop.message import Message
from mop.processor.backend import (
    Backend,
    ConsumerClosed,
    SubscriptionKind,
    SubscriptionSpec,
)
from tests.conformance.harness import Names, expect_nothing, payloads, receive


def spec(
    name: str,
    *selectors: str,
    durable: bool = True,
    kind: SubscriptionKind = SubscriptionKind.EXCLUSIVE,
    member: str = "",
    max_backlog: int = 0,
) -> SubscriptionSpec:
    return SubscriptionSpec(
        name=name,
        selectors=frozenset(selectors),
        durable=durable,
        kind=kind,
        member=member,
        max_backlog=max_backlog,
    )


async def publish(backend: Backend, topic: str, *texts: str, qos: int = 1) -> None:
    for text in texts:
        await backend.publish(topic, Message(text.encode(), qos=qos))


async def test_a_durable_subscription_collects_while_offline_and_resumes(
    backend: Backend, names: Names
) -> None:
    durable = spec(names.sub("s"), names.mqtt("t"))
    consumer = await backend.subscribe(durable)
    await publish(backend, names.topic("t"), "0")
    [first] = await receive(consumer, 1)
    await consumer.close()  # "0" is not acknowledged: it goes back to the subscription
    await publish(backend, names.topic("t"), "1", "2")
    consumer = await backend.subscribe(durable)
    got = await receive(consumer, 3)
    assert payloads(got) == [b"0", b"1", b"2"]
    # The MQTT layer finds a resent message's packet id by its message id.
    assert got[0].message_id == first.message_id
    consumer.ack(got)
    await expect_nothing(consumer)


async def test_a_durable_subscription_with_wildcards_resumes_on_every_topic(
    backend: Backend, names: Names
) -> None:
    durable = spec(names.sub("s"), names.mqtt("+/t"))
    consumer = await backend.subscribe(durable)
    await publish(backend, names.topic("a/t"), "a0")
    assert payloads(await receive(consumer, 1)) == [b"a0"]
    await consumer.close()
    await publish(backend, names.topic("a/t"), "a1")
    await publish(backend, names.topic("b/t"), "b1")  # a topic made while offline
    consumer = await backend.subscribe(durable)
    got = await receive(consumer, 3)
    assert sorted(payloads(got)) == [b"a0", b"a1", b"b1"]


async def test_a_non_durable_subscription_is_gone_after_close(
    backend: Backend, names: Names
) -> None:
    volatile = spec(names.sub("s"), names.mqtt("t"), durable=False)
    consumer = await backend.subscribe(volatile)
    await publish(backend, names.topic("t"), "seen")
    assert payloads(await receive(consumer, 1)) == [b"seen"]
    await consumer.close()
    await publish(backend, names.topic("t"), "while away")
    consumer = await backend.subscribe(volatile)
    await publish(backend, names.topic("t"), "after")
    # Per-topic order: a kept "while away" would come first.
    assert payloads(await receive(consumer, 1)) == [b"after"]
    await expect_nothing(consumer)


async def test_unsubscribe_deletes_a_durable_subscription(backend: Backend, names: Names) -> None:
    durable = spec(names.sub("s"), names.mqtt("t"))
    consumer = await backend.subscribe(durable)
    await publish(backend, names.topic("t"), "unacked")
    await receive(consumer, 1)
    await consumer.unsubscribe()
    await publish(backend, names.topic("t"), "while away")
    consumer = await backend.subscribe(durable)
    await publish(backend, names.topic("t"), "after")
    assert payloads(await receive(consumer, 1)) == [b"after"]
    await expect_nothing(consumer)


async def test_delete_subscription_removes_an_offline_durable_subscription(
    backend: Backend, names: Names
) -> None:
    durable = spec(names.sub("s"), names.mqtt("a"), names.mqtt("b/+"))
    consumer = await backend.subscribe(durable)
    await publish(backend, names.topic("a"), "a0")
    await publish(backend, names.topic("b/x"), "b0")
    await receive(consumer, 2)
    await consumer.close()
    await publish(backend, names.topic("a"), "a1")
    await publish(backend, names.topic("b/x"), "b1")
    # An expired MQTT session: its subscription is deleted with nobody attached.
    await backend.delete_subscription(durable.name)
    consumer = await backend.subscribe(durable)
    await publish(backend, names.topic("a"), "a2")
    await publish(backend, names.topic("b/x"), "b2")
    assert sorted(payloads(await receive(consumer, 2))) == [b"a2", b"b2"]
    await expect_nothing(consumer)


async def test_delete_subscription_names_an_exclusive_subscription_by_its_member(
    backend: Backend, names: Names
) -> None:
    # An MQTT session's subscription is named after its client id, which is its member too:
    # deleting it with that member must take its unacknowledged messages with it.
    durable = spec(names.sub("s"), names.mqtt("t"), member=names.sub("s"))
    consumer = await backend.subscribe(durable)
    await publish(backend, names.topic("t"), "unacked")
    await receive(consumer, 1)
    await consumer.close()
    await backend.delete_subscription(durable.name, member=durable.member)
    consumer = await backend.subscribe(durable)
    await publish(backend, names.topic("t"), "after")
    assert payloads(await receive(consumer, 1)) == [b"after"]
    await expect_nothing(consumer)


async def test_delete_subscription_with_another_member_deletes_nothing(
    backend: Backend, names: Names
) -> None:
    durable = spec(names.sub("s"), names.mqtt("t"), member=names.sub("s"))
    consumer = await backend.subscribe(durable)
    await publish(backend, names.topic("t"), "unacked")
    await receive(consumer, 1)
    await consumer.close()
    await backend.delete_subscription(durable.name, member=names.sub("other"))
    await backend.delete_subscription(durable.name)  # no member: not its member either
    await publish(backend, names.topic("t"), "while away")
    consumer = await backend.subscribe(durable)
    assert payloads(await receive(consumer, 2)) == [b"unacked", b"while away"]
    await expect_nothing(consumer)


async def test_delete_subscription_removes_an_offline_shared_member(
    backend: Backend, names: Names
) -> None:
    member = spec(
        f"$share/g/{names.mqtt('t')}",
        names.mqtt("t"),
        kind=SubscriptionKind.SHARED,
        member=names.sub("client"),
    )
    consumer = await backend.subscribe(member)
    await publish(backend, names.topic("t"), "0")
    await receive(consumer, 1)
    await consumer.close()
    await publish(backend, names.topic("t"), "1")
    await backend.delete_subscription(member.name, member=member.member)
    consumer = await backend.subscribe(member)
    await publish(backend, names.topic("t"), "2")
    assert payloads(await receive(consumer, 1)) == [b"2"]
    await expect_nothing(consumer)


async def test_delete_subscription_of_an_unknown_name_does_nothing(
    backend: Backend, names: Names
) -> None:
    # The MQTT layer deletes a session's subscription whether or not it ever subscribed.
    await backend.delete_subscription(names.sub("never"))
    await backend.delete_subscription(names.sub("never"), member="nobody")


async def test_selectors_can_be_added_and_removed(backend: Backend, names: Names) -> None:
    consumer = await backend.subscribe(spec(names.sub("s"), names.mqtt("a")))
    await consumer.add_selector(names.mqtt("b/#"))
    assert consumer.spec.selectors == {names.mqtt("a"), names.mqtt("b/#")}
    await publish(backend, names.topic("b/1"), "b")
    [delivery] = await receive(consumer, 1)
    assert (delivery.topic, delivery.message.payload) == (names.topic("b/1"), b"b")
    consumer.ack([delivery])
    await consumer.remove_selector(names.mqtt("b/#"))
    assert consumer.spec.selectors == {names.mqtt("a")}
    await publish(backend, names.topic("b/1"), "not any more")
    await publish(backend, names.topic("a"), "a")
    assert payloads(await receive(consumer, 1)) == [b"a"]
    await expect_nothing(consumer)


@pytest.mark.parametrize("kind", [SubscriptionKind.EXCLUSIVE, SubscriptionKind.SHARED])
async def test_an_acknowledgement_is_final(
    backend: Backend, names: Names, kind: SubscriptionKind
) -> None:
    durable = spec(names.sub("s"), names.mqtt("t"), kind=kind, member=names.sub("m"))
    consumer = await backend.subscribe(durable)
    await publish(backend, names.topic("t"), "0", "1")
    got = await receive(consumer, 2)
    consumer.ack(got[:1])
    await consumer.close()
    consumer = await backend.subscribe(durable)
    [again] = await receive(consumer, 1)
    assert again.message.payload == b"1"
    consumer.ack([again])
    await consumer.close()
    consumer = await backend.subscribe(durable)
    await publish(backend, names.topic("t"), "2")
    assert payloads(await receive(consumer, 1)) == [b"2"]
    await expect_nothing(consumer)


@pytest.mark.parametrize("leave", ["close", "unsubscribe"])
async def test_leaving_wakes_a_waiting_receive(backend: Backend, names: Names, leave: str) -> None:
    consumer = await backend.subscribe(spec(names.sub("s"), names.mqtt("t")))
    woken = trio.Event()

    async def wait() -> None:
        with pytest.raises(ConsumerClosed):
            await consumer.receive(1)
        woken.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        await (consumer.close() if leave == "close" else consumer.unsubscribe())
        with trio.fail_after(5):
            await woken.wait()
    with pytest.raises(ConsumerClosed):
        await consumer.receive(1)
    consumer.ack([])  # harmless after close


@pytest.mark.backends("local", reason="a proxy cannot bound what a broker keeps per subscription")
async def test_max_backlog_bounds_an_offline_subscription(backend: Backend, names: Names) -> None:
    bounded = spec(names.sub("s"), names.mqtt("t"), max_backlog=3)
    await (await backend.subscribe(bounded)).close()
    # Room for 3: the oldest QoS 0 message makes room first; with none left, the new one
    # is dropped.
    for text, qos in [("x", 0), ("a", 1), ("b", 1), ("c", 1), ("d", 1)]:
        await publish(backend, names.topic("t"), text, qos=qos)
    consumer = await backend.subscribe(bounded)
    assert payloads(await receive(consumer, 3)) == [b"a", b"b", b"c"]
    await expect_nothing(consumer)
