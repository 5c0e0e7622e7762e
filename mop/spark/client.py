"""The pulsar-client calls of the data source: clients, where a topic ends, where it goes on.

Everything here works against any Pulsar-protocol service (a mop node, a mop broker cluster,
Apache Pulsar) and holds no state between calls, so each Spark process opens what it needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

import pulsar

from mop.message import MessageId
from mop.spark.namespace import list_topics
from mop.spark.options import NO_SECURITY, ClientSecurity, ReadOptions
from mop.spark.positions import EARLIEST, order_key
from mop.spark.security import client_options
from mop.spark.topics import listing_namespaces, matching, named_topics

__all__ = [
    "find_topics",
    "first_after",
    "from_pulsar_id",
    "last_message_id",
    "last_message_ids",
    "open_client",
    "partitions_of",
    "to_pulsar_id",
]

# Lookups of last message ids in flight at once (pulsar-client blocks without the GIL).
_CONCURRENT_LOOKUPS: Final = 16
# How long a look at one message may take before it counts as not there.
_PEEK_MS: Final = 5000


def open_client(
    service_url: str, timeout_ms: int, security: ClientSecurity = NO_SECURITY
) -> pulsar.Client:
    """A client authenticated and checking the brokers as `security` says."""
    return pulsar.Client(
        service_url,
        operation_timeout_seconds=max(1, timeout_ms // 1000),
        io_threads=1,
        message_listener_threads=1,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
        **client_options(security),
    )


def to_pulsar_id(position: MessageId) -> Any:
    if position == EARLIEST:
        return pulsar.MessageId.earliest
    return pulsar.MessageId(-1, position.ledger, position.entry, position.batch_index)


def from_pulsar_id(message_id: Any) -> MessageId:
    return MessageId(message_id.ledger_id(), message_id.entry_id(), message_id.batch_index())


def find_topics(client: pulsar.Client, options: ReadOptions) -> list[str]:
    """The Pulsar topics the options select now, partitions one by one, sorted."""
    where = {"tenant": options.tenant, "namespace": options.namespace}
    found: set[str] = set()
    for topic in named_topics(options.selection, **where):
        found.update(partitions_of(client, topic))
    for namespace in listing_namespaces(options.selection, **where):
        listed = list_topics(
            options.service_url,
            namespace,
            timeout=options.timeout_ms / 1000,
            security=options.security,
        )
        found.update(matching(options.selection, listed, **where))
    return sorted(found)


def partitions_of(client: pulsar.Client, topic: str) -> list[str]:
    """The topics to read for `topic`: its partitions, or the topic itself."""
    return list(client.get_topic_partitions(topic))


def last_message_ids(
    client: pulsar.Client, topics: Sequence[str], timeout_ms: int
) -> dict[str, MessageId | None]:
    """`last_message_id` of each topic, asked concurrently: each answer takes a reconnection
    (about 0.1 s of waiting, hardly any work)."""
    if len(topics) <= 1:
        return {topic: last_message_id(client, topic, timeout_ms) for topic in topics}
    with ThreadPoolExecutor(max_workers=min(_CONCURRENT_LOOKUPS, len(topics))) as pool:
        found = pool.map(lambda topic: last_message_id(client, topic, timeout_ms), topics)
        return dict(zip(topics, found, strict=True))


def last_message_id(client: pulsar.Client, topic: str, timeout_ms: int) -> MessageId | None:
    """The id of the last message of `topic` now (None: it has none).

    A reader that starts at "latest" inclusively is positioned on the last message, which
    needs no subscription on the broker (a consumer's get_last_message_id would). The client
    gets there by asking for the last id and seeking to it, which reconnects the reader.
    """
    reader = client.create_reader(
        topic, pulsar.MessageId.latest, start_message_id_inclusive=True, receiver_queue_size=1
    )
    try:
        if not reader.has_message_available():
            return None
        # The message is normally there at once. When it is not, it was deleted after
        # everyone acknowledged it, and there is nothing to read anyway.
        return from_pulsar_id(reader.read_next(min(timeout_ms, _PEEK_MS)).message_id())
    except pulsar.Timeout:
        return None
    finally:
        reader.close()


def first_after(
    client: pulsar.Client, topic: str, start: MessageId, timeout_ms: int
) -> MessageId | None:
    """The id of the first message after position `start` (None: there is none yet)."""
    reader = client.create_reader(topic, to_pulsar_id(start), receiver_queue_size=100)
    try:
        after = order_key(start)
        # A reader may begin inside the entry of `start`; the rest of a batch is bounded.
        while reader.has_message_available():
            position = from_pulsar_id(reader.read_next(min(timeout_ms, _PEEK_MS)).message_id())
            if order_key(position) > after:
                return position
        return None
    except pulsar.Timeout:
        return None
    finally:
        reader.close()
