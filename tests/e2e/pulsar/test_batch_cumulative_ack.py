"""A cumulative acknowledgement of a message inside a producer batch (one stored entry), end to
end with the real pulsar-client: no message after the acknowledged one is lost.

What the client sends decides what can be kept. Without batch-index acknowledgement the C++
client acknowledges up to the entry before the batch, so, as with Apache Pulsar, the whole
batch comes again (at least once). With it, the client sends the entry with an ack set of the
messages still owed, and only those come again.
"""

from __future__ import annotations

import pulsar
import pytest

from tests.e2e.pulsar_support import TIMEOUT_MS, expect_nothing, ids, receive_all

pytestmark = pytest.mark.e2e

COUNT = 10
ACKED = 4  # the first ACKED messages are received; the last of them is acknowledged cumulatively
PAYLOADS = [f"m{i}".encode() for i in range(COUNT)]


def send_one_batch(client: pulsar.Client, topic: str) -> None:
    """PAYLOADS as one batch: the producer holds them until flushed (its delay is long)."""
    producer = client.create_producer(
        topic,
        batching_enabled=True,
        batching_max_messages=COUNT,
        batching_max_publish_delay_ms=60_000,
    )
    for payload in PAYLOADS:
        producer.send_async(payload, None)
    producer.flush()
    producer.close()


def receive_first(consumer: pulsar.Consumer) -> list[pulsar.Message]:
    received = receive_all(consumer, ACKED)
    assert [m.data() for m in received] == PAYLOADS[:ACKED]
    entries = {(ledger, entry) for ledger, entry, _ in ids(received)}
    assert len(entries) == 1, "the messages were not stored as one batch entry"
    return received


def receive_rest(consumer: pulsar.Consumer) -> list[bytes]:
    """Everything the consumer gets until it stays quiet (a bounded number of messages)."""
    out = []
    for _ in range(2 * COUNT):
        try:
            out.append(consumer.receive(timeout_millis=1500).data())
        except pulsar.Timeout:
            break
    return out


def ack_and_resubscribe(
    client: pulsar.Client,
    topic: str,
    consumer: pulsar.Consumer,
    last: pulsar.Message,
    batch_index_ack: bool,
) -> list[bytes]:
    consumer.acknowledge_cumulative(last)
    consumer.close()  # flushes the grouped acknowledgement first
    again = client.subscribe(topic, "s", batch_index_ack_enabled=batch_index_ack)
    try:
        return receive_rest(again)
    finally:
        again.close()


def test_without_batch_index_ack_the_whole_batch_comes_again(
    client: pulsar.Client, topic: str
) -> None:
    consumer = client.subscribe(topic, "s")
    send_one_batch(client, topic)
    received = receive_first(consumer)
    again = ack_and_resubscribe(client, topic, consumer, received[-1], batch_index_ack=False)
    assert again == PAYLOADS


def test_with_batch_index_ack_only_the_rest_of_the_batch_comes_again(
    client: pulsar.Client, topic: str
) -> None:
    consumer = client.subscribe(topic, "s", batch_index_ack_enabled=True)
    send_one_batch(client, topic)
    received = receive_first(consumer)
    again = ack_and_resubscribe(client, topic, consumer, received[-1], batch_index_ack=True)
    assert again == PAYLOADS[ACKED:]


def test_an_ack_while_the_batch_is_on_its_way_back_keeps_the_rest(
    client: pulsar.Client, topic: str
) -> None:
    # The receiver queue holds exactly the batch, so after the redelivery request the broker
    # has no permits to send it again: the acknowledgement finds the entry back in the backlog.
    consumer = client.subscribe(topic, "s", batch_index_ack_enabled=True, receiver_queue_size=COUNT)
    send_one_batch(client, topic)
    received = receive_first(consumer)
    consumer.redeliver_unacknowledged_messages()
    again = ack_and_resubscribe(client, topic, consumer, received[-1], batch_index_ack=True)
    assert again == PAYLOADS[ACKED:]


def test_a_later_message_after_the_batch_is_delivered_once(
    client: pulsar.Client, topic: str
) -> None:
    consumer = client.subscribe(topic, "s", batch_index_ack_enabled=True)
    send_one_batch(client, topic)
    receive_first(consumer)
    rest = receive_all(consumer, COUNT - ACKED)
    consumer.acknowledge_cumulative(rest[-1])  # the whole batch
    consumer.close()
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"later")
    producer.close()
    again = client.subscribe(topic, "s", batch_index_ack_enabled=True)
    assert again.receive(timeout_millis=TIMEOUT_MS).data() == b"later"
    expect_nothing(again)
