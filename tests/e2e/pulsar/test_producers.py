"""Pulsar producers end to end with the real pulsar-client: names, sequence ids, receipts,
batches, properties, deduplication and access modes."""

from __future__ import annotations

import contextlib

import pulsar
import pytest

from mop.testing.node import RunningNode
from tests.e2e.pulsar_support import TIMEOUT_MS, ids, pulsar_client, receive_all

pytestmark = pytest.mark.e2e


def test_send_receipts_carry_increasing_stored_ids(client: pulsar.Client, topic: str) -> None:
    consumer = client.subscribe(topic, "s")
    producer = client.create_producer(topic)
    sent = [producer.send(f"m{i}".encode()) for i in range(5)]
    positions = [(m.ledger_id(), m.entry_id()) for m in sent]
    assert positions == sorted(positions) and len(set(positions)) == 5
    received = receive_all(consumer, 5)
    assert [m.data() for m in received] == [f"m{i}".encode() for i in range(5)]
    assert [(m.message_id().ledger_id(), m.message_id().entry_id()) for m in received] == positions


def test_broker_assigns_unique_producer_names(client: pulsar.Client, topic: str) -> None:
    first = client.create_producer(topic)
    second = client.create_producer(topic)
    assert first.producer_name().startswith("mop-")
    assert first.producer_name() != second.producer_name()
    assert first.last_sequence_id() == -1
    first.send(b"x")
    assert first.last_sequence_id() == 0


def test_properties_keys_times_and_producer_name_pass_through(
    client: pulsar.Client, topic: str
) -> None:
    consumer = client.subscribe(topic, "s")
    producer = client.create_producer(topic, producer_name="meta-producer")
    producer.send(
        b"payload \x00\xff",
        properties={"colour": "blue", "empty": ""},
        partition_key="k1",
        event_timestamp=1234,
    )
    producer.send(b"", properties={"kind": "empty"})
    first, second = receive_all(consumer, 2)
    assert first.data() == b"payload \x00\xff"
    assert first.properties() == {"colour": "blue", "empty": ""}
    assert first.partition_key() == "k1"
    assert first.event_timestamp() == 1234
    assert first.publish_timestamp() > 0
    assert first.producer_name() == "meta-producer"
    assert second.data() == b""
    assert second.properties() == {"kind": "empty"}


def test_a_batch_is_one_entry_with_its_messages(client: pulsar.Client, topic: str) -> None:
    consumer = client.subscribe(topic, "s")
    producer = client.create_producer(
        topic,
        batching_enabled=True,
        batching_max_messages=10,
        batching_max_publish_delay_ms=1000,
    )
    receipts: list[pulsar.MessageId] = []
    for i in range(10):
        producer.send_async(
            f"b{i}".encode(), lambda _res, mid: receipts.append(mid), properties={"i": str(i)}
        )
    producer.flush()
    received = receive_all(consumer, 10)
    assert [m.data() for m in received] == [f"b{i}".encode() for i in range(10)]
    assert [m.properties() for m in received] == [{"i": str(i)} for i in range(10)]
    entries = {(ledger, entry) for ledger, entry, _ in ids(received)}
    assert len(entries) == 1
    assert [index for _, _, index in ids(received)] == list(range(10))
    assert sorted(r.batch_index() for r in receipts) == list(range(10))
    for message in received:
        consumer.acknowledge(message)


def test_a_named_producer_continues_its_sequence_and_duplicates_are_dropped(
    client: pulsar.Client, topic: str
) -> None:
    consumer = client.subscribe(topic, "s")
    producer = client.create_producer(topic, producer_name="dedup")
    for i in range(3):
        producer.send(f"m{i}".encode())
    producer.close()
    again = client.create_producer(topic, producer_name="dedup")
    assert again.last_sequence_id() == 2
    again.send(b"m3")  # continues at 3
    # A resent sequence id (what a producer does after losing a receipt) is not stored twice.
    dup = again.send(b"m1 again", sequence_id=1)
    assert (dup.ledger_id(), dup.entry_id()) == (-1, -1)
    received = receive_all(consumer, 4)
    assert [m.data() for m in received] == [b"m0", b"m1", b"m2", b"m3"]
    with pytest.raises(pulsar.Timeout):
        consumer.receive(timeout_millis=300)


def test_a_name_in_use_is_refused(client: pulsar.Client, topic: str) -> None:
    client.create_producer(topic, producer_name="taken")
    with pytest.raises(pulsar.ProducerBusy):
        client.create_producer(topic, producer_name="taken")


def test_exclusive_access_refuses_other_producers(client: pulsar.Client, topic: str) -> None:
    exclusive = client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    with pytest.raises(pulsar.ProducerBusy):
        client.create_producer(topic)
    # Pulsar fences a second Exclusive producer out (ProducerFencedException), it is not "busy".
    with pytest.raises(pulsar.ProducerFenced):
        client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    exclusive.send(b"still mine")
    exclusive.close()
    client.create_producer(topic).send(b"free again")


