"""Telemetry pipeline on Spark: MQTT sensors -> windowed aggregates with a watermark -> Parquet
files, and an alerts topic that MQTT subscribers receive.

    mop run &                              # a node: MQTT on 127.0.0.1:1883, Pulsar on :6650
    python examples/spark/pipeline.py      # sensors, the pipeline and an alert listener, 40 s

Simulated sensors publish a JSON reading a second each over MQTT to `sensors/<device>/telemetry`
(the last one heats up by a degree a second). Two streaming queries read them through the `mop`
data source; both compute per-device averages and maxima over 10-second event-time windows,
closed by a 5-second watermark. One appends the closed windows to Parquet files; the other
publishes an alert to `alerts/<device>` for each closed window whose maximum is above 35, which
the script's MQTT subscriber of `alerts/#` prints as it arrives.

Each query keeps its progress in a checkpoint under `--work` and a durable subscription on each
sensor topic, so a later run goes on where this one stopped, also after a stop longer than the
node's retention policy (24 hours on a fresh node), which keeps the readings meanwhile. With
`--no-sensors` the pipeline processes real sensors' readings until Ctrl-C. Needs
`pip install -e '.[spark-example]'` (the Spark data source and paho-mqtt) and Java 17 or 21.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

import mop.spark

READING = "device STRING, temperature DOUBLE, ts LONG"
WINDOW = "10 seconds"
LATENESS = "5 seconds"
THRESHOLD = 35.0


@dataclass(frozen=True)
class Topics:
    """Where the pipeline reads and writes; `prefix` keeps several pipelines apart."""

    prefix: str = ""

    @property
    def telemetry_filter(self) -> str:
        return f"{self.prefix}sensors/+/telemetry"

    def telemetry(self, device: str) -> str:
        return f"{self.prefix}sensors/{device}/telemetry"

    @property
    def alerts_filter(self) -> str:
        return f"{self.prefix}alerts/#"

    @property
    def alerts_base(self) -> str:
        return f"{self.prefix}alerts/"


# --- the pipeline --------------------------------------------------------------------------------


def windows(spark: SparkSession, service_url: str, topics: Topics, subscription: str) -> DataFrame:
    """Per device and 10-second window: readings, average and maximum temperature."""
    readings = (
        spark.readStream.format("mop")
        .option("service_url", service_url)
        .option("topics", topics.telemetry_filter)
        .option("starting_offsets", "earliest")
        .option("subscription", subscription)
        .load()
        .select(F.from_json(F.col("payload").cast("string"), READING).alias("r"))
        .select("r.device", "r.temperature", F.timestamp_millis("r.ts").alias("event_time"))
    )
    return (
        readings.withWatermark("event_time", LATENESS)
        .groupBy(F.window("event_time", WINDOW), "device")
        .agg(
            F.count("*").alias("readings"),
            F.avg("temperature").alias("avg_temperature"),
            F.max("temperature").alias("max_temperature"),
        )
        .select(
            "device",
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "readings",
            "avg_temperature",
            "max_temperature",
        )
    )


def start_pipeline(
    spark: SparkSession, service_url: str, work: Path, topics: Topics, *, once: bool = True
) -> list[StreamingQuery]:
    """Start both queries: closed windows to Parquet under `work/aggregates`, alerts to
    `alerts/<device>`. With `once`, each processes what is there now and stops."""
    trigger: dict[str, Any] = {"availableNow": True} if once else {"processingTime": "2 seconds"}
    to_parquet = (
        windows(spark, service_url, topics, "pipeline-aggregates")
        .writeStream.format("parquet")
        .outputMode("append")
        .option("path", str(work / "aggregates"))
        .option("checkpointLocation", str(work / "checkpoints" / "aggregates"))
        .trigger(**trigger)
        .start()
    )
    alerts = (
        windows(spark, service_url, topics, "pipeline-alerts")
        .where(F.col("max_temperature") > THRESHOLD)
        .select(
            F.concat(F.lit(topics.alerts_base), "device").alias("topic"),
            F.col("device").alias("key"),
            F.to_json(
                F.struct(
                    "device",
                    F.date_format("window_start", "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("window_start"),
                    "readings",
                    F.round("avg_temperature", 2).alias("avg_temperature"),
                    "max_temperature",
                )
            )
            .cast("binary")
            .alias("payload"),
            F.create_map(F.lit("mqtt.content_type"), F.lit("application/json")).alias("properties"),
        )
    )
    to_alerts = (
        alerts.writeStream.format("mop")
        .option("service_url", service_url)
        .outputMode("append")
        .option("checkpointLocation", str(work / "checkpoints" / "alerts"))
        .trigger(**trigger)
        .start()
    )
    return [to_parquet, to_alerts]


# --- simulated sensors and an alert listener -----------------------------------------------------


def reading(device: int, devices: int, second: int, start_ms: int) -> dict[str, Any]:
    """The reading of device `device` (1..devices) `second` seconds after `start_ms`: 20-24
    degrees, except the last device, which heats up by a degree a second from 20."""
    temperature = 20.0 + (second if device == devices else second % 5)
    return {"device": f"d{device}", "temperature": temperature, "ts": start_ms + second * 1000}


def readings(devices: int, seconds: int, start_ms: int) -> list[dict[str, Any]]:
    return [
        reading(device, devices, second, start_ms)
        for second in range(seconds)
        for device in range(1, devices + 1)
    ]


def mqtt_client(host: str, port: int, client_id: str) -> paho.Client:
    client = paho.Client(
        CallbackAPIVersion.VERSION2, client_id=client_id, protocol=MQTTProtocolVersion.MQTTv5
    )
    client.connect(host, port)
    client.loop_start()
    return client


def publish_readings(host: str, port: int, topics: Topics, batch: list[dict[str, Any]]) -> None:
    """Publish readings at once (QoS 1), each to its device's topic."""
    client = mqtt_client(host, port, "pipeline-sensors")
    try:
        sent = [client.publish(topics.telemetry(r["device"]), json.dumps(r), qos=1) for r in batch]
        for info in sent:
            info.wait_for_publish(timeout=10)
    finally:
        client.disconnect()
        client.loop_stop()


