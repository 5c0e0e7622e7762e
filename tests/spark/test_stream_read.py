"""Streaming reads: a query resumes from its checkpoint exactly where it stopped, topics that
appear under a filter join the stream, its holding subscription keeps what it has not processed
and lets go of what it has, and a rate limit splits a backlog into several micro-batches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pulsar
import pytest

from mop.topic_names import mqtt_to_pulsar
from tests.spark.support import TIMEOUT_MS, hold, produce

pytestmark = pytest.mark.spark

QUERY_TIMEOUT = 120


def stream(spark: Any, service_url: str, **options: str) -> Any:
    return (
        spark.readStream.format("mop")
        .option("service_url", service_url)
        .option("starting_offsets", "earliest")
        .options(**options)
        .load()
    )


def run_to_parquet(df: Any, out: Path, checkpoint: str) -> None:
    """One availableNow run of `df` into Parquet files under `out`."""
    query = (
        df.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(QUERY_TIMEOUT), "the query did not finish"
    assert query.exception() is None


def subscribe(client: pulsar.Client, topic: str, name: str) -> Any:
    """A consumer on the subscription a query holds (Failover, as the query's own)."""
    return client.subscribe(
        mqtt_to_pulsar(topic),
        name,
        consumer_type=pulsar.ConsumerType.Failover,
        initial_position=pulsar.InitialPosition.Earliest,
    )


def rows(spark: Any, out: Path) -> list[tuple[str, bytes]]:
    """(topic, payload) of every row written so far, sorted (duplicates stay)."""
    return sorted((row.topic, row.payload) for row in spark.read.parquet(str(out)).collect())


def test_available_now_resumes_from_its_checkpoint_without_duplicates_or_gaps(
    spark: Any,
    service_url: str,
    client: pulsar.Client,
    topic: str,
    checkpoint: str,
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    first, later = f"{topic}/a", f"{topic}/b"
    df = stream(spark, service_url, topics=f"{topic}/#", subscription="query-1")
    # The query's subscription, made before the first message: from then on it holds them all.
    subscribe(client, first, "query-1").close()

    produce(client, first, [b"a0", b"a1", b"a2"])
    run_to_parquet(df, out, checkpoint)
    assert rows(spark, out) == [(first, b"a0"), (first, b"a1"), (first, b"a2")]

    # A topic that appears under the filter joins from its first message. The query holds it
    # once it has seen it; until then the test does.
    hold(client, later)
    produce(client, later, [b"b0"])
    produce(client, first, [b"a3", b"a4"])
    run_to_parquet(df, out, checkpoint)
    assert rows(spark, out) == [
        (first, b"a0"),
        (first, b"a1"),
        (first, b"a2"),
        (first, b"a3"),
        (first, b"a4"),
        (later, b"b0"),
    ]

    # The second run started by committing the first run's end: the subscription was
    # acknowledged up to a2 and now delivers from a3 (the second run's own end is committed
    # when the query runs next).
    assert subscribe(client, first, "query-1").receive(TIMEOUT_MS).data() == b"a3"


def test_a_rate_limit_splits_a_backlog_into_micro_batches(
    spark: Any, service_url: str, client: pulsar.Client, topic: str, checkpoint: str
) -> None:
    hold(client, topic)
    produce(client, topic, [f"m{i}".encode() for i in range(10)])
    df = stream(spark, service_url, topics=topic, max_records_per_trigger="4")
    query = (
        df.writeStream.format("memory")
        .queryName("rate_limited")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(QUERY_TIMEOUT)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [4, 4, 2]
    rows = spark.sql("SELECT payload FROM rate_limited").collect()
    assert [row.payload for row in rows] == [f"m{i}".encode() for i in range(10)]
