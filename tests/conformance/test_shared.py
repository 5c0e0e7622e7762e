"""Shared subscriptions (MQTT `$share/...`): members split the messages, and what one member
hands back (nack) or leaves unacknowledged when it goes is delivered again, counted."""

from __future__ import annotations

from mop.message import Message
from mop.processor.backend import Backend, Consumer, SubscriptionKind, SubscriptionSpec
from tests.conformance.harness import Names, collect, expect_nothing, payloads, receive


async def members(backend: Backend, names: Names, *ids: str) -> list[Consumer]:
    name = f"$share/g/{names.mqtt('t')}"
    return [
        await backend.subscribe(
            SubscriptionSpec(
                name=name,
                selectors=frozenset([names.mqtt("t")]),
                kind=SubscriptionKind.SHARED,
                member=names.sub(member),
            )
        )
        for member in ids
    ]


async def test_members_split_the_messages(backend: Backend, names: Names) -> None:
    one, two = await members(backend, names, "one", "two")
    sent = [f"m{n}".encode() for n in range(20)]
    for payload in sent:
        await backend.publish(names.topic("t"), Message(payload, qos=1))
    got_one, got_two = await collect([one, two], len(sent))
    assert got_one and got_two, "one member got every message"
    assert sorted(payloads(got_one) + payloads(got_two)) == sorted(sent)
    one.ack(got_one)
    two.ack(got_two)
    await expect_nothing(one)
    await expect_nothing(two)


async def test_a_nacked_message_is_delivered_again_counted(backend: Backend, names: Names) -> None:
    [one] = await members(backend, names, "one")
    await backend.publish(names.topic("t"), Message(b"hot potato", qos=1))
    [first] = await receive(one, 1)
    [two] = await members(backend, names, "two")
    one.nack([first])
    # To whichever member: the rule is "delivered again", not "to the other".
    got_one, got_two = await collect([one, two], 1)
    [again] = got_one + got_two
    assert (again.message.payload, again.message_id) == (b"hot potato", first.message_id)
    assert again.redelivery_count == 1


async def test_a_member_that_leaves_hands_its_unacknowledged_messages_to_the_other(
    backend: Backend, names: Names
) -> None:
    one, two = await members(backend, names, "one", "two")
    await backend.publish(names.topic("t"), Message(b"orphan", qos=1))
    got = await collect([one, two], 1)
    holder, other = (one, two) if got[0] else (two, one)
    [first] = got[0] or got[1]
    await holder.close()
    [again] = await receive(other, 1)
    assert (again.message.payload, again.message_id) == (b"orphan", first.message_id)
    assert again.redelivery_count == 1


async def test_a_member_that_joins_later_gets_what_another_hands_back(
    backend: Backend, names: Names
) -> None:
    # The messages belong to the group, not to the members there when they were published.
    [one] = await members(backend, names, "one")
    await backend.publish(names.topic("t"), Message(b"older than two", qos=1))
    [first] = await receive(one, 1)
    [two] = await members(backend, names, "two")
    await one.close()
    [again] = await receive(two, 1)
    assert (again.message.payload, again.message_id) == (b"older than two", first.message_id)
    assert again.redelivery_count == 1


async def test_a_group_with_every_member_offline_keeps_its_messages(
    backend: Backend, names: Names
) -> None:
    [one] = await members(backend, names, "one")
    await one.close()
    await backend.publish(names.topic("t"), Message(b"kept", qos=1))
    # Whoever comes back first (a member that was there, or a new one) gets it.
    [two] = await members(backend, names, "two")
    assert payloads(await receive(two, 1)) == [b"kept"]


async def test_the_group_goes_on_when_a_member_unsubscribes(backend: Backend, names: Names) -> None:
    one, two = await members(backend, names, "one", "two")
    await one.unsubscribe()
    sent = [f"m{n}".encode() for n in range(5)]
    for payload in sent:
        await backend.publish(names.topic("t"), Message(payload, qos=1))
    assert payloads(await receive(two, len(sent))) == sent
