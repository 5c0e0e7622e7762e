"""`LocalBackend`: the `Backend` of merged mode, which calls straight into the colocated broker
and storage. Waiting (receive, fencing, delayed redelivery) is done here, with trio.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

import trio

from mop.broker import (
    BROKER_TABLE_PREFIX,
    NON_PERSISTENT,
    Attachment,
    Broker,
    BrokerError,
    BrokerStats,
    ConsumerOptions,
    ProducerAccess,
    ProducerHandle,
    Published,
    Sequenced,
    SubscriptionType,
)
from mop.broker import ProducerBusy as BrokerProducerBusy
from mop.broker import ProducerFenced as BrokerProducerFenced
from mop.broker.ownership import Ownership
from mop.broker.storage import Storage, StorageError, StorageFull
from mop.message import Delivery, Message, MessageId
from mop.processor.backend import (
    BackendError,
    ConsumerClosed,
    CursorPosition,
    ProducerBusy,
    ProducerFenced,
    ProducerSpec,
    PublishResult,
    QuotaExceeded,
    StartPosition,
    SubscriptionSpec,
)
from mop.topic_names import mqtt_to_pulsar

if TYPE_CHECKING:
    from mop.processor.backend import (
        Backend,
        BatchPublisher,
        ClientLease,
        Consumer,
        FenceNotifier,
        Producer,
        Table,
    )

__all__ = [
    "LocalBackend",
    "LocalConsumer",
    "LocalLease",
    "LocalProducer",
    "LocalTable",
    "open_local_backend",
]

# Messages a permit-based consumer may hold unacknowledged before dispatch to it pauses.
MAX_UNACKED_PER_CONSUMER = 50_000


def _translate(exc: StorageError | BrokerError) -> BackendError:
    """The error of the backend contract for a broker or storage error."""
    if isinstance(exc, StorageFull):
        return QuotaExceeded(str(exc))
    if isinstance(exc, StorageError):
        return BackendError(str(exc), reason="storage_error")
    if isinstance(exc, BrokerProducerBusy):
        return ProducerBusy(str(exc))
    if isinstance(exc, BrokerProducerFenced):
        return ProducerFenced(str(exc))
    return BackendError(str(exc), reason=exc.reason)


@contextmanager
def _translated() -> Iterator[None]:
    """Turn broker and storage errors into the errors of the backend contract (hot paths
    call `_translate` in a plain try statement instead: a context manager costs more)."""
    try:
        yield
    except (StorageError, BrokerError) as exc:
        raise _translate(exc) from exc


class LocalLease:
    """Ownership of a client id within this process. Its events are made only when a task
    waits for them: most leases are never fenced and never waited for."""

    __slots__ = (
        "_backend",
        "_client_id",
        "_fenced",
        "_fenced_event",
        "_on_fenced",
        "_released",
        "_released_event",
    )

    def __init__(self, backend: LocalBackend, client_id: str) -> None:
        self._backend = backend
        self._client_id = client_id
        self._fenced = False
        self._released = False
        self._fenced_event: trio.Event | None = None
        self._released_event: trio.Event | None = None
        self._on_fenced: Callable[[], None] | None = None

    @property
    def client_id(self) -> str:
        return self._client_id

    @property
    def fenced(self) -> bool:
        return self._fenced

    async def wait_fenced(self) -> None:
        if self._fenced:
            await trio.lowlevel.checkpoint()
            return
        if self._fenced_event is None:
            self._fenced_event = trio.Event()
        await self._fenced_event.wait()

    def on_fenced(self, callback: Callable[[], None]) -> None:
        if self._fenced:
            callback()
        else:
            self._on_fenced = callback

    async def release(self) -> None:
        self._release_now()
        await trio.lowlevel.checkpoint()

    def _fence(self) -> None:
        if self._fenced:
            return
        self._fenced = True
        if self._fenced_event is not None:
            self._fenced_event.set()
        callback, self._on_fenced = self._on_fenced, None
        if callback is not None:
            callback()

    async def _wait_released(self) -> None:
        if self._released:
            await trio.lowlevel.checkpoint()
            return
        if self._released_event is None:
            self._released_event = trio.Event()
        await self._released_event.wait()

    def _release_now(self) -> None:
        self._released = True
        self._on_fenced = None
        if self._released_event is not None:
            self._released_event.set()
        self._backend._lease_released(self)


class LocalConsumer:
    """A consumer attached to the broker; one task at a time may wait in `receive`."""

    def __init__(self, backend: LocalBackend, spec: SubscriptionSpec) -> None:
        self._backend = backend
        self._spec = spec
        self._att: Attachment | None = None
        self._wakeup: trio.Event | None = None
        self._closed = False
        self._active = False
        self._seen_active = False  # what `active_changed` last reported
        self._active_event = trio.Event()

    @property
    def spec(self) -> SubscriptionSpec:
        return self._spec

    @property
    def closed(self) -> bool:
        return self._closed

    def _on_ready(self) -> None:
        # Called by the broker when messages are queued for this consumer.
        if self._wakeup is not None:
            self._wakeup.set()

    def _on_active(self, active: bool) -> None:
        # Called by the broker when a failover subscription's active consumer changes.
        self._active = active
        self._active_event.set()

    @property
    def active(self) -> bool:
        return self._active

    async def active_changed(self) -> bool:
        while True:
            self._attachment()
            if self._active != self._seen_active:
                self._seen_active = self._active
                return self._active
            self._active_event = trio.Event()
            await self._active_event.wait()

    def _attachment(self) -> Attachment:
        if self._closed or self._att is None:
            raise ConsumerClosed(f"consumer of {self._spec.name!r} is closed")
        return self._att

    async def receive(self, max_messages: int) -> list[Delivery]:
        if max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        if self._wakeup is not None:
            raise trio.BusyResourceError("another task is already receiving from this consumer")
        await trio.lowlevel.checkpoint_if_cancelled()
        broker = self._backend.broker
        waited = False
        while True:
            att = self._attachment()
            try:
                deliveries = broker.take(att, max_messages)
            except (StorageError, BrokerError) as exc:
                raise _translate(exc) from exc
            if deliveries:
                if not waited:
                    # Messages were there at once: still let other tasks run (a long backlog
                    # must not keep the loop to itself), without a cancellation point that
                    # would lose what was just taken.
                    await trio.lowlevel.cancel_shielded_checkpoint()
                return deliveries
            event = self._wakeup = trio.Event()
            try:
                await event.wait()
            finally:
                self._wakeup = None
            waited = True

    def ack(self, deliveries: Iterable[Delivery]) -> None:
        # Acknowledging after close is a no-op: the messages went back to the subscription.
        if not self._closed and self._att is not None:
            try:
                self._backend.broker.ack(self._att, deliveries)
            except (StorageError, BrokerError) as exc:
                raise _translate(exc) from exc

    def nack(self, deliveries: Iterable[Delivery], delay: float = 0.0) -> None:
        if self._closed or self._att is None:
            return
        with _translated():
            if delay > 0:
                self._backend.broker.nack(self._att, deliveries, due=trio.current_time() + delay)
                self._backend._delays_changed()
            else:
                self._backend.broker.nack(self._att, deliveries)

    def ack_through(self, topic: str, message_id: MessageId) -> None:
        if not self._closed and self._att is not None:
            with _translated():
                self._backend.broker.ack_through(self._att, topic, message_id)

    def grant(self, permits: int) -> None:
        if not self._closed and self._att is not None:
            with _translated():
                self._backend.broker.grant(self._att, permits)

    async def seek(
        self, topic: str, *, message_id: MessageId | None = None, publish_time: int | None = None
    ) -> None:
        att = self._attachment()
        with _translated():
            await self._backend.broker.reset(
                att.sub, topic, message_id=message_id, publish_time=publish_time
            )
        self._backend._delays_changed()

    async def position(self, topic: str) -> CursorPosition:
        att = self._attachment()
        with _translated():
            last, mark = await self._backend.broker.position(att.sub, topic)
        return CursorPosition(last, mark)

    async def add_selector(self, selector: str) -> None:
        att = self._attachment()
        with _translated():
            await self._backend.broker.add_selector(att.sub, selector)
        self._spec = dataclasses.replace(self._spec, selectors=self._spec.selectors | {selector})

    async def remove_selector(self, selector: str) -> None:
        att = self._attachment()
        with _translated():
            await self._backend.broker.remove_selector(att.sub, selector)
        self._spec = dataclasses.replace(self._spec, selectors=self._spec.selectors - {selector})

    async def close(self) -> None:
        self._shutdown()
        await trio.lowlevel.checkpoint()

    async def unsubscribe(self) -> None:
        att = self._att
        already_closed = self._closed
        self._shutdown()
        if att is not None and not already_closed:
            with _translated():
                await self._backend.broker.unsubscribe(att)
        else:
            await trio.lowlevel.checkpoint()

    def _shutdown(self) -> None:
        """Detach from the broker and wake a waiting `receive`, which then raises."""
        if self._closed:
            return
        self._closed = True
        self._backend._consumers.discard(self)
        if self._att is not None:
            with _translated():
                self._backend.broker.close(self._att)
        if self._wakeup is not None:
            self._wakeup.set()
        self._active_event.set()


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
            with _translated():
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
        with _translated():
            self._handle: ProducerHandle = backend.broker.producers.add(
                spec.topic,
                spec.name,
                ProducerAccess(spec.access.value),
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
        with _translated():
            published = backend.broker.store(self._spec.topic, message, sequence=sequence)
        if message.deliver_at:
            backend._delays_changed()
        sync = bool(message.qos) and not published.duplicate
        return _Stored(backend, published, sync)

    async def close(self) -> None:
        self._backend.broker.producers.remove(self._handle)
        self._changed.set()
        await trio.lowlevel.checkpoint()


class LocalTable:
    """A table kept in memory and written through to storage."""

    def __init__(self, storage: Storage, name: str) -> None:
        self._storage = storage
        self._name = name
        self._items: dict[str, bytes] = dict(storage.table_items(name))

    @property
    def name(self) -> str:
        return self._name

    def get(self, key: str) -> bytes | None:
        return self._items.get(key)

    def items(self) -> Iterator[tuple[str, bytes]]:
        return iter(list(self._items.items()))

    async def put(self, key: str, value: bytes | None) -> None:
        with _translated():
            self._storage.table_put(self._name, key, value)
            if value is None:
                self._items.pop(key, None)
            else:
                self._items[key] = value
            await self._storage.sync()

    def watch(self, callback: Callable[[str, bytes | None], None]) -> None:
        """Every write goes through this node's one table object: there is nothing to report."""


