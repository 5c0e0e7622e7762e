"""A topic's stats in the words of the backend contract (`TopicStats`), read from the broker's
own state: its counters, its subscriptions' cursors and consumers, its storage."""

from __future__ import annotations

from collections.abc import Iterable

from mop.broker import Attachment, Broker
from mop.broker.cursor import Cursor
from mop.broker.topic import Topic
from mop.processor.backend import ConsumerStats, SubscriptionStats, TopicStats, Traffic
from mop.rates import RateMeter

__all__ = ["topic_stats"]


def topic_stats(broker: Broker, name: str, now: float) -> TopicStats | None:
    """The stats of topic `name` at `now` (wall-clock seconds), or None when the broker has no
    such topic."""
    topic = broker.topic(name)
    if topic is None:
        return None
    subscriptions = tuple(_subscription(cursor, now) for cursor in topic.cursors)
    return TopicStats(
        topic=name,
        inbound=_inbound(topic, now),
        outbound=_total(sub.outbound for sub in subscriptions),
        storage_size=broker.storage.topic_size(name) if topic.persistent else 0,
        producers=tuple(handle.name for handle in broker.producers.producers(name)),
        subscriptions=subscriptions,
    )


def _inbound(topic: Topic, now: float) -> Traffic:
    if topic.meter is None:
        topic.meter = RateMeter(topic.loaded_at, 2)
    counts = (topic.messages_in, topic.bytes_in)
    message_rate, byte_rate = topic.meter.read(now, counts)
    return Traffic(counts[0], counts[1], message_rate, byte_rate)


def _subscription(cursor: Cursor, now: float) -> SubscriptionStats:
    if cursor.meter is None:
        cursor.meter = RateMeter(cursor.since, 2)
    counts = (cursor.messages_out, cursor.bytes_out)
    message_rate, byte_rate = cursor.meter.read(now, counts)
    sub = cursor.sub
    return SubscriptionStats(
        name=sub.name,
        kind=sub.type,
        backlog=cursor.owed(),
        consumers=tuple(_consumer(att, cursor.topic.name) for att in sub.attachments),
        outbound=Traffic(counts[0], counts[1], message_rate, byte_rate),
        durable=sub.durable,
    )


def _consumer(att: Attachment, topic: str) -> ConsumerStats:
    _priority, consumer_name = att.rank
    return ConsumerStats(
        name=consumer_name or att.member,
        unacked=sum(1 for key in att.unacked if key[0] == topic),
        permits=att.credit,
    )


def _total(traffic: Iterable[Traffic]) -> Traffic:
    parts = list(traffic)
    return Traffic(
        sum(part.messages for part in parts),
        sum(part.bytes for part in parts),
        sum(part.message_rate for part in parts),
        sum(part.byte_rate for part in parts),
    )
