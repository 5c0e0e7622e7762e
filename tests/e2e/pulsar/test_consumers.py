"""Pulsar consumers end to end with the real pulsar-client: subscription types, permits,
acknowledgements (individual, cumulative, batch index), nacks and redelivery counts,
unsubscribe, and what survives a consumer's reconnection."""

from __future__ import annotations

import time

import pulsar
import pytest

from tests.e2e.pulsar_support import TIMEOUT_MS, expect_nothing, receive_all

pytestmark = pytest.mark.e2e


def send(client: pulsar.Client, topic: str, *payloads: bytes, **options: object) -> None:
    producer = client.create_producer(topic, **options)  # type: ignore[arg-type]
    for payload in payloads:
        producer.send(payload)
    producer.close()


def payloads(n: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def test_earliest_and_latest_initial_positions(client: pulsar.Client, topic: str) -> None:
    keeper = client.subscribe(topic, "keeper")  # keeps the messages stored
    send(client, topic, b"before")
    earliest = client.subscribe(topic, "e", initial_position=pulsar.InitialPosition.Earliest)
    latest = client.subscribe(topic, "l")
    send(client, topic, b"after")
    assert [m.data() for m in receive_all(earliest, 2)] == [b"before", b"after"]
    assert latest.receive(timeout_millis=TIMEOUT_MS).data() == b"after"
    expect_nothing(latest)
    keeper.close()


def test_a_second_exclusive_consumer_is_busy(client: pulsar.Client, topic: str) -> None:
    client.subscribe(topic, "x")
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "x")
    # The same subscription name on another topic is another subscription.
    client.subscribe(topic + "-other", "x")


def test_a_consumer_of_another_type_is_busy(client: pulsar.Client, topic: str) -> None:
    client.subscribe(topic, "typed", consumer_type=pulsar.ConsumerType.Shared)
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "typed", consumer_type=pulsar.ConsumerType.Failover)


def test_unacked_messages_come_back_to_the_next_consumer(client: pulsar.Client, topic: str) -> None:
    consumer = client.subscribe(topic, "s")
    send(client, topic, *payloads(3))
    first = receive_all(consumer, 3)
    consumer.acknowledge(first[0])
    consumer.close()
    again = client.subscribe(topic, "s")
    back = receive_all(again, 2)
    assert [m.data() for m in back] == [b"m1", b"m2"]
    assert [m.redelivery_count() for m in back] == [1, 1]
    for message in back:
        again.acknowledge(message)
    again.close()
    expect_nothing(client.subscribe(topic, "s"))


def test_cumulative_ack(client: pulsar.Client, topic: str) -> None:
    consumer = client.subscribe(topic, "s")
    send(client, topic, *payloads(5))
    received = receive_all(consumer, 5)
    consumer.acknowledge_cumulative(received[2])
    consumer.close()
    again = client.subscribe(topic, "s")
    assert [m.data() for m in receive_all(again, 2)] == [b"m3", b"m4"]
    expect_nothing(again)


def test_nack_redelivers_with_a_growing_count(client: pulsar.Client, topic: str) -> None:
    consumer = client.subscribe(
        topic,
        "s",
        consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=100,
    )
    send(client, topic, b"flaky")
    counts = []
    for _ in range(4):
        message = consumer.receive(timeout_millis=TIMEOUT_MS)
        counts.append(message.redelivery_count())
        consumer.negative_acknowledge(message)
    assert counts == [0, 1, 2, 3]


def test_redeliver_all_unacknowledged(client: pulsar.Client, topic: str) -> None:
    consumer = client.subscribe(topic, "s")
    send(client, topic, *payloads(2))
    receive_all(consumer, 2)
    consumer.redeliver_unacknowledged_messages()
    back = receive_all(consumer, 2)
    assert [m.data() for m in back] == [b"m0", b"m1"]
    assert [m.redelivery_count() for m in back] == [1, 1]


def test_flow_control_counts_messages(client: pulsar.Client, topic: str) -> None:
    # Two shared consumers with room for one message each: each gets one, the third waits.
    slow = client.subscribe(
        topic, "s", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=1
    )
    fast = client.subscribe(
        topic, "s", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=1
    )
    send(client, topic, *payloads(6))
    got = []
    for _ in range(5):
        message = fast.receive(timeout_millis=TIMEOUT_MS)
        fast.acknowledge(message)
        got.append(message.data())
    held = slow.receive(timeout_millis=TIMEOUT_MS)
    assert sorted([*got, held.data()]) == sorted(payloads(6))


def test_zero_queue_consumer_gets_one_message_per_receive(
    client: pulsar.Client, topic: str
) -> None:
    zero = client.subscribe(
        topic, "s", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=0
    )
    other = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    send(client, topic, *payloads(4))
    # The zero-queue consumer asked for nothing yet, so everything goes to the other one.
    taken = receive_all(other, 4)
    assert sorted(m.data() for m in taken) == payloads(4)
    for message in taken:
        other.acknowledge(message)
    other.close()
    send(client, topic, *payloads(3, "z"))
    # Each receive() asks for one message (FLOW 1) and gets exactly that one.
    assert [zero.receive().data() for _ in range(3)] == payloads(3, "z")


