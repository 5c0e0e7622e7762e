"""Pulsar readers, seek, last message ids, regex subscriptions, non-persistent topics and
delayed delivery, end to end with the real pulsar-client. No subscription holds the topics:
the default retention policy keeps their history for the readers."""

from __future__ import annotations

import time

import pulsar
import pytest

from tests.e2e.pulsar_support import TIMEOUT_MS, expect_nothing, receive_all, topic_for

pytestmark = pytest.mark.e2e


def produce(
    client: pulsar.Client, topic: str, count: int, **options: object
) -> list[pulsar.MessageId]:
    producer = client.create_producer(topic, **options)  # type: ignore[arg-type]
    sent = [producer.send(f"m{i}".encode()) for i in range(count)]
    producer.close()
    return sent


def read_all(reader: pulsar.Reader) -> list[bytes]:
    out = []
    while reader.has_message_available():
        out.append(reader.read_next(timeout_millis=TIMEOUT_MS).data())
    return out


def test_reader_from_earliest(client: pulsar.Client, topic: str) -> None:
    produce(client, topic, 3)
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert read_all(reader) == [b"m0", b"m1", b"m2"]
    assert not reader.has_message_available()


def test_reader_from_latest_sees_only_new_messages(client: pulsar.Client, topic: str) -> None:
    produce(client, topic, 2)
    reader = client.create_reader(topic, pulsar.MessageId.latest)
    assert not reader.has_message_available()
    produce(client, topic, 1)
    assert reader.has_message_available()
    assert reader.read_next(timeout_millis=TIMEOUT_MS).data() == b"m0"
    assert not reader.has_message_available()


def test_reader_on_an_empty_topic_has_nothing(client: pulsar.Client, topic: str) -> None:
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert not reader.has_message_available()


def test_reader_from_a_message_id(client: pulsar.Client, topic: str) -> None:
    sent = produce(client, topic, 5)
    after = client.create_reader(topic, sent[2])
    assert read_all(after) == [b"m3", b"m4"]
    inclusive = client.create_reader(topic, sent[2], start_message_id_inclusive=True)
    assert read_all(inclusive) == [b"m2", b"m3", b"m4"]


def test_reader_from_a_batch_message_id(client: pulsar.Client, topic: str) -> None:
    producer = client.create_producer(
        topic, batching_enabled=True, batching_max_messages=5, batching_max_publish_delay_ms=1000
    )
    receipts: dict[bytes, pulsar.MessageId] = {}
    for i in range(5):
        payload = f"b{i}".encode()
        producer.send_async(payload, lambda _r, mid, p=payload: receipts.__setitem__(p, mid))
    producer.flush()
    reader = client.create_reader(topic, receipts[b"b2"])
    assert read_all(reader) == [b"b3", b"b4"]


def test_last_message_id(client: pulsar.Client, topic: str) -> None:
    sent = produce(client, topic, 3)
    consumer = client.subscribe(topic, "s")
    last = consumer.get_last_message_id()
    assert (last.ledger_id(), last.entry_id()) == (sent[-1].ledger_id(), sent[-1].entry_id())


def test_seek_a_subscription_to_a_message_id(client: pulsar.Client, topic: str) -> None:
    sent = produce(client, topic, 5)
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    for message in receive_all(consumer, 5):
        consumer.acknowledge(message)
    consumer.seek(sent[1])
    # The broker starts at the id itself; the client skips it unless asked to include it.
    assert [m.data() for m in receive_all(consumer, 3)] == [b"m2", b"m3", b"m4"]
    expect_nothing(consumer)
    inclusive = client.subscribe(
        topic,
        "inclusive",
        initial_position=pulsar.InitialPosition.Earliest,
        start_message_id_inclusive=True,
    )
    receive_all(inclusive, 5)
    inclusive.seek(sent[3])
    assert [m.data() for m in receive_all(inclusive, 2)] == [b"m3", b"m4"]


