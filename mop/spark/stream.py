"""Streaming reads (`spark.readStream.format("mop")`): offsets are the last message id read per
topic, so a query resumes from its checkpoint exactly where it stopped.

Spark runs this reader in one long-lived process per query (the source runner) and ships a
separate, pickled copy to the tasks, which only call `read`; so live connections are opened
lazily here and never pickled, and a task gets everything it needs in its `TopicRange`.

Topics that match the selection later (a new MQTT topic under a filter) join at the next
trigger, from their first message. With the `subscription` option the runner also keeps a
durable subscription on every topic it reads and acknowledges it up to each committed offset:
the broker then keeps everything the query has not processed yet, also while it is stopped and
beyond the retention policy (24 hours on a fresh mop node; nothing in Apache Pulsar without
retention) that otherwise bounds how far back a query reads.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any

import pulsar
import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from mop.message import MessageId
from mop.spark.client import (
    find_topics,
    first_after,
    from_pulsar_id,
    last_message_ids,
    open_client,
    to_pulsar_id,
)
from mop.spark.options import ReadOptions
from mop.spark.positions import (
    EARLIEST,
    Offsets,
    advance,
    offsets_from_json,
    offsets_to_json,
    order_key,
    whole_entries_through,
)
from mop.spark.reading import TopicRange, read_range, split_range
from mop.spark.topics import topic_names

__all__ = ["MopStreamReader"]

log = logging.getLogger(__name__)


class MopStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._client: pulsar.Client | None = None
        self._holders: dict[str, Any] = {}  # topic -> consumer of the holding subscription
        self._target: Offsets | None = None  # the end under Trigger.AvailableNow

    def __getstate__(self) -> dict[str, Any]:
        # Connections belong to the source runner; a pickled copy starts without any.
        return {**self.__dict__, "_client": None, "_holders": {}}

    # -- Spark's calls (all in the source runner except `read`) ---------------------------

    def initialOffset(self) -> dict[str, str]:
        offsets: Offsets = {}
        topics = find_topics(self._connection(), self.options)
        for topic, last in self._last_ids(topics).items():
            parent = topic_names(
                topic, tenant=self.options.tenant, namespace=self.options.namespace
            ).pulsar
            offsets[topic] = self.options.starting.position(topic, parent, last)
        return offsets_to_json(offsets)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_records_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def latestOffset(self, start: dict[str, str], limit: ReadLimit) -> dict[str, str]:
        begin = offsets_from_json(start)
        latest = self._available(begin)
        if self._target is not None:
            latest = _capped(begin, latest, self._target)
        if isinstance(limit, ReadMaxRows):
            latest = self._limited(begin, latest, limit.max_rows)
        return offsets_to_json(latest)

    def prepareForTriggerAvailableNow(self) -> None:
        # Everything there now, and nothing that comes later.
        self._target = self._available({})

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> Sequence[InputPartition]:
        begin = offsets_from_json(start)
        ranges: list[InputPartition] = []
        for topic, stop in sorted(offsets_from_json(end).items()):
            first = begin.get(topic, EARLIEST)
            if order_key(stop) <= order_key(first):
                continue
            size = self.options.max_records_per_partition
            if size is None:
                ranges.append(TopicRange(topic, first, stop))
            else:
                ranges += split_range(topic, first, stop, size)
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, TopicRange)
        return read_range(self.options, partition)

    def commit(self, end: dict[str, str]) -> None:
        """Spark has stored that the query processed everything up to `end`: let the holding
        subscription go up to there (the last whole entry: a batch may be half read)."""
        if self.options.subscription is None:
            return
        for topic, position in offsets_from_json(end).items():
            through = whole_entries_through(position)
            if through is not None:
                self._holder(topic).acknowledge_cumulative(to_pulsar_id(through))

    def stop(self) -> None:
        client, self._client, self._holders = self._client, None, {}
        if client is not None:
            client.close()

    # -- positions -----------------------------------------------------------------------

    def _available(self, begin: Offsets) -> Offsets:
        """Where each topic ends now: known topics and those that match the selection now (a
        new topic only once it has a message). Never before `begin`."""
        latest = dict(begin)
        topics = sorted(set(find_topics(self._connection(), self.options)) | set(begin))
        for topic, last in self._last_ids(topics).items():
            known = begin.get(topic)
            if last is None:
                continue
            if known is None or order_key(last) > order_key(known):
                latest[topic] = last
        return latest

    def _limited(self, begin: Offsets, latest: Offsets, max_entries: int) -> Offsets:
        """`latest`, cut so that the next batch holds about `max_entries` stored entries, shared
        evenly by the topics that have new messages."""
        behind = [t for t in latest if order_key(latest[t]) > order_key(begin.get(t, EARLIEST))]
        if not behind:
            return latest
        share = max(1, math.ceil(max_entries / len(behind)))
        limited = dict(latest)
        for topic in behind:
            start = begin.get(topic, EARLIEST)
            first = self._next(topic, start, latest[topic])
            limited[topic] = start if first is None else advance(first, latest[topic], share)
        return limited

    def _next(self, topic: str, start: MessageId, latest: MessageId) -> MessageId | None:
        """The first message after `start` (an approximation within one ledger: its entry)."""
        if start != EARLIEST and start.ledger == latest.ledger:
            whole = start.batch_index < 0
            return MessageId(start.ledger, start.entry + 1 if whole else start.entry)
        return first_after(self._connection(), topic, start, self.options.timeout_ms)

    def _last_ids(self, topics: list[str]) -> dict[str, MessageId | None]:
        if self.options.subscription is None:
            return last_message_ids(self._connection(), topics, self.options.timeout_ms)
        found: dict[str, MessageId | None] = {}
        for topic in topics:
            last = from_pulsar_id(self._holder(topic).get_last_message_id())
            found[topic] = None if last.ledger < 0 else last
        return found

    # -- connections ---------------------------------------------------------------------

    def _connection(self) -> pulsar.Client:
        if self._client is None:
            self._client = open_client(
                self.options.service_url, self.options.timeout_ms, self.options.security
            )
        return self._client

    def _holder(self, topic: str) -> Any:
        """The consumer of the holding subscription on `topic`, subscribed on first use.

        It never receives (no prefetch): it is there to hold messages and to move its
        subscription forward. Failover lets a restarted query subscribe while the connection of
        the stopped one is still being closed.
        """
        consumer = self._holders.get(topic)
        if consumer is None:
            assert self.options.subscription is not None
            consumer = self._connection().subscribe(
                topic,
                self.options.subscription,
                consumer_type=pulsar.ConsumerType.Failover,
                initial_position=pulsar.InitialPosition.Earliest,
                receiver_queue_size=0,
            )
            self._holders[topic] = consumer
            log.info("holding %s with subscription %r", topic, self.options.subscription)
        return consumer


def _capped(begin: Offsets, latest: Offsets, target: Offsets) -> Offsets:
    """`latest`, but nowhere past `target` (topics `target` does not know stay at `begin`)."""
    capped = dict(begin)
    for topic, position in latest.items():
        if topic in target:
            ends = sorted((position, target[topic]), key=order_key)
            floor = begin.get(topic, EARLIEST)
            capped[topic] = ends[0] if order_key(ends[0]) > order_key(floor) else floor
    return capped
