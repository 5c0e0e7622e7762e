"""Throughput of the Spark data source `mop` through a merged node, beside Spark's own floor.

    python bench/spark_bench.py                    # 1M messages of 100 bytes (a few minutes)
    python bench/spark_bench.py --messages 100000  # quicker
    python bench/spark_bench.py --budget 300       # stop measuring after 300 s

A `mop run` node (Pulsar protocol only, `storage.fsync` never unless `--fsync`) and one local
Spark session (`local[2]`) on this machine. Measured, in this order, each after a small warm-up
run of the same path (Spark's first query of a kind pays for worker start-up and code
generation):

- write: a DataFrame of N rows (`payload` only) -> `df.write.format("mop")` -> the node; the
  rows are then the topic the reads below read;
- batch read: `spark.read.format("mop")` of the topic -> the `noop` sink;
- streaming read: `spark.readStream.format("mop")`, one `availableNow` run -> the `noop` sink.

Next to each, the floor: the same path with a trivial Python data source that makes its rows up
(the same schema, Arrow batches of 10,000 rows for reads; a sink that only counts for writes).
The ratio mop / floor says how much of Spark's own cost for a Python source the broker and
pulsar-client add. And, without Spark, what one pulsar-client producer (batching, as the sink)
or reader (fetching every field a row shows) in this process moves through the same node: the
most a single Spark task could get. Rows/s are N over the wall time of the action, Spark's
overhead included.
Two cores are shared by Spark's JVM, its Python workers and the node, and by anything else that
runs: the load average before and after is printed; compare ratios from one run only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brokers import REPO_DIR, cpu_ticks, free_port
from report import machine

sys.path.insert(0, str(REPO_DIR))

TOPIC = "bench/spark"
WARM_UP = 20_000


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- the node ------------------------------------------------------------------------------------


class Node:
    """`python -m mop run`: Pulsar only, on a free loopback port, with a fresh data directory."""

    def __init__(self, workdir: Path, fsync: str) -> None:
        self.port = free_port()
        self.workdir = workdir
        env = dict(os.environ)
        env.update(
            PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_DIR), env.get("PYTHONPATH")])),
            MOP_PROTOCOLS='["pulsar"]',
            MOP_PULSAR__HOST="127.0.0.1",
            MOP_PULSAR__PORT=str(self.port),
            MOP_ADMIN__PORT="0",
            MOP_DATA_DIR=str(workdir / "data"),
            MOP_STORAGE__FSYNC=fsync,
            MOP_LOG_LEVEL="WARNING",
        )
        workdir.mkdir(parents=True, exist_ok=True)
        with open(workdir / "node.log", "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mop", "run"],
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )
        deadline = time.monotonic() + 30
        while not _accepts(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the node did not start; see {workdir / 'node.log'}")
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    def cpu_seconds(self) -> float:
        return cpu_ticks(self.proc.pid) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


# --- the floor: trivial Python data sources with the same schema ---------------------------------


def floor_source() -> type:
    """A batch and streaming source that makes up `rows` rows of the mop schema, and a sink
    that counts what it gets (defined here, picklable by value with the bench)."""
    import pyarrow as pa
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceArrowWriter,
        DataSourceReader,
        DataSourceStreamArrowWriter,
        DataSourceStreamReader,
        InputPartition,
        WriterCommitMessage,
    )

    from mop.spark.rows import ARROW_SCHEMA, SCHEMA

    batch_rows = 10_000

    def make(count: int) -> Iterator[Any]:
        payload = b"x" * 100
        full = None
        for start in range(0, count, batch_rows):
            size = min(batch_rows, count - start)
            if full is None or size != batch_rows:
                full = pa.RecordBatch.from_pydict(
                    {
                        "topic": [TOPIC] * size,
                        "pulsar_topic": ["persistent://public/default/bench%2Fspark"] * size,
                        "partition": [-1] * size,
                        "key": [None] * size,
                        "payload": [payload] * size,
                        "properties": [[] for _ in range(size)],
                        "publish_time": [1_700_000_000_000_000] * size,
                        "event_time": [None] * size,
                        "message_id": [f"0:{i}" for i in range(size)],
                    },
                    schema=ARROW_SCHEMA,
                )
            yield full

    class Half(InputPartition):
        def __init__(self, rows: int) -> None:
            super().__init__(rows)
            self.rows = rows

    class Reader(DataSourceReader):
        def __init__(self, rows: int) -> None:
            self.rows = rows

        def partitions(self) -> list[InputPartition]:
            return [Half(self.rows // 2), Half(self.rows - self.rows // 2)]

        def read(self, partition: Any) -> Iterator[Any]:
            return make(partition.rows)

    class StreamReader(DataSourceStreamReader):
        def __init__(self, rows: int) -> None:
            self.rows = rows

        def initialOffset(self) -> dict[str, int]:
            return {"rows": 0}

        def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
            return {"rows": self.rows}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
            rows = end["rows"] - start["rows"]
            return [Half(rows // 2), Half(rows - rows // 2)] if rows else []

        def read(self, partition: Any) -> Iterator[Any]:
            return make(partition.rows)

    @dataclass
    class Counted(WriterCommitMessage):
        rows: int

    class Writer(DataSourceArrowWriter):
        def write(self, iterator: Iterator[Any]) -> Counted:
            return Counted(sum(batch.num_rows for batch in iterator))

    class StreamWriter(DataSourceStreamArrowWriter):
        def write(self, iterator: Iterator[Any]) -> Counted:
            return Counted(sum(batch.num_rows for batch in iterator))

    class Floor(DataSource):
        @classmethod
        def name(cls) -> str:
            return "floor"

        def schema(self) -> str:
            return SCHEMA

        def reader(self, schema: Any) -> Reader:
            return Reader(int(self.options["rows"]))

        def streamReader(self, schema: Any) -> StreamReader:
            return StreamReader(int(self.options["rows"]))

        def writer(self, schema: Any, overwrite: bool) -> Writer:
            return Writer()

        def streamWriter(self, schema: Any, overwrite: bool) -> StreamWriter:
            return StreamWriter()

    return Floor


# --- measuring -----------------------------------------------------------------------------------


@dataclass
class Result:
    path: str
    source: str
    rows: int
    seconds: float
    node_cpu: float | None = None

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


class Bench:
    def __init__(self, spark: Any, node: Node, work: Path, deadline: float) -> None:
        self.spark = spark
        self.node = node
        self.work = work
        self.deadline = deadline
        self.results: list[Result] = []
        self.skipped: list[str] = []

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def measure(self, path: str, source: str, rows: int, action: Callable[[], None]) -> None:
        if self.remaining() <= 0:
            self.skipped.append(f"{path} ({source})")
            log(f"out of time budget: skipping {path} with {source}")
            return
        log(f"{path} with {source}: {rows:,} rows")
        node_before = self.node.cpu_seconds() if source != "floor" else None
        started = time.perf_counter()
        action()
        seconds = time.perf_counter() - started
        node_cpu = None if node_before is None else self.node.cpu_seconds() - node_before
        result = Result(path, source, rows, seconds, node_cpu)
        self.results.append(result)
        log(f"  {seconds:.2f} s, {result.rate:,.0f} rows/s")

    def stream(self, df: Any, sink: str, name: str) -> None:
        query = (
            df.writeStream.format(sink)
            .option("checkpointLocation", str(self.work / name))
            .trigger(availableNow=True)
            .start()
        )
        if not query.awaitTermination(max(1.0, self.remaining() + 60)):
            query.stop()
            raise RuntimeError(f"{name} did not finish in time")
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))


def run(args: argparse.Namespace, work: Path) -> tuple[list[Result], list[str]]:
    from pyspark.sql import functions as F

    import mop.spark

    node = Node(work / "node", args.fsync)
    log(f"node on {node.url} (fsync {args.fsync})")
    spark = mop.spark.local_session(
        "mop-spark-bench",
        work_dir=work / "spark",
        driver_memory="2g",
        conf={"spark.sql.execution.arrow.maxRecordsPerBatch": "10000"},
    )
    mop.spark.register(spark)
    spark.dataSource.register(floor_source())
    deadline = time.monotonic() + args.budget
    bench = Bench(spark, node, work, deadline)
    url = node.url
    # Nobody else subscribes: a subscription that never acknowledges keeps the data for reads.
    import pulsar

    from mop.topic_names import mqtt_to_pulsar

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    keepers = [
        client.subscribe(mqtt_to_pulsar(f"{TOPIC}/{name}"), "keeper", receiver_queue_size=0)
        for name in ("warm", "data")
    ]
    try:

        def rows_df(count: int) -> Any:
            payload = F.lit(b"x" * 100).cast("binary")
            return spark.range(0, count, numPartitions=2).select(payload.alias("payload"))

        split = (
            {}
            if args.entries_per_partition is None
            else {"max_records_per_partition": str(args.entries_per_partition)}
        )

        def mop_read(name: str) -> Any:
            return (
                spark.read.format("mop")
                .option("service_url", url)
                .option("topics", f"{TOPIC}/{name}")
                .options(**split)
                .load()
            )

        def mop_stream(name: str) -> Any:
            return (
                spark.readStream.format("mop")
                .option("service_url", url)
                .option("topics", f"{TOPIC}/{name}")
                .option("starting_offsets", "earliest")
                .options(**split)
                .load()
            )

        def floor_read(count: int) -> Any:
            return spark.read.format("floor").option("rows", str(count)).load()

        def floor_stream(count: int) -> Any:
            return spark.readStream.format("floor").option("rows", str(count)).load()

        def write_mop(count: int, name: str) -> Callable[[], None]:
            return lambda: (
                rows_df(count)
                .write.format("mop")
                .option("service_url", url)
                .option("topic", f"{TOPIC}/{name}")
                .mode("append")
                .save()
            )

        def write_floor(count: int) -> Callable[[], None]:
            return lambda: rows_df(count).write.format("floor").mode("append").save()

        def noop(df: Any) -> Callable[[], None]:
            return lambda: df.write.format("noop").mode("overwrite").save()

        n = args.messages
        log("warming up every path")
        warm = Bench(spark, node, work / "warm", deadline)
        for path, source, action in [
            ("write", "floor", write_floor(WARM_UP)),
            ("write", "mop", write_mop(WARM_UP, "warm")),
            ("batch read", "floor", noop(floor_read(WARM_UP))),
            ("batch read", "mop", noop(mop_read("warm"))),
            (
                "streaming read",
                "floor",
                lambda: warm.stream(floor_stream(WARM_UP), "noop", "warm-floor"),
            ),
            ("streaming read", "mop", lambda: warm.stream(mop_stream("warm"), "noop", "warm-mop")),
        ]:
            warm.measure(path, source, WARM_UP, action)

        bench.measure("write", "floor", n, write_floor(n))
        bench.measure("write", "mop", n, write_mop(n, "data"))
        bench.measure("batch read", "floor", n, noop(floor_read(n)))
        bench.measure("batch read", "mop", n, noop(mop_read("data")))
        bench.measure(
            "streaming read", "floor", n, lambda: bench.stream(floor_stream(n), "noop", "floor")
        )
        bench.measure(
            "streaming read", "mop", n, lambda: bench.stream(mop_stream("data"), "noop", "mop")
        )
        count = mop_read("data").count()
        if count != n:
            raise RuntimeError(f"the topic holds {count} rows, not {n}")
        bench.measure("write", "client", n, lambda: client_write(client, n))
        bench.measure("batch read", "client", n, lambda: client_read(client, n))
        return bench.results, bench.skipped
    finally:
        for keeper in keepers:
            keeper.close()
        client.close()
        spark.stop()
        node.stop()


def client_write(client: Any, count: int) -> None:
    """pulsar-client alone: one batching producer, as the sink's."""
    from mop.topic_names import mqtt_to_pulsar

    producer = client.create_producer(
        mqtt_to_pulsar(f"{TOPIC}/client"),
        batching_enabled=True,
        batching_max_messages=1000,
        batching_max_allowed_size_in_bytes=1 << 20,
        batching_max_publish_delay_ms=10,
        max_pending_messages=10_000,
        block_if_queue_full=True,
        send_timeout_millis=0,
    )
    payload = b"x" * 100
    for _ in range(count):
        producer.send_async(payload, None)
    producer.flush()
    producer.close()