def run_sensors(host: str, port: int, topics: Topics, devices: int, stop: threading.Event) -> None:
    """Live sensors: every device publishes a reading a second until `stop` is set."""
    client = mqtt_client(host, port, "pipeline-sensors")
    start_ms = int(time.time() * 1000)
    try:
        for second in range(24 * 3600):
            if stop.wait(max(0.0, start_ms / 1000 + second - time.time())):
                break
            for device in range(1, devices + 1):
                data = reading(device, devices, second, start_ms)
                client.publish(topics.telemetry(data["device"]), json.dumps(data), qos=1)
    finally:
        client.disconnect()
        client.loop_stop()


class AlertListener:
    """An MQTT subscriber of the alerts, as a device or an operator console would be."""

    def __init__(self, host: str, port: int, topics: Topics) -> None:
        self.alerts: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        subscribed: queue.Queue[bool] = queue.Queue()
        self._client = mqtt_client(host, port, "pipeline-alert-listener")
        self._client.on_message = lambda _c, _u, msg: self.alerts.put(
            (msg.topic, json.loads(msg.payload))
        )
        self._client.on_subscribe = lambda *_: subscribed.put(True)
        self._client.subscribe(topics.alerts_filter, qos=1)
        subscribed.get(timeout=10)

    def take(self, count: int, timeout: float) -> list[tuple[str, dict[str, Any]]]:
        got: list[tuple[str, dict[str, Any]]] = []
        deadline = time.monotonic() + timeout
        while len(got) < count and (remaining := deadline - time.monotonic()) > 0:
            try:
                got.append(self.alerts.get(timeout=remaining))
            except queue.Empty:
                break
        return got

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()


def stop_between_batches(query: StreamingQuery, timeout: float = 30.0) -> None:
    """Stop a query once its running micro-batch (if any) is done, so that nothing is cut off
    half way (a cut batch runs again at the next start, which is harmless but noisy)."""
    deadline = time.monotonic() + timeout
    while query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.1)
    query.stop()


# --- one command ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--service-url", default="pulsar://127.0.0.1:6650")
    parser.add_argument("--mqtt", default="127.0.0.1:1883", help="HOST:PORT of the MQTT listener")
    parser.add_argument("--work", type=Path, default=Path("pipeline-work"))
    parser.add_argument("--devices", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=40, help="how long to run (0: until ^C)")
    parser.add_argument("--no-sensors", action="store_true", help="do not simulate sensors")
    args = parser.parse_args(argv)
    host, _, port = args.mqtt.rpartition(":")
    topics = Topics()

    spark = mop.spark.local_session("mop-pipeline", work_dir=args.work / "spark")
    mop.spark.register(spark)
    listener = AlertListener(host, int(port), topics)
    stop = threading.Event()
    queries = start_pipeline(spark, args.service_url, args.work, topics, once=False)
    sensors = threading.Thread(
        target=run_sensors, args=(host, int(port), topics, args.devices, stop), daemon=True
    )
    if not args.no_sensors:
        sensors.start()
    print("pipeline running; Ctrl-C stops it", flush=True)
    deadline = time.monotonic() + args.seconds if args.seconds else float("inf")
    try:
        while time.monotonic() < deadline:
            for topic, alert in listener.take(1, timeout=min(1.0, deadline - time.monotonic())):
                print(f"alert on {topic}: {alert}", flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        for query in queries:
            stop_between_batches(query)
        listener.close()
    if (args.work / "aggregates").exists():
        print("closed windows so far (Parquet files under", args.work / "aggregates", "):")
        spark.read.parquet(str(args.work / "aggregates")).orderBy("window_start", "device").show(
            50, truncate=False
        )
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
