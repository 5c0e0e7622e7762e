"""History without a holding subscription: what the example pipeline's sensors published before
any query ran is read by a batch query and by a streaming query from `earliest`, well after the
few seconds a topic without subscriptions used to keep (the default retention policy keeps
24 hours)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.clients import Client
from tests.spark.test_stream_read import rows, run_to_parquet, stream

pytestmark = pytest.mark.spark

# Longer than the old `unsubscribed_grace` (5 s) plus a trimming pass.
PAST_THE_GRACE = 6.5


def test_batch_and_streaming_reads_get_history_nobody_held(
    spark: Any, service_url: str, node: Any, topic: str, checkpoint: str, tmp_path: Path
) -> None:
    sensors = [f"{topic}/s{n}" for n in range(3)]
    publisher = Client(node.mqtt_port, "history-sensors")
    for reading in range(20):
        for sensor in sensors:
            assert publisher.publish(sensor, f"{reading}".encode(), 1) in (0, 0x10)
    publisher.disconnect()
    time.sleep(PAST_THE_GRACE)
    expected = sorted((sensor, f"{n}".encode()) for sensor in sensors for n in range(20))

    batch = (
        spark.read.format("mop")
        .option("service_url", service_url)
        .option("topics", f"{topic}/#")
        .option("starting_offsets", "earliest")
        .load()
    )
    assert sorted((row.topic, row.payload) for row in batch.collect()) == expected

    out = tmp_path / "out"
    run_to_parquet(stream(spark, service_url, topics=f"{topic}/#"), out, checkpoint)
    assert rows(spark, out) == expected
