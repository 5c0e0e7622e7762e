"""Batch reads: `spark.read.format("mop")` gives exactly the stored messages of the selected
topics, within the given positions, in as many Spark partitions as asked."""

from __future__ import annotations

from typing import Any

import pulsar
import pytest

import mop.spark
from mop.testing.node import RunningNode
from mop.topic_names import mqtt_to_pulsar
from tests.e2e.clients import Client, props
from tests.spark.support import Sent, hold, produce, receive

pytestmark = pytest.mark.spark

COLUMNS = (
    "topic",
    "pulsar_topic",
    "partition",
    "key",
    "payload",
    "properties",
    "unix_millis(publish_time) AS publish_ms",
    "unix_millis(event_time) AS event_ms",
    "message_id",
)


def read(spark: Any, service_url: str, **options: str) -> Any:
    return spark.read.format("mop").option("service_url", service_url).options(**options).load()


def rows(df: Any) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in df.selectExpr(*COLUMNS).collect()]


def expected(topic: str, sent: list[Sent]) -> list[tuple[Any, ...]]:
    return [
        (
            topic,
            mqtt_to_pulsar(topic),
            -1,
            s.key,
            s.payload,
            s.properties,
            s.publish_ms,
            s.event_ms,
            s.message_id,
        )
        for s in sent
    ]


def test_batch_read_of_a_known_topic_gives_exactly_its_messages(
    spark: Any, service_url: str, client: pulsar.Client, node: RunningNode, topic: str
) -> None:
    keeper = hold(client, topic)
    produce(
        client,
        topic,
        [b"p0"],
        properties={"site": "a"},
        partition_key="dev-1",
        event_timestamp=1_700_000_000_123,
    )
    produce(client, topic, [b"p1", b""])
    mqtt = Client(node.mqtt_port)
    mqtt.publish(
        topic,
        b"from mqtt",
        qos=1,
        properties=props(ContentType="text/plain", UserProperty=[("unit", "C")]),
    )
    sent = receive(keeper, 4)
    assert sent[3].properties == {"mqtt.content_type": "text/plain", "unit": "C"}

    assert rows(read(spark, service_url, topics=topic)) == expected(topic, sent)


def test_batched_messages_have_their_own_ids_and_a_range_may_end_inside_a_batch(
    spark: Any, service_url: str, client: pulsar.Client, topic: str
) -> None:
    keeper = hold(client, topic)
    producer = client.create_producer(
        mqtt_to_pulsar(topic),
        batching_enabled=True,
        batching_max_messages=5,
        batching_max_publish_delay_ms=60_000,
    )
    for i in range(5):
        producer.send_async(f"b{i}".encode(), None)
    producer.flush()
    sent = receive(keeper, 5)
    assert len({s.message_id.rsplit(":", 1)[0] for s in sent}) == 1  # one entry
    assert rows(read(spark, service_url, topics=topic)) == expected(topic, sent)

    middle = f'{{"{topic}": "{sent[2].message_id}"}}'
    assert rows(read(spark, service_url, topics=topic, ending_offsets=middle)) == expected(
        topic, sent[:3]
    )
    assert rows(read(spark, service_url, topics=topic, starting_offsets=middle)) == expected(
        topic, sent[3:]
    )


def test_positions_bound_a_batch_read(
    spark: Any, service_url: str, client: pulsar.Client, topic: str
) -> None:
    keeper = hold(client, topic)
    produce(client, topic, [f"m{i}".encode() for i in range(6)])
    sent = receive(keeper, 6)
    df = read(
        spark,
        service_url,
        topics=topic,
        starting_offsets=f'{{"{topic}": "{sent[1].message_id}"}}',
        ending_offsets=f'{{"{topic}": "{sent[4].message_id}"}}',
    )
    assert [row.payload for row in df.collect()] == [b"m2", b"m3", b"m4"]
    latest = read(spark, service_url, topics=topic, starting_offsets="latest")
    assert latest.count() == 0


def test_mqtt_filters_and_pulsar_patterns_select_topics(
    spark: Any, service_url: str, client: pulsar.Client, topic: str
) -> None:
    names = [f"{topic}/a/temp", f"{topic}/b/temp", f"{topic}/b/hum"]
    for name in names:
        hold(client, name)
        produce(client, name, [name.encode()])

    by_filter = read(spark, service_url, topics=f"{topic}/+/temp")
    assert sorted(row.topic for row in by_filter.collect()) == names[:2]
    assert {row.payload for row in by_filter.collect()} == {n.encode() for n in names[:2]}

    pattern = f"{mqtt_to_pulsar(topic)}%2F.*%2Fhum".replace("-", r"\-")
    by_pattern = read(spark, service_url, topics_pattern=pattern)
    assert [row.topic for row in by_pattern.collect()] == [names[2]]

    listed = read(spark, service_url, topics=f'["{names[0]}", "{names[2]}"]')
    assert sorted(row.topic for row in listed.collect()) == [names[0], names[2]]


def test_a_large_topic_is_read_in_several_partitions(
    spark: Any, service_url: str, client: pulsar.Client, topic: str
) -> None:
    hold(client, topic)
    produce(client, topic, [f"m{i}".encode() for i in range(10)])
    df = read(spark, service_url, topics=topic, max_records_per_partition="3")
    assert df.rdd.getNumPartitions() == 4
    assert [row.payload for row in df.collect()] == [f"m{i}".encode() for i in range(10)]


def test_register_uses_the_active_session(spark: Any) -> None:
    assert mop.spark.register() is spark


def test_nothing_to_read(spark: Any, service_url: str, topic: str) -> None:
    assert read(spark, service_url, topics=f"{topic}/none/#").count() == 0
    assert read(spark, service_url, topics=f"{topic}/none").count() == 0


def test_a_bad_option_fails_the_load(spark: Any, service_url: str, topic: str) -> None:
    with pytest.raises(Exception, match="unknown option"):
        read(spark, service_url, topics=topic, startingOffsets="earliest").collect()