class LocalRole:
    """A role of a merged node, which is the whole deployment: held from the start and for
    good, until released (see `Role`)."""

    permanent = True

    def __init__(self, name: str) -> None:
        self._name = name
        self._released = trio.Event()
        self._reported = False  # what `changed` last returned

    @property
    def name(self) -> str:
        return self._name

    @property
    def held(self) -> bool:
        return not self._released.is_set()

    async def changed(self) -> bool:
        if self._reported != self.held:
            await trio.lowlevel.checkpoint()
        elif self.held:
            await self._released.wait()  # the one change left
        else:
            await trio.sleep_forever()  # released and reported: nothing changes any more
        self._reported = self.held
        return self._reported

    async def release(self) -> None:
        self._released.set()
        await trio.lowlevel.checkpoint()


if TYPE_CHECKING:
    from mop.processor.backend import Role

    def _role_conforms(role: LocalRole) -> Role:
        return role


class LocalBackend:
    """The merged-mode backend. Run it with `await nursery.start(backend.serve)` (or use
    `open_local_backend`): `serve` recovers the broker from storage, then runs delayed
    redelivery and trimming until `aclose()`."""

    # `SubscriptionSpec.auto_ack_qos0` is done by the broker, as messages are taken.
    auto_acks_qos0 = True

    def __init__(
        self,
        storage: Storage,
        *,
        tenant: str = "public",
        namespace: str = "default",
        advertised_url: str = "pulsar://127.0.0.1:6650",
        members: Sequence[str] = (),
        receiver_queue: int = 1000,
        fence_timeout: float = 10.0,
        trim_interval: float = 1.0,
        unsubscribed_grace: float = 0.0,
    ) -> None:
        self.storage = storage
        self.broker = Broker(
            storage, tenant=tenant, namespace=namespace, unsubscribed_grace=unsubscribed_grace
        )
        # This broker's URL, and the members of its cluster (none or one: it owns every topic).
        self.advertised_url = advertised_url
        self.ownership = Ownership(members, advertised_url)
        self.receiver_queue = receiver_queue
        self.fence_timeout = fence_timeout
        self.trim_interval = trim_interval
        self._leases: dict[str, LocalLease] = {}
        self._consumers: set[LocalConsumer] = set()
        self._tables: dict[str, LocalTable] = {}
        self._delay_event = trio.Event()
        self._stop = trio.Event()
        self._running = False
        self._closed = False

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Recover, report readiness, and run background work until `aclose()`."""
        if self._running or self._closed:
            raise RuntimeError("LocalBackend.serve() may run only once")
        with _translated():
            await self.broker.recover()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._redeliver_delayed)
            nursery.start_soon(self._trim_periodically)
            self._running = True
            task_status.started()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    async def _redeliver_delayed(self) -> None:
        """Return nacked messages after their delay, and release messages held back until
        their `deliver_at` (on the wall clock)."""
        broker = self.broker
        while True:
            self._delay_event = trio.Event()
            due = broker.next_due()
            deadline = float("inf") if due is None else due
            scheduled = broker.next_scheduled()
            if scheduled is not None:
                wait = max(0.0, (scheduled - time.time() * 1000.0) / 1000.0)
                deadline = min(deadline, trio.current_time() + wait)
            with trio.move_on_at(deadline):
                await self._delay_event.wait()
            broker.release_due(trio.current_time())
            broker.release_scheduled()

    def _delays_changed(self) -> None:
        self._delay_event.set()

    async def _trim_periodically(self) -> None:
        while True:
            await trio.sleep(self.trim_interval)
            with _translated():
                self.broker.trim_acknowledged(trio.current_time())

    def _check_running(self) -> None:
        if self._closed:
            raise BackendError("backend is closed", reason="closed")
        if not self._running:
            raise BackendError("backend is not running: start serve() first", reason="closed")

    # -- Backend ---------------------------------------------------------------------------

    async def open_client(self, client_id: str) -> LocalLease:
        self._check_running()
        previous = self._leases.get(client_id)
        lease = self._leases[client_id] = LocalLease(self, client_id)
        if previous is None:
            await trio.lowlevel.checkpoint()
            return lease
        previous._fence()
        try:
            # A holder that does not let go in time loses the id anyway: it is fenced.
            with trio.move_on_after(self.fence_timeout):
                await previous._wait_released()
        except BaseException:
            lease._release_now()
            raise
        return lease

    def _lease_released(self, lease: LocalLease) -> None:
        if self._leases.get(lease.client_id) is lease:
            del self._leases[lease.client_id]

    async def publish(self, topic: str, message: Message) -> PublishResult:
        self._check_running()
        try:
            published = await self.broker.publish(topic, message)
        except (StorageError, BrokerError) as exc:
            raise _translate(exc) from exc
        if message.deliver_at:
            self._delays_changed()
        return PublishResult(published.message_id, published.subscriptions)

    async def publish_batch(
        self, items: Sequence[tuple[str, Message]]
    ) -> list[PublishResult | BackendError]:
        """Store every message in order, then make them durable with one storage sync."""
        try:
            self._check_running()
        except BackendError as exc:
            return [exc] * len(items)
        store_many = self.broker.store_many
        results: list[PublishResult | BackendError] = []
        durable: list[int] = []  # indexes of the results that wait for the sync
        routed = False  # a message that waits for the sync went to a subscription
        delays = False
        start, end = 0, len(items)
        while start < end:
            # Consecutive messages of one topic (usually a whole read from one client) are
            # stored and routed together.
            topic = items[start][0]
            stop = start + 1
            while stop < end and items[stop][0] == topic:
                stop += 1
            messages = [message for _, message in items[start:stop]]
            outcomes: list[PublishResult | BackendError]
            if len(messages) == 1:
                outcomes = [self._store_one(topic, messages[0])]
            else:
                try:
                    ids, count = store_many(topic, messages)
                except (StorageError, BrokerError):
                    # None of them was stored: one at a time, for a result each.
                    outcomes = [self._store_one(topic, message) for message in messages]
                else:
                    outcomes = [PublishResult(message_id, count) for message_id in ids]
            persistent = not topic.startswith(NON_PERSISTENT)
            for index, (message, outcome) in enumerate(zip(messages, outcomes, strict=True)):
                if (message.qos or message.deliver_at) and isinstance(outcome, PublishResult):
                    if message.qos and persistent:
                        durable.append(len(results) + index)
                        routed = routed or bool(outcome.subscriptions)
                    if message.deliver_at:
                        delays = True
            results += outcomes
            start = stop
        if delays:
            self._delays_changed()
        if durable:
            if routed:
                # The consumers these messages woke deliver before the log write and this
                # publisher's acks, not after them: trio runs the tasks of a pass in either
                # order, and with this pass and the one the sync makes before its write, a
                # woken consumer runs first either way. Cancellation stays with the sync.
                await trio.lowlevel.cancel_shielded_checkpoint()
            try:
                await self.storage.sync()
            except StorageError as exc:
                error = _translate(exc)
                for index in durable:
                    results[index] = error
        return results

    def _store_one(self, topic: str, message: Message) -> PublishResult | BackendError:
        try:
            published = self.broker.store(topic, message)
        except (StorageError, BrokerError) as exc:
            return _translate(exc)
        return PublishResult(published.message_id, published.subscriptions)

    async def open_producer(self, spec: ProducerSpec) -> LocalProducer:
        self._check_running()
        producer = LocalProducer(self, spec)
        await trio.lowlevel.checkpoint()
        return producer

    async def topics(self, namespace: str) -> list[str]:
        await trio.lowlevel.checkpoint()
        return self.broker.topics(namespace)

    async def subscribe(self, spec: SubscriptionSpec) -> LocalConsumer:
        self._check_running()
        consumer = LocalConsumer(self, spec)
        with _translated():
            att = await self.broker.subscribe(
                spec.name,
                spec.selectors,
                type=SubscriptionType(spec.kind.value),
                durable=spec.durable,
                member=spec.member,
                max_backlog=spec.max_backlog,
                earliest=spec.start is StartPosition.EARLIEST,
                start_at=spec.start_at,
                capacity=MAX_UNACKED_PER_CONSUMER if spec.permits else self.receiver_queue,
                on_ready=consumer._on_ready,
                options=ConsumerOptions(
                    credit=spec.permits,
                    whole_batches=spec.whole_batches,
                    rank=(spec.priority, spec.consumer_name),
                    on_active=consumer._on_active,
                    ack_qos0=spec.auto_ack_qos0,
                ),
            )
        consumer._att = att
        consumer._seen_active = consumer._active
        self._delays_changed()
        if self._closed:
            consumer._shutdown()
            raise BackendError("backend is closed", reason="closed")
        self._consumers.add(consumer)
        return consumer

    async def delete_subscription(self, name: str, member: str = "") -> None:
        self._check_running()
        with _translated():
            await self.broker.delete_subscription(name, member)

    def table(self, name: str) -> LocalTable:
        if name.startswith(BROKER_TABLE_PREFIX):
            raise ValueError(f"table {name!r} is reserved for the broker")
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = LocalTable(self.storage, name)
        return table

    async def lookup(self, topic: str) -> str:
        """The URL of the cluster member that owns `topic` (an MQTT or a full Pulsar name)."""
        await trio.lowlevel.checkpoint()
        if not self.ownership.clustered:
            return self.advertised_url
        broker = self.broker
        return self.ownership.owner(
            mqtt_to_pulsar(topic, tenant=broker.tenant, namespace=broker.namespace)
        )

    async def hold_role(self, name: str) -> LocalRole:
        """Every role: this node is the only one (see `LocalRole`)."""
        self._check_running()
        await trio.lowlevel.checkpoint()
        return LocalRole(name)

    def stats(self) -> BrokerStats:
        """Counts for `$SYS` topics and metrics: topics, subscriptions, messages."""
        return self.broker.stats()

    async def aclose(self) -> None:
        """Close every consumer (a waiting `receive` raises ConsumerClosed), fence every
        lease, stop `serve` and close the storage."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        for consumer in list(self._consumers):
            consumer._shutdown()
        for lease in self._leases.values():
            lease._fence()
        self._stop.set()
        with trio.CancelScope(shield=True), _translated():
            await self.storage.aclose()