def test_the_asyncio_client_is_fenced_out_of_an_exclusive_topic(
    node: RunningNode, topic: str
) -> None:
    import asyncio

    from pulsar.asyncio import Client as AsyncClient
    from pulsar.asyncio import PulsarException

    from tests.e2e.pulsar_support import service_url

    async def scenario() -> pulsar.Result | None:
        client = AsyncClient(service_url(node))
        try:
            mode = pulsar.ProducerAccessMode.Exclusive
            holder = await client.create_producer(topic, access_mode=mode)
            try:
                await client.create_producer(topic, access_mode=mode)
            except PulsarException as exc:
                await holder.close()
                return exc.error()
            return None
        finally:
            await client.close()

    assert asyncio.run(scenario()) == pulsar.Result.ProducerFenced


def test_exclusive_is_refused_while_shared_producers_exist(
    client: pulsar.Client, topic: str
) -> None:
    client.create_producer(topic)
    with pytest.raises(pulsar.ProducerFenced):
        client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)


def test_fencing_takes_over_and_the_old_producer_is_fenced(
    node: RunningNode, client: pulsar.Client, topic: str
) -> None:
    consumer = client.subscribe(topic, "s")
    with pulsar_client(node) as other:
        old = other.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
        old.send(b"old")
        new = client.create_producer(
            topic, access_mode=pulsar.ProducerAccessMode.ExclusiveWithFencing
        )
        new.send(b"new")
        # The old producer learns it on its reconnection: its send fails with ProducerFenced,
        # or, when the client has already taken the fence in by then, with AlreadyClosed.
        with pytest.raises((pulsar.ProducerFenced, pulsar.AlreadyClosed)):
            for _ in range(50):
                old.send(b"too late")
        # Closing a fenced producer fails the same two ways; done here, so that the client's
        # own close (which reports the first failure of the producers it still has) does not.
        with contextlib.suppress(pulsar.ProducerFenced, pulsar.AlreadyClosed):
            old.close()
        assert [m.data() for m in receive_all(consumer, 2)] == [b"old", b"new"]


def test_wait_for_exclusive_gets_the_topic_when_the_holder_leaves(
    node: RunningNode, client: pulsar.Client, topic: str
) -> None:
    import threading

    holder = client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    got: list[pulsar.Producer] = []

    def wait() -> None:
        with pulsar_client(node) as other:
            producer = other.create_producer(
                topic, access_mode=pulsar.ProducerAccessMode.WaitForExclusive
            )
            producer.send(b"finally")
            got.append(producer)
            producer.close()

    waiter = threading.Thread(target=wait)
    waiter.start()
    waiter.join(0.5)
    assert not got, "the waiting producer was let in while the holder was there"
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    holder.close()
    waiter.join(10)
    assert got
    assert consumer.receive(timeout_millis=TIMEOUT_MS).data() == b"finally"


def test_chunked_messages_pass_through(client: pulsar.Client, topic: str) -> None:
    consumer = client.subscribe(topic, "s")
    producer = client.create_producer(topic, chunking_enabled=True)
    data = bytes(range(256)) * (6 * 1024 * 1024 // 256)  # above the 5 MiB message limit
    producer.send(data)
    message = consumer.receive(timeout_millis=10 * TIMEOUT_MS)
    assert message.data() == data
    consumer.acknowledge(message)


def test_messages_over_the_advertised_limit_fail_in_the_client(
    client: pulsar.Client, topic: str
) -> None:
    producer = client.create_producer(topic)
    with pytest.raises(pulsar.MessageTooBig):
        producer.send(b"x" * (6 * 1024 * 1024))
    producer.send(b"small")  # the producer and its connection are fine


@pytest.mark.parametrize("compression", [pulsar.CompressionType.LZ4, pulsar.CompressionType.ZLib])
def test_compressed_batches_pass_through(
    client: pulsar.Client, topic: str, compression: pulsar.CompressionType
) -> None:
    consumer = client.subscribe(topic, "s")
    producer = client.create_producer(
        topic,
        compression_type=compression,
        batching_enabled=True,
        batching_max_messages=10,
        batching_max_publish_delay_ms=1000,
    )
    for i in range(10):
        producer.send_async(f"c{i}".encode() * 50, None)
    producer.flush()
    received = receive_all(consumer, 10)
    assert [m.data() for m in received] == [f"c{i}".encode() * 50 for i in range(10)]
    for message in received:
        consumer.acknowledge(message)


def test_schema_producers_and_consumers(client: pulsar.Client, topic: str) -> None:
    from pulsar.schema import StringSchema

    consumer = client.subscribe(topic, "s", schema=StringSchema())
    producer = client.create_producer(topic, schema=StringSchema())
    producer.send("text")
    assert consumer.receive(timeout_millis=TIMEOUT_MS).value() == "text"
