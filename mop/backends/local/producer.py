"""`LocalProducer`: a producer registered with the broker's producer rules."""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import trio

from mop.backends.local.errors import translated
from mop.broker import ProducerHandle, Published, Sequenced
from mop.message import Message
from mop.processor.backend import BackendError, ProducerFenced, ProducerSpec, PublishResult

if TYPE_CHECKING:
    from mop.backends.local.backend import LocalBackend

__all__ = ["LocalProducer"]


class _Stored:
    """The awaitable `LocalProducer.send` returns: the message is in place, and awaiting
    makes it durable (a coroutine only comes to life when awaited, so an unawaited one is no
    leak)."""

    __slots__ = ("_backend", "_published", "_sync")

    def __init__(self, backend: LocalBackend, published: Published, sync: bool) -> None:
        self._backend = backend
        self._published = published
        self._sync = sync

    def __await__(self) -> Generator[Any, None, PublishResult]:
        return self._wait().__await__()

    async def _wait(self) -> PublishResult:
        published = self._published
        if self._sync:
            with translated():
                await self._backend.storage.sync()
        else:
            await trio.lowlevel.checkpoint()
        return PublishResult(published.message_id, published.subscriptions, published.duplicate)


class LocalProducer:
    """A producer registered with the broker's producer rules for its topic."""

    def __init__(self, backend: LocalBackend, spec: ProducerSpec) -> None:
        self._backend = backend
        self._spec = spec
        self._changed = trio.Event()
        with translated():
            self._handle: ProducerHandle = backend.broker.producers.add(
                spec.topic,
                spec.name,
                spec.access,
                epoch=spec.epoch,
                topic_epoch=spec.topic_epoch,
                on_change=self._notify,
            )

    def _notify(self) -> None:
        self._changed.set()

    @property
    def spec(self) -> ProducerSpec:
        return self._spec

    @property
    def ready(self) -> bool:
        return self._handle.ready

    @property
    def topic_epoch(self) -> int | None:
        return self._handle.topic_epoch

    @property
    def last_sequence_id(self) -> int:
        return self._backend.broker.sequences.last(self._spec.topic, self._spec.name)

    async def _wait_change(self) -> None:
        if self._changed.is_set():
            self._changed = trio.Event()
        await self._changed.wait()

    async def wait_ready(self) -> None:
        handle = self._handle
        while not handle.ready:
            if handle.closed:
                raise ProducerFenced(f"producer {self._spec.name!r} will not get the topic")
            await self._wait_change()
        await trio.lowlevel.checkpoint()

    async def wait_fenced(self) -> None:
        handle = self._handle
        while not handle.fenced:
            await self._wait_change()

    def send(
        self, message: Message, *, sequence_id: int = -1, highest_sequence_id: int = -1
    ) -> _Stored:
        handle = self._handle
        if handle.fenced:
            raise ProducerFenced(f"producer {self._spec.name!r} was fenced")
        if handle.closed or not handle.ready:
            raise BackendError(f"producer {self._spec.name!r} cannot send now", reason="closed")
        backend = self._backend
        backend._check_running()
        sequence = None
        if sequence_id >= 0:
            sequence = Sequenced(
                self._spec.name,
                sequence_id,
                max(sequence_id, highest_sequence_id),
                durable=self._spec.durable_name,
            )
        with translated():
            published = backend.broker.store(self._spec.topic, message, sequence=sequence)
        if message.deliver_at:
            backend._delays_changed()
        # A named producer's receipt says the message is written, whatever QoS it carries (a
        # QoS 0 one is routed before that, see `Broker._route`, but its receipt waits).
        sync = not published.duplicate
        return _Stored(backend, published, sync)

    async def close(self) -> None:
        broker = self._backend.broker
        broker.producers.remove(self._handle)
        broker.close_topic(self._spec.topic)
        self._changed.set()
        await trio.lowlevel.checkpoint()