@asynccontextmanager
async def open_local_backend(
    storage: Storage,
    *,
    tenant: str = "public",
    namespace: str = "default",
    advertised_url: str = "pulsar://127.0.0.1:6650",
    members: Sequence[str] = (),
    receiver_queue: int = 1000,
    fence_timeout: float = 10.0,
    trim_interval: float = 1.0,
    unsubscribed_grace: float = 0.0,
) -> AsyncIterator[LocalBackend]:
    """Run a `LocalBackend` over `storage` for the duration of the block, then close it."""
    backend = LocalBackend(
        storage,
        tenant=tenant,
        namespace=namespace,
        advertised_url=advertised_url,
        members=members,
        receiver_queue=receiver_queue,
        fence_timeout=fence_timeout,
        trim_interval=trim_interval,
        unsubscribed_grace=unsubscribed_grace,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(backend.serve)
        try:
            yield backend
        finally:
            await backend.aclose()


if TYPE_CHECKING:

    def _conforms(
        backend: LocalBackend,
        consumer: LocalConsumer,
        table: LocalTable,
        lease: LocalLease,
        producer: LocalProducer,
    ) -> tuple[Backend, BatchPublisher, Consumer, Table, ClientLease, FenceNotifier, Producer]:
        return backend, backend, consumer, table, lease, lease, producer