def client_read(client: Any, count: int) -> None:
    """pulsar-client alone: one reader of the data topic, reading every field a row shows."""
    import pulsar

    from mop.topic_names import mqtt_to_pulsar

    reader = client.create_reader(
        mqtt_to_pulsar(f"{TOPIC}/data"), pulsar.MessageId.earliest, receiver_queue_size=10_000
    )
    for _ in range(count):
        message = reader.read_next(30_000)
        message.data(), message.properties(), message.partition_key()
        message.publish_timestamp(), message.event_timestamp()
        message_id = message.message_id()
        message_id.ledger_id(), message_id.entry_id(), message_id.batch_index()
    reader.close()


def report(
    results: list[Result], skipped: list[str], args: argparse.Namespace, loads: tuple[str, str]
) -> str:
    lines = [
        f"Spark data source `mop`, {args.messages:,} messages of 100 bytes, local[2], node fsync"
        f" {args.fsync}; {machine()}; load average before {loads[0]}, after {loads[1]}",
        "",
        "| path | Spark floor rows/s | `mop` rows/s | mop / floor | node CPU s | pulsar-client"
        " alone rows/s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    by_path: dict[str, dict[str, Result]] = {}
    for result in results:
        by_path.setdefault(result.path, {})[result.source] = result
    for path, found in by_path.items():
        floor, ours, alone = found.get("floor"), found.get("mop"), found.get("client")
        ratio = f"{ours.rate / floor.rate:.0%}" if floor and ours else "-"
        cpu = f"{ours.node_cpu:.1f}" if ours and ours.node_cpu is not None else "-"
        lines.append(
            f"| {path} | {f'{floor.rate:,.0f}' if floor else '-'} |"
            f" {f'{ours.rate:,.0f}' if ours else '-'} | {ratio} | {cpu} |"
            f" {f'{alone.rate:,.0f}' if alone else '-'} |"
        )
    if skipped:
        lines += ["", "Not measured (time budget): " + ", ".join(skipped)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--fsync", default="never", choices=["never", "interval", "always"])
    parser.add_argument(
        "--budget",
        type=float,
        default=900,
        help="seconds after which no further measurement starts",
    )
    parser.add_argument(
        "--entries-per-partition",
        type=int,
        default=None,
        help="max_records_per_partition of the reads (default: one partition)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="mop-spark-bench-"))
    load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
    try:
        results, skipped = run(args, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    load_after = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(report(results, skipped, args, (load_before, load_after)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
