"""The rows of the `mop` data source: the Spark schema, its Arrow twin, and batches of rows.

Rows cross from the Python worker to the JVM as Arrow record batches, which must match the
schema exactly (timestamps are microseconds in UTC). Building columns and converting them once
per batch is several times faster than yielding one tuple per message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import pyarrow as pa

from mop.spark.topics import TopicNames

__all__ = ["ARROW_SCHEMA", "ROWS_PER_BATCH", "SCHEMA", "RowBatch"]

SCHEMA: Final = (
    "topic STRING, pulsar_topic STRING, partition INT, key STRING, payload BINARY,"
    " properties MAP<STRING, STRING>, publish_time TIMESTAMP, event_time TIMESTAMP,"
    " message_id STRING"
)
_TIME: Final = pa.timestamp("us", tz="UTC")
ARROW_SCHEMA: Final = pa.schema(
    [
        ("topic", pa.string()),
        ("pulsar_topic", pa.string()),
        ("partition", pa.int32()),
        ("key", pa.string()),
        ("payload", pa.binary()),
        ("properties", pa.map_(pa.string(), pa.string())),
        ("publish_time", _TIME),
        ("event_time", _TIME),
        ("message_id", pa.string()),
    ]
)
ROWS_PER_BATCH: Final = 10_000


class RowBatch:
    """Columns of the rows read from one topic, turned into a record batch by `take`."""

    __slots__ = ("_event", "_ids", "_keys", "_names", "_payloads", "_properties", "_published")

    def __init__(self, names: TopicNames) -> None:
        self._names = names
        self._keys: list[str | None] = []
        self._payloads: list[bytes] = []
        self._properties: list[Sequence[tuple[str, str]]] = []
        self._published: list[int] = []
        self._event: list[int | None] = []
        self._ids: list[str] = []

    def _clear(self) -> None:
        self._keys = []
        self._payloads = []
        self._properties = []
        self._published = []
        self._event = []
        self._ids = []

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, message: Any, message_id: str) -> None:
        """Add a pulsar-client message (times in ms since the epoch; 0 means unset)."""
        self._keys.append(message.partition_key() or None)
        self._payloads.append(message.data())
        properties = message.properties()
        self._properties.append(list(properties.items()) if properties else [])
        self._published.append(message.publish_timestamp() * 1000)
        event = message.event_timestamp()
        self._event.append(event * 1000 if event else None)
        self._ids.append(message_id)

    def extend(
        self,
        keys: Sequence[str | None],
        payloads: Sequence[bytes],
        properties: Sequence[Sequence[tuple[str, str]]],
        published: int,
        event: Sequence[int | None],
        ids: Sequence[str],
    ) -> None:
        """Add the rows of one entry, column by column (times in microseconds since the
        epoch; `published` is the entry's, shared by its rows)."""
        self._keys += keys
        self._payloads += payloads
        self._properties += properties
        self._published += [published] * len(ids)
        self._event += event
        self._ids += ids

    def take(self) -> pa.RecordBatch:
        """The rows added so far as one record batch; the buffer starts empty again."""
        count = len(self._ids)
        names = self._names
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array([names.mqtt] * count, pa.string()),
                pa.array([names.pulsar] * count, pa.string()),
                pa.array([names.partition] * count, pa.int32()),
                pa.array(self._keys, pa.string()),
                pa.array(self._payloads, pa.binary()),
                pa.array(self._properties, ARROW_SCHEMA.field("properties").type),
                pa.array(self._published, _TIME),
                pa.array(self._event, _TIME),
                pa.array(self._ids, pa.string()),
            ],
            schema=ARROW_SCHEMA,
        )
        self._clear()
        return batch
