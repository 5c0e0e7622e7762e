"""The example pipeline of examples/spark end to end: MQTT sensors -> windowed aggregates with
a watermark -> Parquet files, and alerts that an MQTT subscriber receives."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pulsar
import pytest

from mop.testing.node import RunningNode
from tests.spark.support import hold

pytestmark = pytest.mark.spark

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark" / "pipeline.py"
START_MS = 1_700_000_000_000  # a window boundary (10 s)


@pytest.fixture(scope="module")
def pipeline() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mop_spark_pipeline_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_example_pipeline_end_to_end(
    spark: Any,
    service_url: str,
    node: RunningNode,
    client: pulsar.Client,
    pipeline: ModuleType,
    topic: str,
    tmp_path: Path,
) -> None:
    topics = pipeline.Topics(prefix=f"{topic}/")
    # A mop node drops messages nobody holds after a few seconds; the pipeline's queries hold
    # the sensor topics from their first run on, which this test starts after publishing.
    for device in ("d1", "d2", "d3"):
        hold(client, topics.telemetry(device))
    listener = pipeline.AlertListener("127.0.0.1", node.mqtt_port, topics)
    try:
        # 30 s of readings from 3 devices; the third one heats up by one degree a second.
        pipeline.publish_readings(
            "127.0.0.1", node.mqtt_port, topics, pipeline.readings(3, 30, START_MS)
        )
        for query in pipeline.start_pipeline(spark, service_url, tmp_path, topics):
            assert query.awaitTermination(120)
            assert query.exception() is None

        # The watermark (latest reading - 5 s) has closed the first two 10-second windows.
        rows = (
            spark.read.parquet(str(tmp_path / "aggregates"))
            .selectExpr(
                "device",
                "unix_millis(window_start) - 1700000000000 AS start",
                "readings",
                "avg_temperature",
                "max_temperature",
            )
            .orderBy("start", "device")
            .collect()
        )
        assert [tuple(row) for row in rows] == [
            ("d1", 0, 10, 22.0, 24.0),
            ("d2", 0, 10, 22.0, 24.0),
            ("d3", 0, 10, 24.5, 29.0),
            ("d1", 10_000, 10, 22.0, 24.0),
            ("d2", 10_000, 10, 22.0, 24.0),
            ("d3", 10_000, 10, 34.5, 39.0),
        ]
        # Only the second window of d3 went above 35 degrees.
        assert listener.take(2, timeout=10) == [
            (
                f"{topic}/alerts/d3",
                {
                    "device": "d3",
                    "window_start": "2023-11-14T22:13:30Z",
                    "readings": 10,
                    "avg_temperature": 34.5,
                    "max_temperature": 39.0,
                },
            )
        ]
    finally:
        listener.close()
