"""mop's own Pulsar client against a mop node through a relay that injects faults (frames
dropped, delayed, held back, connections cut): what the client promises still holds. Every
acknowledged message reaches consumers, none is stored or acknowledged twice, and an
operation that gets no answer fails with a DriverError and leaves the client usable."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator

import pytest
import trio

from mop.message import MessageId
from mop.protocols.pulsar.commands import CommandType, InitialPosition, ProducerAccessMode
from mop.protocols.pulsar.driver import (
    ConsumerConfig,
    ProducerConfig,
    PulsarClient,
    Ticket,
    Unavailable,
    create_producer,
    subscribe,
)
from mop.testing.node import RunningNode
from mop.testing.pulsar_relay import TO_BROKER, TO_CLIENT, PulsarRelay, open_relay
from tests.e2e.pulsar.driver_support import Inbox, open_driver
from tests.e2e.pulsar_support import pulsar_port

pytestmark = pytest.mark.e2e

# Every test is over well within this (seconds).
DEADLINE = 20


@pytest.fixture
async def relay(node: RunningNode) -> AsyncIterator[PulsarRelay]:
    """A relay in front of the node that every connection of the client passes (lookups
    answer with the relay's address)."""
    async with open_relay("127.0.0.1", pulsar_port(node), advertise_self=True) as running:
        yield running


async def everything_stored(client: PulsarClient, topic: str, count: int) -> Counter[bytes]:
    """How many times each payload is stored in `topic` (read from the start; expects
    `count` messages and then checks that no more come)."""
    inbox = Inbox()
    reader = await subscribe(
        client,
        topic,
        "check",
        inbox,
        ConsumerConfig(
            durable=False,
            auto_ack=True,
            initial_position=InitialPosition.Earliest,
            start_message_id=MessageId(-1, -1),
        ),
    )
    await inbox.wait_for(count)
    await trio.sleep(0.3)
    await reader.close()
    return Counter(inbox.payloads)


async def outcomes(tickets: list[Ticket]) -> list[MessageId | Exception]:
    results: list[MessageId | Exception] = []
    for ticket in tickets:
        try:
            results.append(await ticket.wait())
        except Unavailable as exc:
            results.append(exc)
    return results


async def test_a_receipt_that_never_comes_fails_the_send_after_its_timeout(
    node: RunningNode, relay: PulsarRelay, topic: str
) -> None:
    """The message is stored, but the producer cannot know: its ticket fails (the contract
    of the send timeout), and the client goes on."""
    with trio.fail_after(DEADLINE):
        async with open_driver(relay.service_url) as client:
            config = ProducerConfig(batching=False, send_timeout=1.0)
            producer = await create_producer(client, topic, config)
            dropped = relay.drop(CommandType.SEND_RECEIPT, to=TO_CLIENT)
            ticket = await producer.send(b"m0")
            assert ticket is not None
            with pytest.raises(Unavailable, match="send timeout"):
                await ticket.wait()
            assert dropped.hits == 1
            later = await producer.send(b"m1")
            assert later is not None
            await later.wait()
            assert await everything_stored(client, topic, 2) == {b"m0": 1, b"m1": 1}
            await producer.close()


async def test_a_receipt_lost_before_a_later_one_is_sent_again_not_failed(
    node: RunningNode, relay: PulsarRelay, topic: str
) -> None:
    """A receipt for a later message while an earlier one has none: the producer's view of
    the connection is broken, so it reconnects and sends again what has no receipt; the
    broker drops what it had already (by sequence id), and each ticket completes once."""
    with trio.fail_after(DEADLINE):
        async with open_driver(relay.service_url) as client:
            producer = await create_producer(client, topic, ProducerConfig(batching=False))
            dropped = relay.drop(CommandType.SEND_RECEIPT, to=TO_CLIENT)
            first = await producer.send(b"m0")
            await dropped.triggered.wait()
            second = await producer.send(b"m1")
            assert first is not None and second is not None
            results = await outcomes([first, second])
            assert not [r for r in results if isinstance(r, Exception)], results
            assert relay.connections == 2  # the one broken by the lost receipt, and its successor
            assert await everything_stored(client, topic, 2) == {b"m0": 1, b"m1": 1}
            await producer.close()


async def test_a_delayed_flow_only_delays_delivery(
    node: RunningNode, relay: PulsarRelay, topic: str
) -> None:
    with trio.fail_after(DEADLINE):
        async with open_driver(relay.service_url) as client:
            producer = await create_producer(client, topic)
            inbox = Inbox(ack=True)
            relay.delay(1.0, CommandType.FLOW, to=TO_BROKER, times=1)
            await subscribe(client, topic, "sub", inbox, ConsumerConfig(receiver_queue=10))
            for i in range(30):
                await producer.send(f"m{i}".encode(), ticket=False)
            await trio.sleep(0.5)
            assert inbox.items == []  # no permits reached the broker yet
            await inbox.wait_for(30)
            assert inbox.payloads == [f"m{i}".encode() for i in range(30)]
            await producer.close()


async def test_a_message_lost_on_the_way_comes_again_when_asked_for(
    node: RunningNode, relay: PulsarRelay, topic: str
) -> None:
    """The broker keeps what was not acknowledged: a redelivery request brings it back, and
    the permits of the lost message do not stop the messages after it."""
    with trio.fail_after(DEADLINE):
        async with open_driver(relay.service_url) as client:
            producer = await create_producer(client, topic, ProducerConfig(batching=False))
            inbox = Inbox(ack=True)
            consumer = await subscribe(
                client, topic, "sub", inbox, ConsumerConfig(receiver_queue=4)
            )
            dropped = relay.drop(CommandType.MESSAGE, to=TO_CLIENT, skip=2)
            for i in range(20):
                await producer.send(f"m{i}".encode(), ticket=False)
            await inbox.wait_for(19)
            assert dropped.hits == 1 and b"m2" not in inbox.payloads
            consumer.redeliver()
            await inbox.wait_for(20)
            assert sorted(inbox.payloads) == sorted(f"m{i}".encode() for i in range(20))
            await producer.close()


async def test_acknowledged_sends_survive_a_cut_connection(
    node: RunningNode, relay: PulsarRelay, topic: str
) -> None:
    """The connection is cut after the broker stored a batch and before its receipt came
    back: every message the producer was told is stored reaches the consumer, and none is
    stored twice."""
    with trio.fail_after(DEADLINE):
        async with open_driver(relay.service_url) as client:
            producer = await create_producer(client, topic, ProducerConfig(batch_max_messages=10))
            inbox = Inbox(ack=True)
            await subscribe(client, topic, "sub", inbox)
            cut = relay.cut(CommandType.SEND_RECEIPT, to=TO_CLIENT, skip=3, forward=False)
            tickets = []
            for i in range(200):
                ticket = await producer.send(f"m{i}".encode())
                assert ticket is not None
                tickets.append(ticket)
                if i % 10 == 9:
                    await trio.sleep(0.01)  # batches of their own, some before the cut
            results = await outcomes(tickets)
            assert cut.hits == 1 and relay.connections >= 2
            acked = {f"m{i}".encode() for i, r in enumerate(results) if isinstance(r, MessageId)}
            assert len(acked) == 200, [r for r in results if isinstance(r, Exception)][:3]
            await inbox.wait_for(200, seconds=10)
            assert set(inbox.payloads) >= acked
            stored = await everything_stored(client, topic, 200)
            assert set(stored) == acked and set(stored.values()) == {1}
            await producer.close()


async def test_a_late_lookup_answer_is_a_clear_error_and_the_next_lookup_works(
    node: RunningNode, relay: PulsarRelay, topic: str
) -> None:
    with trio.fail_after(DEADLINE):
        async with open_driver(relay.service_url, operation_timeout=1.0) as client:
            relay.delay(1.5, CommandType.LOOKUP_RESPONSE, to=TO_CLIENT, times=1)
            with pytest.raises(Unavailable, match=r"operation timeout|no answer"):
                await create_producer(client, topic)
            await trio.sleep(1.0)  # the late answer (and all behind it) went by, ignored
            producer = await create_producer(client, topic)
            ticket = await producer.send(b"after")
            assert ticket is not None
            await ticket.wait()
            await producer.close()


async def test_a_late_producer_success_leaves_no_producer_behind(
    node: RunningNode, relay: PulsarRelay, topic: str
) -> None:
    """The producer the broker registered after the client gave up is closed again: an
    exclusive producer can be created right after."""
    exclusive = ProducerConfig(access_mode=ProducerAccessMode.Exclusive)
    with trio.fail_after(DEADLINE):
        async with open_driver(relay.service_url, operation_timeout=1.0) as client:
            late = relay.delay(1.5, CommandType.PRODUCER_SUCCESS, to=TO_CLIENT, times=1)
            with pytest.raises(Unavailable):
                await create_producer(client, topic, exclusive)
            assert late.hits == 1
            await trio.sleep(1.0)  # the late answer went by, ignored
            producer = await create_producer(client, topic, exclusive)
            ticket = await producer.send(b"after")
            assert ticket is not None
            await ticket.wait()
            await producer.close()


async def test_a_stalled_connection_is_given_up_and_sends_go_through_another(
    node: RunningNode, relay: PulsarRelay, topic: str
) -> None:
    """The broker's side goes silent (the connection stays open): the keepalive gives the
    connection up, the producer and consumer move to a new one, nothing is lost."""
    with trio.fail_after(DEADLINE):
        async with open_driver(relay.service_url, keepalive=0.5) as client:
            producer = await create_producer(client, topic, ProducerConfig(batching=False))
            inbox = Inbox(ack=True)
            await subscribe(client, topic, "sub", inbox)
            stall = relay.stall(to=TO_CLIENT)
            ticket = await producer.send(b"m0")
            assert ticket is not None
            await ticket.wait()
            assert stall.hits == 1 and relay.connections == 2
            await inbox.wait_for(1)
            assert inbox.payloads == [b"m0"]
            stall.release()
            await producer.close()
