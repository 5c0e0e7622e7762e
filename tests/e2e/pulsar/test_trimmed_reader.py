"""Readers on a topic whose messages are all trimmed (acknowledged by every subscription with
no retention, or past the retention policy's time), end to end with the real pulsar-client: as
with Apache Pulsar, nothing is announced as available, and a message published afterwards is
read. Retention never trims a backlog."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pulsar
import pytest

from mop.settings import RetentionSettings, StorageSettings
from mop.testing.node import RunningNode
from tests.e2e.pulsar_support import (
    TIMEOUT_MS,
    pulsar_client,
    pulsar_node,
    pulsar_settings,
    receive_all,
    topic_for,
)
from tests.e2e.storage_support import stored_messages

pytestmark = pytest.mark.e2e

TRIM_TIMEOUT = 15.0  # trimming runs every second; the machine may be busy


# Pulsar's own default: nothing is kept once acknowledged.
NO_RETENTION = RetentionSettings(time_seconds=0, size_bytes=0)


@contextmanager
def node_with(
    storage: StorageSettings,
    data_dir: Path | None = None,
    retention: RetentionSettings = NO_RETENTION,
) -> Iterator[RunningNode]:
    settings = dataclasses.replace(pulsar_settings(), storage=storage, retention=retention)
    if data_dir is not None:
        settings = dataclasses.replace(settings, data_dir=str(data_dir))
    with pulsar_node(settings) as node:
        yield node


def wait_until_trimmed(node: RunningNode, topic: str) -> None:
    deadline = time.monotonic() + TRIM_TIMEOUT
    while stored_messages(node, topic):
        assert time.monotonic() < deadline, f"{topic} was not trimmed in {TRIM_TIMEOUT}s"
        time.sleep(0.1)


def produce(client: pulsar.Client, topic: str, *payloads: bytes) -> None:
    producer = client.create_producer(topic, batching_enabled=False)
    for payload in payloads:
        producer.send(payload)
    producer.close()


def consume_and_acknowledge(consumer: pulsar.Consumer, count: int) -> None:
    for message in receive_all(consumer, count):
        consumer.acknowledge(message)
    consumer.close()


def assert_reads_only_what_comes_next(client: pulsar.Client, topic: str) -> None:
    """A reader from the earliest position has nothing to read, then reads a new message."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    try:
        assert not reader.has_message_available()
        with pytest.raises(pulsar.Timeout):
            reader.read_next(timeout_millis=300)
        produce(client, topic, b"after")
        assert reader.has_message_available()
        assert reader.read_next(timeout_millis=TIMEOUT_MS).data() == b"after"
        assert not reader.has_message_available()
    finally:
        reader.close()


def test_reader_on_a_topic_trimmed_after_acknowledgement(request: pytest.FixtureRequest) -> None:
    topic = topic_for(request.node.name)
    # No grace for new topics: trimming follows the acknowledgements at once.
    with node_with(StorageSettings(unsubscribed_grace=0)) as node, pulsar_client(node) as client:
        consumer = client.subscribe(topic, "acker")
        produce(client, topic, b"m0", b"m1", b"m2")
        consume_and_acknowledge(consumer, 3)
        wait_until_trimmed(node, topic)
        assert_reads_only_what_comes_next(client, topic)


def test_reader_on_a_topic_trimmed_by_retention_time(request: pytest.FixtureRequest) -> None:
    topic = topic_for(request.node.name)
    retention = RetentionSettings(time_seconds=2, size_bytes=-1, check_interval=0.5)
    storage = StorageSettings(unsubscribed_grace=0)
    with node_with(storage, retention=retention) as node, pulsar_client(node) as client:
        # No subscription: the history is read while the policy keeps it...
        produce(client, topic, b"m0", b"m1")
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        read = [reader.read_next(timeout_millis=TIMEOUT_MS).data() for _ in range(2)]
        assert read == [b"m0", b"m1"]
        reader.close()
        # ...and goes once it is older than the policy's time.
        wait_until_trimmed(node, topic)
        assert_reads_only_what_comes_next(client, topic)


def test_retention_never_trims_a_backlog(request: pytest.FixtureRequest) -> None:
    topic = topic_for(request.node.name)
    retention = RetentionSettings(time_seconds=1, size_bytes=1, check_interval=0.5)
    storage = StorageSettings(unsubscribed_grace=0)
    with node_with(storage, retention=retention) as node, pulsar_client(node) as client:
        holder = client.subscribe(topic, "holder")
        produce(client, topic, b"m0", b"m1")
        time.sleep(3)
        assert stored_messages(node, topic) == 2
        assert [m.data() for m in receive_all(holder, 2)] == [b"m0", b"m1"]
        holder.close()


def test_reader_on_a_trimmed_topic_after_a_restart(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    topic = topic_for(request.node.name)
    storage = StorageSettings(unsubscribed_grace=0)
    with node_with(storage, tmp_path) as node, pulsar_client(node) as client:
        consumer = client.subscribe(topic, "acker")
        produce(client, topic, b"m0", b"m1")
        consume_and_acknowledge(consumer, 2)
        wait_until_trimmed(node, topic)
    # The restarted broker knows the topic's last id but not that it was trimmed.
    with node_with(storage, tmp_path) as node, pulsar_client(node) as client:
        assert stored_messages(node, topic) == 0
        assert_reads_only_what_comes_next(client, topic)
