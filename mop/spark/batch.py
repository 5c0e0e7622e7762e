"""Batch reads (`spark.read.format("mop")`): fixed ranges planned once per query.

Planning finds the topics and pins where each one ends (the last message now, or the given
`ending_offsets`), so every task of the query reads an exact, known range and the result does
not depend on when tasks run. Each topic is one Spark partition, or, with
`max_records_per_partition`, several ranges of it, read in parallel (brokers read a reader's
backlog lazily, mop a chunk at a time, so a range costs what it holds).
"""

from __future__ import annotations

from collections.abc import Iterator

import pulsar
import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from mop.message import MessageId
from mop.spark.client import find_topics, first_after, last_message_ids, open_client
from mop.spark.options import ReadOptions
from mop.spark.positions import order_key
from mop.spark.reading import TopicRange, read_range, split_range
from mop.spark.topics import topic_names

__all__ = ["MopBatchReader"]


class MopBatchReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        options = self.options
        client = open_client(options.service_url, options.timeout_ms, options.security)
        try:
            topics = find_topics(client, options)
            ranges: list[InputPartition] = []
            for topic, last in last_message_ids(client, topics, options.timeout_ms).items():
                ranges += self._plan(client, topic, last)
            return ranges
        finally:
            client.close()

    def _plan(self, client: pulsar.Client, topic: str, last: MessageId | None) -> list[TopicRange]:
        options = self.options
        if last is None:
            return []
        parent = topic_names(topic, tenant=options.tenant, namespace=options.namespace).pulsar
        start = options.starting.position(topic, parent, last)
        end = options.ending.position(topic, parent, last)
        if order_key(end) > order_key(last):
            end = last
        if order_key(start) >= order_key(end):
            return []
        size = options.max_records_per_partition
        if size is None:
            return [TopicRange(topic, start, end)]
        first = None
        if start.ledger != end.ledger and end.entry >= size:
            # Only worth a look when the range may hold more than one partition's worth.
            first = first_after(client, topic, start, options.timeout_ms)
        return split_range(topic, start, end, size, first)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # With no ranges at all Spark still runs one task, with InputPartition(None).
        if isinstance(partition, TopicRange):
            yield from read_range(self.options, partition)
