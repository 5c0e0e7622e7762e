"""Writes: rows published through mop reach MQTT subscribers with their properties, a streaming
query that runs a micro-batch again does not publish it twice, and a DataFrame the sink cannot
publish is refused before any task runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pulsar
import pytest

from mop.testing.node import RunningNode
from tests.e2e.clients import Client
from tests.spark.support import hold, produce, read_all

pytestmark = pytest.mark.spark

QUERY_TIMEOUT = 120


def write(df: Any, service_url: str, **options: str) -> None:
    df.write.format("mop").option("service_url", service_url).options(**options).mode(
        "append"
    ).save()


def test_rows_written_by_spark_reach_mqtt_subscribers(
    spark: Any, service_url: str, node: RunningNode, topic: str
) -> None:
    subscriber = Client(node.mqtt_port)
    subscriber.subscribe(f"{topic}/#", qos=1)
    df = spark.createDataFrame(
        [
            (
                f"{topic}/dev-1",
                "dev-1",
                bytearray(b'{"alert": 1}'),
                {"mqtt.content_type": "application/json", "site": "north"},
            ),
            (f"{topic}/dev-2", None, bytearray(b"plain"), None),
        ],
        "topic STRING, key STRING, payload BINARY, properties MAP<STRING, STRING>",
    )
    write(df, service_url)
    received = sorted(subscriber.expect(2), key=lambda m: m.topic)
    assert [(m.topic, m.payload) for m in received] == [
        (f"{topic}/dev-1", b'{"alert": 1}'),
        (f"{topic}/dev-2", b"plain"),
    ]
    assert received[0].properties.ContentType == "application/json"
    assert received[0].properties.UserProperty == [("site", "north")]
    subscriber.expect_none()


def test_a_fixed_topic_and_string_payloads(
    spark: Any, service_url: str, client: pulsar.Client, topic: str
) -> None:
    hold(client, topic)
    df = spark.createDataFrame([("a",), ("b",)], "payload STRING").coalesce(1)
    write(df, service_url, topic=topic)
    assert [s.payload for s in read_all(client, topic)] == [b"a", b"b"]


def test_a_replayed_micro_batch_is_not_published_twice(
    spark: Any, service_url: str, client: pulsar.Client, topic: str, checkpoint: str
) -> None:
    source, sink = f"{topic}/in", f"{topic}/out"
    hold(client, source)
    hold(client, sink)
    produce(client, source, [b"m0", b"m1", b"m2"])
    df = (
        spark.readStream.format("mop")
        .option("service_url", service_url)
        .option("topics", source)
        .option("starting_offsets", "earliest")
        .load()
        .select("key", "payload")
    )

    def run() -> list[int]:
        """Runs the query; the number of input rows of each batch it ran."""
        query = (
            df.writeStream.format("mop")
            .option("service_url", service_url)
            .option("topic", sink)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(QUERY_TIMEOUT)
        assert query.exception() is None
        return [progress["numInputRows"] for progress in query.recentProgress]

    assert run() == [3]
    assert [s.payload for s in read_all(client, sink)] == [b"m0", b"m1", b"m2"]
    # Forget that the last batch was committed: Spark runs it again on restart, as after a
    # crash between publishing and committing.
    commits = Path(checkpoint, "commits")
    last = max(int(path.name) for path in commits.glob("[0-9]*"))
    (commits / str(last)).unlink()
    (commits / f".{last}.crc").unlink(missing_ok=True)
    produce(client, source, [b"m3"])
    assert run() == [3, 1]  # the replayed batch, then the new message
    assert [s.payload for s in read_all(client, sink)] == [b"m0", b"m1", b"m2", b"m3"]


def test_a_message_too_large_for_the_broker_fails_the_write(
    spark: Any, service_url: str, client: pulsar.Client, topic: str
) -> None:
    hold(client, topic)
    large = bytearray(6 << 20)  # above the broker's maximum message size (5 MB)
    df = spark.createDataFrame(
        [(bytearray(b"before"),), (large,), (bytearray(b"after"),)], "payload BINARY"
    ).coalesce(1)
    with pytest.raises(Exception, match="MessageTooBig"):
        write(df, service_url, topic=topic)
    # The others were published: the task fails, so Spark reports the write as failed.
    assert [s.payload for s in read_all(client, topic)] == [b"before", b"after"]


def test_a_dataframe_the_sink_cannot_publish_is_refused(
    spark: Any, service_url: str, topic: str
) -> None:
    df = spark.createDataFrame([("a",)], "body STRING")
    with pytest.raises(Exception, match="needs a 'payload' column"):
        write(df, service_url, topic=topic)
    with pytest.raises(Exception, match="give a 'topic' option or a 'topic' column"):
        write(df.withColumnRenamed("body", "payload"), service_url)
    with pytest.raises(Exception, match="cannot be overwritten"):
        df.withColumnRenamed("body", "payload").write.format("mop").option(
            "service_url", service_url
        ).option("topic", topic).mode("overwrite").save()
