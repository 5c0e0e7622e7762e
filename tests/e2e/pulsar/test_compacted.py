"""Compacted topics of the system namespace `public/__mop` with the real pulsar-client: readers
see the latest value of every live key, then later writes; tombstones delete keys; batches are
compacted per message; the state survives a restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pulsar
import pytest

from mop.message import TOMBSTONE_PROPERTY
from tests.e2e.pulsar_support import (
    TIMEOUT_MS,
    expect_nothing,
    pulsar_client,
    pulsar_node,
    pulsar_settings,
)

pytestmark = pytest.mark.e2e

TOMBSTONE = {TOMBSTONE_PROPERTY: "1"}


def table_topic(name: str) -> str:
    return f"persistent://public/__mop/{name}"


def write(producer: pulsar.Producer, key: str, value: str | None) -> None:
    """Set `key` to `value`, or delete it (None)."""
    if value is None:
        producer.send(b"", partition_key=key, properties=TOMBSTONE)
    else:
        producer.send(value.encode(), partition_key=key)


def read_table(reader: Any) -> list[tuple[str, str]]:
    """What a reader gets until the broker says it has nothing more, as (key, value) pairs."""
    seen = []
    for _ in range(1000):
        if not reader.has_message_available():
            return seen
        message = reader.read_next(timeout_millis=TIMEOUT_MS)
        seen.append((message.partition_key(), message.data().decode()))
    raise AssertionError("the reader never ran dry")


@pytest.mark.parametrize("read_compacted", [True, False])
def test_a_reader_from_the_earliest_sees_the_latest_value_of_every_live_key(
    client: pulsar.Client, read_compacted: bool
) -> None:
    topic = table_topic(f"latest-{read_compacted}")
    producer = client.create_producer(topic, batching_enabled=False)
    for key, value in (("a", "1"), ("b", "1"), ("a", "2"), ("c", "1"), ("b", None), ("c", "2")):
        write(producer, key, value)
    reader = client.create_reader(
        topic, pulsar.MessageId.earliest, is_read_compacted=read_compacted
    )
    assert read_table(reader) == [("a", "2"), ("c", "2")]
    # Then later writes, deletions included, as they come.
    write(producer, "d", "1")
    write(producer, "a", None)
    later = [reader.read_next(timeout_millis=TIMEOUT_MS) for _ in range(2)]
    assert [(m.partition_key(), m.data(), m.properties()) for m in later] == [
        ("d", b"1", {}),
        ("a", b"", TOMBSTONE),
    ]
    reader.close()


def test_a_table_whose_last_write_is_a_deletion_runs_dry(client: pulsar.Client) -> None:
    topic = table_topic("ends-deleted")
    producer = client.create_producer(topic, batching_enabled=False)
    for key, value in (("a", "1"), ("b", "1"), ("b", None)):
        write(producer, key, value)
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    assert read_table(reader) == [("a", "1")]


def test_batched_writes_are_compacted_per_message(client: pulsar.Client) -> None:
    topic = table_topic("batched")
    producer = client.create_producer(
        topic, batching_enabled=True, batching_max_publish_delay_ms=50
    )
    for n in range(20):
        producer.send_async(f"v{n}".encode(), None, partition_key=f"k{n % 5}")
    producer.flush()
    producer.send_async(b"", None, partition_key="k0", properties=TOMBSTONE)
    producer.flush()
    reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
    assert sorted(read_table(reader)) == [
        ("k1", "v16"),
        ("k2", "v17"),
        ("k3", "v18"),
        ("k4", "v19"),
    ]


def test_a_durable_subscription_from_the_earliest_gets_the_table(client: pulsar.Client) -> None:
    topic = table_topic("durable")
    producer = client.create_producer(topic, batching_enabled=False)
    for key, value in (("a", "1"), ("a", "2"), ("b", "1")):
        write(producer, key, value)
    consumer = client.subscribe(topic, "state", initial_position=pulsar.InitialPosition.Earliest)
    got = [consumer.receive(timeout_millis=TIMEOUT_MS) for _ in range(2)]
    assert [(m.partition_key(), m.data()) for m in got] == [("a", b"2"), ("b", b"1")]
    for message in got:
        consumer.acknowledge(message)
    expect_nothing(consumer)


def test_the_table_survives_a_restart(tmp_path: Path) -> None:
    topic = table_topic("restart")
    settings = pulsar_settings(data_dir=str(tmp_path / "data"))
    with pulsar_node(settings) as node, pulsar_client(node) as client:
        producer = client.create_producer(topic, batching_enabled=False)
        for key, value in (("a", "1"), ("b", "1"), ("a", None), ("c", "1"), ("b", "2")):
            write(producer, key, value)
    with pulsar_node(settings) as node, pulsar_client(node) as client:
        reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        assert read_table(reader) == [("c", "1"), ("b", "2")]
