"""Non-durable exclusive subscriptions side by side (MQTT clean sessions): each gets every message
published after it subscribed, a slow one loses messages past its backlog without holding the
others back, one that leaves does not disturb the rest, and wildcards follow topics created
later. (Separated mode serves these from one reader per topic per proxy,
`mop.backends.cluster.fanout`.)"""

from __future__ import annotations

import trio

from mop.message import Message
from mop.processor.backend import Backend, Consumer, SubscriptionSpec
from tests.conformance.harness import DEADLINE, QUIET, Names, expect_nothing, payloads, receive


def volatile(name: str, *selectors: str, max_backlog: int = 0) -> SubscriptionSpec:
    return SubscriptionSpec(
        name=name, selectors=frozenset(selectors), durable=False, max_backlog=max_backlog
    )


async def publish(backend: Backend, topic: str, *texts: str, qos: int = 1) -> None:
    for text in texts:
        await backend.publish(topic, Message(text.encode(), qos=qos))


async def received(consumer: Consumer, count: int) -> list[bytes]:
    got = await receive(consumer, count)
    consumer.ack(got)
    return payloads(got)


async def drain(consumer: Consumer) -> list[bytes]:
    """Everything `consumer` has until it stays quiet for a moment."""
    got: list[bytes] = []
    with trio.move_on_after(DEADLINE):
        while True:
            with trio.move_on_after(QUIET) as quiet:
                deliveries = await consumer.receive(100)
                consumer.ack(deliveries)
                got.extend(payloads(deliveries))
            if quiet.cancelled_caught:
                break
    return got


async def test_two_consumers_of_one_topic_each_get_every_message(
    backend: Backend, names: Names
) -> None:
    first = await backend.subscribe(volatile(names.sub("a"), names.mqtt("t")))
    second = await backend.subscribe(volatile(names.sub("b"), names.mqtt("t")))
    await publish(backend, names.topic("t"), "0", "1", qos=0)
    await publish(backend, names.topic("t"), "2", "3", qos=1)
    expected = [b"0", b"1", b"2", b"3"]
    assert await received(first, 4) == expected
    assert await received(second, 4) == expected
    await expect_nothing(first)
    await expect_nothing(second)


async def test_a_later_consumer_gets_only_newer_messages(backend: Backend, names: Names) -> None:
    early = await backend.subscribe(volatile(names.sub("early"), names.mqtt("t")))
    await publish(backend, names.topic("t"), "0", "1")
    assert await received(early, 2) == [b"0", b"1"]
    late = await backend.subscribe(volatile(names.sub("late"), names.mqtt("t")))
    await publish(backend, names.topic("t"), "2")
    assert await received(late, 1) == [b"2"]
    assert await received(early, 1) == [b"2"]
    await expect_nothing(late)


async def test_a_slow_consumer_does_not_stall_a_fast_one(backend: Backend, names: Names) -> None:
    slow = await backend.subscribe(volatile(names.sub("slow"), names.mqtt("t"), max_backlog=10))
    fast = await backend.subscribe(volatile(names.sub("fast"), names.mqtt("t"), max_backlog=10))
    texts = [str(n) for n in range(60)]
    got: list[bytes] = []
    # The fast one keeps up (receives and acknowledges as messages come); the slow one does not
    # receive at all until everything is published.
    async with trio.open_nursery() as nursery:

        async def keep_up() -> None:
            with trio.move_on_after(DEADLINE):
                while len(got) < len(texts):
                    deliveries = await fast.receive(100)
                    fast.ack(deliveries)
                    got.extend(payloads(deliveries))

        nursery.start_soon(keep_up)
        for text in texts:
            await publish(backend, names.topic("t"), text, qos=0)
            await trio.sleep(0.002)  # a publisher at a pace a consumer can follow
    assert got == [t.encode() for t in texts]
    # The slow one kept to its bound (plus what a backend hands over ahead): the oldest
    # qos-0 messages made room for the newest, in order.
    kept = await drain(slow)
    assert kept[-1] == texts[-1].encode()
    numbers = [int(p) for p in kept]
    assert numbers == sorted(set(numbers))


