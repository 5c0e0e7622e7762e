"""The broker's per-message shortcuts keep the semantics of the general path: QoS 0 taken by an
at-most-once consumer counts as acknowledged, and a first delivery is one shared object."""

from __future__ import annotations

from typing import Any

import pytest

from .support import msg, new_broker, payloads, subscribe, take_all, topic

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