def test_shared_spreads_messages(client: pulsar.Client, topic: str) -> None:
    one = client.subscribe(
        topic, "s", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=10
    )
    two = client.subscribe(
        topic, "s", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=10
    )
    send(client, topic, *payloads(200))
    seen: list[bytes] = []
    per_consumer = {0: 0, 1: 0}
    deadline = time.monotonic() + 10
    while len(seen) < 200 and time.monotonic() < deadline:
        for index, consumer in enumerate((one, two)):
            try:
                message = consumer.receive(timeout_millis=50)
            except pulsar.Timeout:
                continue
            consumer.acknowledge(message)
            seen.append(message.data())
            per_consumer[index] += 1
    assert sorted(seen) == sorted(payloads(200))
    assert per_consumer[0] > 20 and per_consumer[1] > 20


def test_key_shared_keeps_each_key_on_one_consumer(client: pulsar.Client, topic: str) -> None:
    one = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.KeyShared)
    two = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.KeyShared)
    producer = client.create_producer(topic)
    for i in range(60):
        producer.send(f"{i}".encode(), partition_key=f"key-{i % 6}")
    owners: dict[str, set[int]] = {}
    count = 0
    for index, consumer in enumerate((one, two)):
        while True:
            try:
                message = consumer.receive(timeout_millis=500)
            except pulsar.Timeout:
                break
            owners.setdefault(message.partition_key(), set()).add(index)
            count += 1
    assert count == 60
    assert all(len(who) == 1 for who in owners.values()), owners


def test_failover_sends_everything_to_the_active_consumer(
    client: pulsar.Client, topic: str
) -> None:
    first = client.subscribe(
        topic, "s", consumer_type=pulsar.ConsumerType.Failover, consumer_name="a"
    )
    second = client.subscribe(
        topic, "s", consumer_type=pulsar.ConsumerType.Failover, consumer_name="b"
    )
    send(client, topic, *payloads(5))
    assert [m.data() for m in receive_all(first, 5)] == payloads(5)
    expect_nothing(second)
    first.close()  # unacknowledged: they go to the consumer that takes over
    assert [m.data() for m in receive_all(second, 5)] == payloads(5)


def test_batch_members_acked_apart_come_back_without_the_acked_ones(
    client: pulsar.Client, topic: str
) -> None:
    consumer = client.subscribe(topic, "s", batch_index_ack_enabled=True)
    producer = client.create_producer(
        topic,
        batching_enabled=True,
        batching_max_messages=10,
        batching_max_publish_delay_ms=1000,
    )
    for i in range(10):
        producer.send_async(f"b{i}".encode(), None)
    producer.flush()
    received = receive_all(consumer, 10)
    for message in received:
        if message.data() in (b"b0", b"b2"):
            consumer.acknowledge(message)
    time.sleep(0.3)  # acks are grouped and sent about every 100 ms
    consumer.close()
    again = client.subscribe(topic, "s", batch_index_ack_enabled=True)
    back = receive_all(again, 8)
    assert [m.data() for m in back] == [f"b{i}".encode() for i in range(10) if i not in (0, 2)]
    expect_nothing(again)


def test_a_partly_acked_batch_comes_back_whole_without_batch_index_acks(
    client: pulsar.Client, topic: str
) -> None:
    consumer = client.subscribe(topic, "s")
    producer = client.create_producer(
        topic, batching_enabled=True, batching_max_messages=4, batching_max_publish_delay_ms=1000
    )
    for i in range(4):
        producer.send_async(f"b{i}".encode(), None)
    producer.flush()
    received = receive_all(consumer, 4)
    consumer.acknowledge(received[0])
    consumer.close()
    again = client.subscribe(topic, "s")
    assert [m.data() for m in receive_all(again, 4)] == [f"b{i}".encode() for i in range(4)]


def test_unsubscribe_deletes_the_subscription(client: pulsar.Client, topic: str) -> None:
    consumer = client.subscribe(topic, "s")
    send(client, topic, b"left behind")
    consumer.unsubscribe()
    again = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Latest)
    send(client, topic, b"new")
    assert again.receive(timeout_millis=TIMEOUT_MS).data() == b"new"


def test_durable_subscription_keeps_collecting_while_no_consumer_is_attached(
    client: pulsar.Client, topic: str
) -> None:
    client.subscribe(topic, "durable").close()
    send(client, topic, *payloads(3))
    again = client.subscribe(topic, "durable")
    assert [m.data() for m in receive_all(again, 3)] == payloads(3)


def test_dead_letter_policy_moves_a_message_after_its_redeliveries(
    client: pulsar.Client, topic: str
) -> None:
    dlq = topic + "-dlq"
    dead = client.subscribe(dlq, "dead")
    consumer = client.subscribe(
        topic,
        "s",
        consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=100,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(
            max_redeliver_count=2, dead_letter_topic=dlq
        ),
    )
    send(client, topic, b"poison")
    for _ in range(3):
        consumer.negative_acknowledge(consumer.receive(timeout_millis=TIMEOUT_MS))
    assert dead.receive(timeout_millis=TIMEOUT_MS).data() == b"poison"
    expect_nothing(consumer)