async def test_closing_one_consumer_keeps_the_other_going(backend: Backend, names: Names) -> None:
    staying = await backend.subscribe(volatile(names.sub("stay"), names.mqtt("t")))
    leaving = await backend.subscribe(volatile(names.sub("leave"), names.mqtt("t")))
    await publish(backend, names.topic("t"), "0")
    assert await received(leaving, 1) == [b"0"]
    await leaving.close()
    await publish(backend, names.topic("t"), "1")
    assert await received(staying, 2) == [b"0", b"1"]
    # And one that comes back afterwards starts afresh.
    back = await backend.subscribe(volatile(names.sub("leave"), names.mqtt("t")))
    await publish(backend, names.topic("t"), "2")
    assert await received(back, 1) == [b"2"]
    assert await received(staying, 1) == [b"2"]


async def test_a_wildcard_follows_a_topic_created_later(backend: Backend, names: Names) -> None:
    wide = await backend.subscribe(volatile(names.sub("wide"), names.mqtt("+")))
    exact = await backend.subscribe(volatile(names.sub("exact"), names.mqtt("old")))
    also = await backend.subscribe(volatile(names.sub("also"), names.mqtt("#")))
    await publish(backend, names.topic("old"), "0")
    assert await received(wide, 1) == [b"0"]
    assert await received(exact, 1) == [b"0"]
    assert await received(also, 1) == [b"0"]
    # A topic no one has used yet: found by the proxies' poller in separated mode, and nothing
    # published before it was found is lost.
    await publish(backend, names.topic("new"), "1", "2")
    assert await received(wide, 2) == [b"1", b"2"]
    assert await received(also, 2) == [b"1", b"2"]
    await expect_nothing(exact)


async def test_overlapping_selectors_give_one_delivery(backend: Backend, names: Names) -> None:
    consumer = await backend.subscribe(
        volatile(names.sub("s"), names.mqtt("t"), names.mqtt("+"), names.mqtt("#"))
    )
    await publish(backend, names.topic("t"), "0")
    assert await received(consumer, 1) == [b"0"]
    await expect_nothing(consumer)


async def test_selectors_change_on_a_non_durable_consumer(backend: Backend, names: Names) -> None:
    consumer = await backend.subscribe(volatile(names.sub("s"), names.mqtt("a")))
    await consumer.add_selector(names.mqtt("b"))
    await publish(backend, names.topic("a"), "a0")
    await publish(backend, names.topic("b"), "b0")
    assert sorted(await received(consumer, 2)) == [b"a0", b"b0"]
    await consumer.remove_selector(names.mqtt("a"))
    await publish(backend, names.topic("a"), "a1")
    await publish(backend, names.topic("b"), "b1")
    assert await received(consumer, 1) == [b"b1"]
    await expect_nothing(consumer)


async def test_a_nack_gives_the_message_back_to_the_same_consumer(
    backend: Backend, names: Names
) -> None:
    consumer = await backend.subscribe(volatile(names.sub("s"), names.mqtt("t")))
    other = await backend.subscribe(volatile(names.sub("o"), names.mqtt("t")))
    await publish(backend, names.topic("t"), "0")
    [delivery] = await receive(consumer, 1)
    consumer.nack([delivery])
    [again] = await receive(consumer, 1)
    assert again.message.payload == b"0"
    assert again.message_id == delivery.message_id
    consumer.ack([again])
    await expect_nothing(consumer)
    assert await received(other, 1) == [b"0"]
    await expect_nothing(other)


async def test_a_wildcard_removed_by_one_consumer_stays_with_another(
    backend: Backend, names: Names
) -> None:
    leaving = await backend.subscribe(volatile(names.sub("l"), names.mqtt("+"), names.mqtt("x")))
    staying = await backend.subscribe(volatile(names.sub("s"), names.mqtt("+")))
    await publish(backend, names.topic("t"), "0")
    assert await received(leaving, 1) == [b"0"]
    assert await received(staying, 1) == [b"0"]
    await leaving.remove_selector(names.mqtt("+"))
    await publish(backend, names.topic("t"), "1")
    await publish(backend, names.topic("x"), "2")
    assert await received(staying, 2) == [b"1", b"2"]
    assert await received(leaving, 1) == [b"2"]
    await expect_nothing(leaving)
