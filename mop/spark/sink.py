"""Writes (`df.write.format("mop")`, `df.writeStream.format("mop")`): each task publishes its
rows with batching producers, one per topic, and returns once the broker has stored them all.

A streaming micro-batch is published idempotently: its producers are named after the query and
the Spark partition, and each row's sequence id is derived from the batch id and its place in
the partition. When Spark runs a batch again (a task retry, or a restart from the checkpoint
after a crash), the broker recognises every row it stored before and drops the copy (producer
deduplication, which a mop node always does and Apache Pulsar does where it is enabled). That
holds as long as the batch's rows come out the same, in the same partitions and order, which is
what a replayed source such as `mop` gives. Batch writes are at least once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import pulsar
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, MapType, StringType, StructType, TimestampType

from mop.spark.client import open_client
from mop.spark.options import OptionError, WriteOptions
from mop.topic_names import mqtt_to_pulsar

__all__ = ["MopStreamWriter", "MopWriter", "Published", "check_schema"]

log = logging.getLogger(__name__)

# Room for this many rows per Spark partition per micro-batch in the sequence ids of a batch.
_ROWS_PER_BATCH_BITS: Final = 32
# Messages this large may exceed the broker's maximum message size (5 MB by default).
_LARGE: Final = 64 << 10
_COLUMNS: Final = {
    "topic": (StringType,),
    "key": (StringType,),
    "payload": (BinaryType, StringType),
    "properties": (MapType,),
    "event_time": (TimestampType,),
}


@dataclass
class Published(WriterCommitMessage):
    """What one task published: rows stored, and rows the broker had stored already."""

    rows: int
    duplicates: int


def check_schema(schema: StructType, options: WriteOptions) -> None:
    """Refuse, before any task runs, a DataFrame the sink cannot publish. Columns other than
    topic, key, payload, properties and event_time are ignored (a read DataFrame can be
    written back as it is)."""
    fields = {field.name: field.dataType for field in schema.fields}
    if "payload" not in fields:
        raise OptionError("the DataFrame to write needs a 'payload' column (binary or string)")
    if options.topic is None and "topic" not in fields:
        raise OptionError("give a 'topic' option or a 'topic' column to write to")
    for name, kinds in _COLUMNS.items():
        if name in fields and not isinstance(fields[name], kinds):
            expected = " or ".join(kind.typeName() for kind in kinds)
            found = fields[name].simpleString()
            raise OptionError(f"column {name!r} must be {expected}, not {found}")
    if "properties" in fields:
        kind = fields["properties"]
        assert isinstance(kind, MapType)
        if not (isinstance(kind.keyType, StringType) and isinstance(kind.valueType, StringType)):
            raise OptionError("column 'properties' must be map<string,string>")


class MopWriter(DataSourceArrowWriter):
    """Batch writes: at least once (a retried task publishes its rows again)."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        return publish(self.options, iterator, None)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info("published %d rows", sum(m.rows for m in messages if isinstance(m, Published)))


class MopStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writes: every micro-batch is published idempotently (see the module)."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        context = TaskContext.get()
        assert context is not None, "a stream writer runs in a Spark task"
        query = context.getLocalProperty("sql.streaming.queryId")
        batch = context.getLocalProperty("streaming.sql.batchId")
        identity = None
        if query and batch:
            identity = _Identity(
                f"{self.options.producer_name}-{query}-{context.partitionId()}", int(batch)
            )
        return publish(self.options, iterator, identity)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        done = [m for m in messages if isinstance(m, Published)]
        log.info(
            "batch %d: published %d rows (%d already stored)",
            batchId,
            sum(m.rows for m in done),
            sum(m.duplicates for m in done),
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Rows already stored stay; the batch runs again and is deduplicated against them.
        log.warning("micro-batch %d aborted; its rows already published stay", batchId)


# --- publishing ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Identity:
    """The producer name and the sequence ids of one task of one micro-batch."""

    producer_name: str
    batch_id: int

    def sequence_id(self, row: int) -> int:
        # Above every id of earlier batches; never 0, which pulsar-client reads as "unset".
        return (self.batch_id << _ROWS_PER_BATCH_BITS) + row + 1


class _LargeSends:
    """The answers to the sends that may fail alone (see `publish`); they arrive on
    pulsar-client's threads."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self.expected = 0
        self.answered = 0
        self.failures: list[str] = []

    def callback(self, result: Any, _message_id: Any) -> None:
        with self._lock:
            self.answered += 1
            if result != pulsar.Result.Ok:
                self.failures.append(str(result))
            self._lock.notify_all()

    def check(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._lock:
            while self.answered < self.expected:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no answer to a send after {timeout} s")
                self._lock.wait(remaining)
            if self.failures:
                raise RuntimeError(f"publishing failed: {self.failures[0]}")


def publish(
    options: WriteOptions, batches: Iterable[pa.RecordBatch], identity: _Identity | None
) -> Published:
    """Publish every row and return once the broker has stored them all (or raise).

    Sends carry no callback: pulsar-client calls each one on its own thread, which must take
    the GIL from the sending thread, and that hand-over costs more than the send. Without a send
    timeout a producer does not fail one message and then store a later one: it retries until
    it fails for good, and then fails every later message too. So a successful `flush` means
    that every earlier send of that producer succeeded. The exception is a message too large
    for the broker, refused alone when it is sent: large messages get a callback.
    """
    client = open_client(options.service_url, options.timeout_ms, options.security)
    producers = _Producers(client, options, identity)
    large = _LargeSends()
    sent = duplicates = row = 0
    try:
        for batch in batches:
            for topic, payload, key, properties, event_time in _rows(batch, options):
                row += 1
                producer, last = producers.get(topic)
                sequence_id = None
                if identity is not None:
                    sequence_id = identity.sequence_id(row - 1)
                    if sequence_id <= last:
                        duplicates += 1  # stored by an earlier attempt of this batch
                        continue
                callback = None
                if len(payload) >= _LARGE:
                    callback = large.callback
                    large.expected += 1
                producer.send_async(
                    payload,
                    callback,
                    properties=properties,
                    partition_key=key,
                    sequence_id=sequence_id,
                    event_timestamp=event_time,
                )
                sent += 1
        producers.flush(options.timeout_ms / 1000)
        large.check(options.timeout_ms / 1000)
    finally:
        producers.close()
        client.close()
    return Published(rows=sent, duplicates=duplicates)


class _Producers:
    """One batching producer per topic, created on first use."""

    def __init__(self, client: pulsar.Client, options: WriteOptions, identity: _Identity | None):
        self._client = client
        self._options = options
        self._identity = identity
        self._open: dict[str, tuple[Any, int]] = {}

    def get(self, topic: str) -> tuple[Any, int]:
        """The producer for `topic` and the last sequence id the broker stored for it."""
        found = self._open.get(topic)
        if found is None:
            options = self._options
            producer = self._client.create_producer(
                topic,
                producer_name=None if self._identity is None else self._identity.producer_name,
                batching_enabled=True,
                batching_max_messages=options.batching_max_messages,
                batching_max_allowed_size_in_bytes=1 << 20,
                batching_max_publish_delay_ms=options.batching_max_publish_delay_ms,
                max_pending_messages=10 * options.batching_max_messages,
                block_if_queue_full=True,
                send_timeout_millis=0,  # never: see `publish`; `flush` has a deadline instead
            )
            found = self._open[topic] = (producer, producer.last_sequence_id())
        return found

    def flush(self, timeout: float) -> None:
        """Wait until the broker has stored everything sent, at most `timeout` seconds."""
        failures: list[BaseException] = []

        def flush_all() -> None:
            try:
                for producer, _ in self._open.values():
                    producer.flush()
            except Exception as exc:  # raised again in the task's thread
                failures.append(exc)

        # flush() cannot be given a deadline; a thread that is still blocked after it ends
        # when the client closes (which fails what is pending).
        flusher = threading.Thread(target=flush_all, name="mop-spark-flush", daemon=True)
        flusher.start()
        flusher.join(timeout)
        if flusher.is_alive():
            raise TimeoutError(f"the broker did not store the rows within {timeout} s")
        if failures:
            raise RuntimeError(f"publishing failed: {failures[0]}") from failures[0]

    def close(self) -> None:
        for producer, _ in self._open.values():
            producer.close()
        self._open.clear()


_Row = tuple[str, bytes, str | None, dict[str, str] | None, int | None]


def _rows(batch: pa.RecordBatch, options: WriteOptions) -> Iterator[_Row]:
    """(Pulsar topic, payload, key, properties, event time in ms) for each row of a batch."""
    count = batch.num_rows
    names = batch.schema.names
    nothing: list[Any] = [None] * count

    def column(name: str) -> list[Any]:
        return batch.column(name).to_pylist() if name in names else nothing

    payloads = column("payload")
    if batch.schema.field("payload").type != pa.binary():
        payloads = [None if p is None else p.encode() for p in payloads]
    keys = column("key")
    properties = [None if p is None else dict(p) for p in column("properties")]
    event_times = nothing
    if "event_time" in names:
        micros = pc.cast(batch.column("event_time"), pa.int64()).to_pylist()
        event_times = [None if t is None else t // 1000 for t in micros]
    topics = _topics(column("topic"), options)
    for i in range(count):
        payload = payloads[i]
        yield topics[i], b"" if payload is None else payload, keys[i], properties[i], event_times[i]


def _topics(values: list[Any], options: WriteOptions) -> list[str]:
    if options.topic is not None:
        return [options.topic] * len(values)
    mapped: dict[str, str] = {}
    topics = []
    for value in values:
        if value is None:
            raise ValueError("a row to write has no topic (the 'topic' column is null)")
        topic = mapped.get(value)
        if topic is None:
            topic = mapped[value] = mqtt_to_pulsar(
                value, tenant=options.tenant, namespace=options.namespace
            )
        topics.append(topic)
    return topics
