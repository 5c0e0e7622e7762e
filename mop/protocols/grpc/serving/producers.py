"""The producer of a produce or send call: one processor producer for an ordinary topic, one
per partition for a partitioned topic (a message goes to the partition `PartitionRouter`
picks, as Pulsar's Java client sends it), under the name the call gave or one the node makes.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager

import trio

from mop.message import Message
from mop.partitioned import partitions_of
from mop.processor import (
    BackendError,
    ClientContext,
    MessagingProcessor,
    Producer,
    ProducerSpec,
    PublishResult,
)
from mop.protocols.grpc.errors import backend_status
from mop.protocols.grpc.metadata import ProducerOpen
from mop.protocols.grpc.routing import PartitionRouter


class ProducerNames:
    """The names the node gives producers that bring none: unique across restarts, since a
    producer's name keys its sequence ids (deduplication)."""

    def __init__(self) -> None:
        self._boot = uuid.uuid4().hex[:8]
        self._count = itertools.count()

    def next(self) -> str:
        return f"grpc-{self._boot}-{next(self._count)}"


class TopicProducer:
    """What a call produces through: its topic's producer, or its partitions' producers."""

    def __init__(self, topic: str, producers: list[Producer]) -> None:
        # The topic the call named (the partitioned topic, for one).
        self.topic = topic
        self._producers = producers
        self._router = PartitionRouter(len(producers)) if len(producers) > 1 else None

    @property
    def name(self) -> str:
        return self._producers[0].spec.name

    def send(self, message: Message, sequence_id: int) -> tuple[int, Awaitable[PublishResult]]:
        """Store `message` behind those sent before (see `Producer.send`): the partition it
        goes to (0 for a topic without partitions) and the outcome to wait for. BackendError
        at once when it cannot be taken."""
        partition = 0 if self._router is None else self._router.partition(message.key)
        return partition, self._producers[partition].send(message, sequence_id=sequence_id)

    async def wait_ready(self) -> None:
        """Return once every producer may send (a wait-for-exclusive producer waits for its
        topic); ABORTED when one never will."""
        for producer in self._producers:
            try:
                await producer.wait_ready()
            except BackendError as exc:
                raise backend_status(exc) from None

    async def wait_fenced(self) -> None:
        """Return when another producer took one of the topics over."""
        async with trio.open_nursery() as nursery:
            for producer in self._producers:
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
    count = await processor.partitioned.partitions(topic)
    topics = partitions_of(topic, count) if count else [topic]
    name = request.producer_name or names.next()
    producers: list[Producer] = []
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
                raise backend_status(exc) from None
        yield TopicProducer(topic, producers)
    finally:
        with trio.CancelScope(shield=True):
            for producer in producers:
                await producer.close()


__all__ = ["ProducerNames", "TopicProducer", "open_topic_producer"]