def test_seek_a_subscription_to_earliest_and_latest(client: pulsar.Client, topic: str) -> None:
    produce(client, topic, 3)
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    receive_all(consumer, 3)
    consumer.seek(pulsar.MessageId.earliest)
    assert [m.data() for m in receive_all(consumer, 3)] == [b"m0", b"m1", b"m2"]
    consumer.seek(pulsar.MessageId.latest)
    expect_nothing(consumer)
    produce(client, topic, 1)
    assert consumer.receive(timeout_millis=TIMEOUT_MS).data() == b"m0"


def test_seek_by_publish_time(client: pulsar.Client, topic: str) -> None:
    produce(client, topic, 3)
    time.sleep(0.05)
    middle = int(time.time() * 1000)
    time.sleep(0.05)
    produce(client, topic, 2, producer_name="later")
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    receive_all(consumer, 5)
    consumer.seek(middle)
    back = receive_all(consumer, 2)
    assert [m.producer_name() for m in back] == ["later", "later"]
    expect_nothing(consumer)


def test_seek_a_reader(client: pulsar.Client, topic: str) -> None:
    sent = produce(client, topic, 4)
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert read_all(reader) == [b"m0", b"m1", b"m2", b"m3"]
    reader.seek(sent[1])
    assert read_all(reader) == [b"m2", b"m3"]


def test_seek_a_reader_by_publish_time(client: pulsar.Client, topic: str) -> None:
    produce(client, topic, 3)
    time.sleep(0.05)
    middle = int(time.time() * 1000)
    time.sleep(0.05)
    produce(client, topic, 2, producer_name="later")
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert len(read_all(reader)) == 5
    # The client subscribes again without a start id: the broker keeps where the seek went.
    reader.seek(middle)
    assert read_all(reader) == [b"m0", b"m1"]


def test_regex_subscription_finds_the_topics_of_the_namespace(
    client: pulsar.Client, request: pytest.FixtureRequest
) -> None:
    base = topic_for(request.node.name)
    produce(client, base + "-a", 1)
    produce(client, base + "-b", 1)
    produce(client, base.replace("/default/", "/elsewhere/") + "-a", 1)
    import re

    consumer = client.subscribe(re.compile(re.escape(base) + "-[ab]"), "s")
    producer_a = client.create_producer(base + "-a")
    producer_b = client.create_producer(base + "-b")
    producer_a.send(b"to a")
    producer_b.send(b"to b")
    got = sorted(m.data() for m in receive_all(consumer, 2))
    assert got == [b"to a", b"to b"]


def test_unknown_namespaces_and_tenants_are_not_found(client: pulsar.Client) -> None:
    with pytest.raises(pulsar.TopicNotFound):
        client.create_producer("persistent://nobody/default/x")
    with pytest.raises(pulsar.TopicNotFound):
        client.subscribe("persistent://nobody/default/x", "s")
    # Namespaces of the node's tenant need no creation.
    client.create_producer("persistent://public/other/x").send(b"ok")


def test_non_persistent_topic_reaches_only_attached_consumers(
    client: pulsar.Client, request: pytest.FixtureRequest
) -> None:
    topic = topic_for(request.node.name, domain="non-persistent")
    producer = client.create_producer(topic)
    producer.send(b"nobody listens")
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    producer.send(b"heard")
    assert consumer.receive(timeout_millis=TIMEOUT_MS).data() == b"heard"
    expect_nothing(consumer)


def test_delayed_delivery_on_shared_subscriptions(client: pulsar.Client, topic: str) -> None:
    import datetime

    shared = client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared)
    exclusive = client.subscribe(topic, "exclusive")
    producer = client.create_producer(topic)
    sent_at = time.monotonic()
    producer.send(b"later", deliver_after=datetime.timedelta(milliseconds=700))
    producer.send(b"now")
    # Exclusive subscriptions ignore the delay, as in Pulsar.
    assert [m.data() for m in receive_all(exclusive, 2)] == [b"later", b"now"]
    assert shared.receive(timeout_millis=TIMEOUT_MS).data() == b"now"
    late = shared.receive(timeout_millis=TIMEOUT_MS)
    assert late.data() == b"later"
    assert time.monotonic() - sent_at >= 0.6
