"""The producer of a produce or send call: one registered processor producer for an ordinary
topic, one per partition for a partitioned topic (a message goes to the partition
`PartitionRouter` picks, as Pulsar's Java client sends it), under the name the call gave or
one the node makes.

A backend without registered producers (a separated proxy's: they are the Pulsar adapter's,
on brokers) is published to through the processor instead, as MQTT clients are: the producer
name then names the messages' producer only, sequence ids are not deduplicated, and only the
shared access mode can be had (FAILED_PRECONDITION for the others).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager

import trio

from mop.message import Message
from mop.processor import (
    BackendError,
    ClientContext,
    MessagingProcessor,
    Producer,
    ProducerAccess,
    ProducerSpec,
    PublishResult,
)
from mop.protocols.grpc.errors import backend_status
from mop.protocols.grpc.metadata import ProducerOpen
from mop.protocols.grpc.routing import PartitionRouter
from mop.protocols.grpc.serving.partitions import topics_of
from mop.protocols.grpc.status import GrpcError, StatusCode

# The reason a backend gives for what it does not do (`mop.backends.cluster`).
_NOT_SUPPORTED = "not_supported"


class ProducerNames:
    """The names the node gives producers that bring none: unique across restarts, since a
    producer's name keys its sequence ids (deduplication)."""

    def __init__(self) -> None:
        self._boot = uuid.uuid4().hex[:8]
        self._count = itertools.count()

    def next(self) -> str:
        return f"grpc-{self._boot}-{next(self._count)}"


class TopicProducer:
    """What a call produces through: the topics it sends to (the partitions, for a
    partitioned topic) and their registered producers, when the backend has them."""

    def __init__(
        self, topic: str, name: str, topics: list[str], producers: list[Producer] | None
    ) -> None:
        # The topic the call named (the partitioned topic, for one).
        self.topic = topic
        self.name = name
        self._topics = topics
        # None: published through the processor (no registered producers).
        self._producers = producers
        self._router = PartitionRouter(len(topics)) if len(topics) > 1 else None

    @property
    def registered(self) -> bool:
        return self._producers is not None

    def partition(self, message: Message) -> int:
        """The partition `message` goes to (0 for a topic without partitions)."""
        return 0 if self._router is None else self._router.partition(message.key)

    def topic_of(self, partition: int) -> str:
        return self._topics[partition]

    def send(self, partition: int, message: Message, sequence_id: int) -> Awaitable[PublishResult]:
        """Store `message` behind those sent before through the registered producer of
        `partition` (see `Producer.send`); BackendError at once when it cannot be taken."""
        assert self._producers is not None, "registered producers only"
        return self._producers[partition].send(message, sequence_id=sequence_id)

    async def wait_ready(self) -> None:
        """Return once every producer may send (a wait-for-exclusive producer waits for its
        topic); ABORTED when one never will."""
        for producer in self._producers or ():
            try:
                await producer.wait_ready()
            except BackendError as exc:
                raise backend_status(exc) from None

    async def wait_fenced(self) -> None:
        """Return when another producer took one of the topics over (never, without
        registered producers)."""
        async with trio.open_nursery() as nursery:
            if not self._producers:
                nursery.start_soon(trio.sleep_forever)
            for producer in self._producers or ():
                nursery.start_soon(_fenced, producer, nursery.cancel_scope)


async def _fenced(producer: Producer, scope: trio.CancelScope) -> None:
    await producer.wait_fenced()
    scope.cancel()


@asynccontextmanager
async def open_topic_producer(
    processor: MessagingProcessor,
    ctx: ClientContext,
    topic: str,
    request: ProducerOpen,
    names: ProducerNames,
) -> AsyncIterator[TopicProducer]:
    """Register the call's producer(s) on `topic` (a full name) for as long as the block runs;
    the status of a BackendError that refuses one (ALREADY_EXISTS for a busy name or topic)."""
    topics = await topics_of(processor, topic)
    name = request.producer_name or names.next()
    producers: list[Producer] = []
    unsupported: BackendError | None = None
    try:
        for each in topics:
            spec = ProducerSpec(
                topic=each,
                name=name,
                access=request.access,
                durable_name=request.producer_name is not None,
            )
            try:
                producers.append(await processor.open_producer(ctx, spec))
            except BackendError as exc:
                if exc.reason != _NOT_SUPPORTED:
                    raise backend_status(exc) from None
                unsupported = exc
                break
        if unsupported is not None:
            yield _publishing(topic, name, topics, request, unsupported)
        else:
            yield TopicProducer(topic, name, topics, producers)
    finally:
        with trio.CancelScope(shield=True):
            for producer in producers:
                await producer.close()


def _publishing(
    topic: str, name: str, topics: list[str], request: ProducerOpen, refusal: BackendError
) -> TopicProducer:
    """A producer that publishes through the processor, for a backend without registered
    producers; FAILED_PRECONDITION for an access mode only those give."""
    if request.access is not ProducerAccess.SHARED:
        raise GrpcError(
            StatusCode.FAILED_PRECONDITION,
            f"access mode {request.access.value!r} needs a registered producer: {refusal}",
        )
    return TopicProducer(topic, name, topics, None)


__all__ = ["ProducerNames", "TopicProducer", "open_topic_producer"]
