"""The topics a call produces to or consumes from: a partitioned topic's partitions, as
pulsar-client uses them, or the topic alone."""

from __future__ import annotations

from mop.partitioned import partitions_of
from mop.processor import BackendError, MessagingProcessor
from mop.protocols.grpc.errors import backend_status


async def topics_of(processor: MessagingProcessor, topic: str) -> list[str]:
    """The partitions of `topic` (a full name) when it is a partitioned topic, else `topic`
    alone; the status of a BackendError when the backend cannot tell (UNAVAILABLE while a
    separated proxy cannot reach its brokers)."""
    try:
        count = await processor.partitioned.partitions(topic)
    except BackendError as exc:
        raise backend_status(exc) from None
    return partitions_of(topic, count) if count else [topic]


__all__ = ["topics_of"]
