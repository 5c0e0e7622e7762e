"""mop's own Pulsar client (`mop.protocols.pulsar.driver`) against a mop node, with the real
pulsar-client on the other side as the reference: batches both ways, acknowledgements,
permits, seeks, refusals, and producers and consumers that carry on across a lost connection."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pulsar
import pytest
import trio

from mop.message import MessageId
from mop.protocols.pulsar.commands import InitialPosition, ProducerAccessMode, SubType
from mop.protocols.pulsar.driver import (
    ConsumerConfig,
    MessageTooLarge,
    ProducerConfig,
    PulsarClient,
    ServerRefused,
    create_producer,
    subscribe,
)
from mop.protocols.pulsar.errors import ServerError
from mop.testing.node import RunningNode
from tests.e2e.pulsar.driver_support import Inbox, open_driver
from tests.e2e.pulsar_support import receive_all, service_url

pytestmark = pytest.mark.e2e


@asynccontextmanager
async def driver(node: RunningNode, **options: float) -> AsyncIterator[PulsarClient]:
    async with open_driver(service_url(node), **options) as client:
        yield client


async def test_batches_go_both_ways_with_pulsar_client(
    node: RunningNode, client: pulsar.Client, topic: str
) -> None:
    reference = client.subscribe(topic, "reference")
    async with driver(node) as native:
        inbox = Inbox()
        await subscribe(native, topic, "native", inbox, ConsumerConfig())
        producer = await create_producer(native, topic)
        tickets = [
            await producer.send(
                f"m{i}".encode(),
                (("b", "2"), ("a", "1")),
                key="k" if i % 2 else None,
                event_time=1000 + i,
            )
            for i in range(50)
        ]
        ids = [await ticket.wait() for ticket in tickets if ticket is not None]
        assert ids[0].batch_index == 0 and ids[-1].batch_index >= 0
        assert len(set(ids)) == 50
        got = await inbox.wait_for(50)
        assert [item.payload for item in got] == [f"m{i}".encode() for i in range(50)]
        assert got[1].key == "k" and got[0].key is None
        assert got[3].properties == (("b", "2"), ("a", "1"))
        assert got[3].event_time == 1003
        assert [item.message_id for item in got] == ids
        # pulsar-client reads the driver's batches as its own.
        seen = receive_all(reference, 50)
        assert [m.data() for m in seen] == [f"m{i}".encode() for i in range(50)]
        assert seen[1].partition_key() == "k"
        assert seen[3].properties() == {"a": "1", "b": "2"}
        assert seen[3].event_timestamp() == 1003
        # ... and the driver reads pulsar-client's, batched or not.
        for batching in (True, False):
            sender = client.create_producer(topic, batching_enabled=batching)
            for i in range(3):
                sender.send_async(f"p{i}".encode(), None, properties={"x": str(i)})
            sender.flush()
            sender.close()
        got = await inbox.wait_for(56)
        assert [item.payload for item in got[50:]] == [b"p0", b"p1", b"p2"] * 2
        assert got[52].properties == (("x", "2"),)
        await producer.close()


async def test_acknowledged_messages_do_not_come_back(node: RunningNode, topic: str) -> None:
    async with driver(node) as native:
        producer = await create_producer(native, topic)
        inbox = Inbox()
        consumer = await subscribe(native, topic, "sub", inbox)
        for i in range(10):
            await producer.send(f"m{i}".encode(), ticket=False)
        await producer.close()
        got = await inbox.wait_for(10)
        # Every message but the last two of the batch: its entry stays unacknowledged.
        for item in got[:8]:
            consumer.ack(item.message_id)
        await consumer.close()
        again = Inbox()
        consumer = await subscribe(native, topic, "sub", again)
        redelivered = await again.wait_for(1)
        # The whole entry comes again (the broker tracks entries), its acked members skipped
        # when the broker sends batch-index ack sets, kept otherwise.
        assert {b"m8", b"m9"} <= set(again.payloads)
        for item in redelivered:
            consumer.ack(item.message_id)
        await consumer.close()
        third = Inbox()
        consumer = await subscribe(native, topic, "sub", third)
        await trio.sleep(0.3)
        assert third.items == []
        await consumer.close()


async def test_cumulative_ack_and_seek(node: RunningNode, topic: str) -> None:
    async with driver(node) as native:
        producer = await create_producer(native, topic, ProducerConfig(batching=False))
        inbox = Inbox()
        consumer = await subscribe(native, topic, "sub", inbox)
        for i in range(5):
            await producer.send(f"m{i}".encode(), ticket=False)
        got = await inbox.wait_for(5)
        consumer.ack_cumulative(got[2].message_id)
        await consumer.seek(MessageId(-1, -1))  # the earliest
        await inbox.wait_for(10)
        assert inbox.payloads[5:] == [f"m{i}".encode() for i in range(5)]
        await consumer.close()
        again = Inbox()
        consumer = await subscribe(native, topic, "sub", again)
        await again.wait_for(5)
        await consumer.close()
        await producer.close()


async def test_a_paused_consumer_gets_no_more_than_its_permits(
    node: RunningNode, topic: str
) -> None:
    async with driver(node) as native:
        producer = await create_producer(native, topic, ProducerConfig(batching=False))
        inbox = Inbox()
        consumer = await subscribe(native, topic, "sub", inbox, ConsumerConfig(receiver_queue=10))
        consumer.pause()
        for i in range(40):
            await producer.send(f"m{i}".encode(), ticket=False)
        await trio.sleep(0.5)
        assert 10 <= len(inbox.items) < 20
        consumer.resume()
        await inbox.wait_for(40)
        assert inbox.payloads == [f"m{i}".encode() for i in range(40)]
        await producer.close()


async def test_refusals_come_with_their_server_error(node: RunningNode, topic: str) -> None:
    async with driver(node) as native:
        await subscribe(native, topic, "only", Inbox(), ConsumerConfig(sub_type=SubType.Exclusive))
        with pytest.raises(ServerRefused) as refused:
            await subscribe(native, topic, "only", Inbox())
        assert refused.value.error is ServerError.ConsumerBusy
        config = ProducerConfig(access_mode=ProducerAccessMode.Exclusive)
        await create_producer(native, topic, config)
        with pytest.raises(ServerRefused) as fenced:
            await create_producer(native, topic, config)
        assert fenced.value.error is ServerError.ProducerFenced
        with pytest.raises(ServerRefused) as busy:
            await create_producer(native, topic)
        assert busy.value.error is ServerError.ProducerBusy


async def test_a_lost_connection_loses_nothing(node: RunningNode, topic: str) -> None:
    async with driver(node) as native:
        producer = await create_producer(native, topic)
        inbox = Inbox()
        consumer = await subscribe(native, topic, "sub", inbox)
        tickets = []
        for round_ in range(5):
            for i in range(20):
                ticket = await producer.send(f"{round_}-{i}".encode())
                assert ticket is not None
                tickets.append(ticket)
            # Drop the shared connection under the producer and the consumer.
            connection = await native.lookup(topic)
            connection.close()
        ids = [await ticket.wait() for ticket in tickets]
        assert len(set(ids)) == 100
        await inbox.wait_for(100, seconds=10)
        expected = {f"{r}-{i}".encode() for r in range(5) for i in range(20)}
        assert set(inbox.payloads) >= expected  # at least once: a resent batch may repeat
        for item in inbox.items:
            consumer.ack(item.message_id)
        await producer.close()


async def test_a_reader_resumes_after_what_it_was_handed(
    node: RunningNode, client: pulsar.Client, topic: str
) -> None:
    keeper = client.subscribe(topic, "keeper")  # keeps the messages for the reader
    async with driver(node) as native:
        producer = await create_producer(native, topic)
        inbox = Inbox()
        reader_config = ConsumerConfig(
            durable=False,
            auto_ack=True,
            initial_position=InitialPosition.Earliest,
            start_message_id=MessageId(-1, -1),
        )
        await subscribe(native, topic, "reader-1", inbox, reader_config)
        for i in range(30):
            await producer.send(f"m{i}".encode(), ticket=False)
        await inbox.wait_for(30)
        (await native.lookup(topic)).close()
        for i in range(30, 40):
            await producer.send(f"m{i}".encode(), ticket=False)
        await inbox.wait_for(40, seconds=10)
        await trio.sleep(0.2)
        assert inbox.payloads == [f"m{i}".encode() for i in range(40)]
        await producer.close()
    keeper.close()


async def test_messages_over_the_brokers_limit_are_refused_before_sending(
    node: RunningNode, topic: str
) -> None:
    """mop's broker takes 5 MiB: a larger message fails its ticket and is not sent (the
    broker would drop the connection); large ones that fit go in batches that fit."""
    async with driver(node) as native:
        producer = await create_producer(native, topic)
        inbox = Inbox()
        await subscribe(native, topic, "sub", inbox)
        big = await producer.send(b"x" * (6 << 20))
        fitting = [await producer.send(bytes([i]) * (2 << 20)) for i in range(4)]
        assert big is not None
        with pytest.raises(MessageTooLarge):
            await big.wait()
        for ticket in fitting:
            assert ticket is not None
            await ticket.wait()
        got = await inbox.wait_for(4, seconds=10)
        assert [item.payload[:1] for item in got] == [bytes([i]) for i in range(4)]
        await producer.close()
