"""`LocalBackend`: the `Backend` of merged mode, which calls straight into the colocated broker
and storage. Waiting (receive, fencing, delayed redelivery) is done here, with trio.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING

import trio

from mop.broker import (
    SUBSCRIPTIONS_TABLE,
    Attachment,
    Broker,
    BrokerError,
    BrokerStats,
    SubscriptionType,
)
from mop.broker.storage import Storage, StorageError, StorageFull
from mop.message import Delivery, Message
from mop.processor.backend import (
    BackendError,
    ConsumerClosed,
    PublishResult,
    QuotaExceeded,
    StartPosition,
    SubscriptionSpec,
)

if TYPE_CHECKING:
    from mop.processor.backend import Backend, ClientLease, Consumer, Table

__all__ = ["LocalBackend", "LocalConsumer", "LocalLease", "LocalTable", "open_local_backend"]


@contextmanager
def _translated() -> Iterator[None]:
    """Turn broker and storage errors into the errors of the backend contract."""
    try:
        yield
    except StorageFull as exc:
        raise QuotaExceeded(str(exc)) from exc
    except StorageError as exc:
        raise BackendError(str(exc), reason="storage_error") from exc
    except BrokerError as exc:
        raise BackendError(str(exc), reason=exc.reason) from exc


class LocalLease:
    """Ownership of a client id within this process."""

    def __init__(self, backend: LocalBackend, client_id: str) -> None:
        self._backend = backend
        self._client_id = client_id
        self._fenced = trio.Event()
        self._released = trio.Event()

    @property
    def client_id(self) -> str:
        return self._client_id

    @property
    def fenced(self) -> bool:
        return self._fenced.is_set()

    async def wait_fenced(self) -> None:
        await self._fenced.wait()

    async def release(self) -> None:
        self._release_now()
        await trio.lowlevel.checkpoint()

    def _release_now(self) -> None:
        self._released.set()
        self._backend._lease_released(self)


class LocalConsumer:
    """A consumer attached to the broker; one task at a time may wait in `receive`."""

    def __init__(self, backend: LocalBackend, spec: SubscriptionSpec) -> None:
        self._backend = backend
        self._spec = spec
        self._att: Attachment | None = None
        self._wakeup: trio.Event | None = None
        self._closed = False

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

    def _attachment(self) -> Attachment:
        if self._closed or self._att is None:
            raise ConsumerClosed(f"consumer of {self._spec.name!r} is closed")
        return self._att

    async def receive(self, max_messages: int) -> list[Delivery]:
        if max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        if self._wakeup is not None:
            raise trio.BusyResourceError("another task is already receiving from this consumer")
        await trio.lowlevel.checkpoint()
        broker = self._backend.broker
        while True:
            att = self._attachment()
            with _translated():
                deliveries = broker.take(att, max_messages)
            if deliveries:
                return deliveries
            event = self._wakeup = trio.Event()
            try:
                await event.wait()
            finally:
                self._wakeup = None

    def ack(self, deliveries: Iterable[Delivery]) -> None:
        # Acknowledging after close is a no-op: the messages went back to the subscription.
        if not self._closed and self._att is not None:
            with _translated():
                self._backend.broker.ack(self._att, deliveries)

    def nack(self, deliveries: Iterable[Delivery], delay: float = 0.0) -> None:
        if self._closed or self._att is None:
            return
        with _translated():
            if delay > 0:
                self._backend.broker.nack(self._att, deliveries, due=trio.current_time() + delay)
                self._backend._delays_changed()
            else:
                self._backend.broker.nack(self._att, deliveries)

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


class LocalBackend:
    """The merged-mode backend. Run it with `await nursery.start(backend.serve)` (or use
    `open_local_backend`): `serve` recovers the broker from storage, then runs delayed
    redelivery and trimming until `aclose()`."""

    def __init__(
        self,
        storage: Storage,
        *,
        tenant: str = "public",
        namespace: str = "default",
        advertised_url: str = "pulsar://127.0.0.1:6650",
        receiver_queue: int = 1000,
        fence_timeout: float = 10.0,
        trim_interval: float = 1.0,
    ) -> None:
        self.storage = storage
        self.broker = Broker(storage, tenant=tenant, namespace=namespace)
        self.advertised_url = advertised_url
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
        while True:
            self._delay_event = trio.Event()
            due = self.broker.next_due()
            with trio.move_on_at(due if due is not None else float("inf")):
                await self._delay_event.wait()
            self.broker.release_due(trio.current_time())

    def _delays_changed(self) -> None:
        self._delay_event.set()

    async def _trim_periodically(self) -> None:
        while True:
            await trio.sleep(self.trim_interval)
            with _translated():
                self.broker.trim_acknowledged()

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
        previous._fenced.set()
        try:
            # A holder that does not let go in time loses the id anyway: it is fenced.
            with trio.move_on_after(self.fence_timeout):
                await previous._released.wait()
        except BaseException:
            lease._release_now()
            raise
        return lease

    def _lease_released(self, lease: LocalLease) -> None:
        if self._leases.get(lease.client_id) is lease:
            del self._leases[lease.client_id]

    async def publish(self, topic: str, message: Message) -> PublishResult:
        self._check_running()
        with _translated():
            published = await self.broker.publish(topic, message)
        return PublishResult(published.message_id, published.subscriptions)

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
                capacity=self.receiver_queue,
                on_ready=consumer._on_ready,
            )
        consumer._att = att
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
        if name == SUBSCRIPTIONS_TABLE:
            raise ValueError(f"table {name!r} is reserved for the broker")
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = LocalTable(self.storage, name)
        return table

    async def lookup(self, topic: str) -> str:
        await trio.lowlevel.checkpoint()
        return self.advertised_url

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
            lease._fenced.set()
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
    receiver_queue: int = 1000,
    fence_timeout: float = 10.0,
    trim_interval: float = 1.0,
) -> AsyncIterator[LocalBackend]:
    """Run a `LocalBackend` over `storage` for the duration of the block, then close it."""
    backend = LocalBackend(
        storage,
        tenant=tenant,
        namespace=namespace,
        advertised_url=advertised_url,
        receiver_queue=receiver_queue,
        fence_timeout=fence_timeout,
        trim_interval=trim_interval,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(backend.serve)
        try:
            yield backend
        finally:
            await backend.aclose()


if TYPE_CHECKING:

    def _conforms(
        backend: LocalBackend, consumer: LocalConsumer, table: LocalTable, lease: LocalLease
    ) -> tuple[Backend, Consumer, Table, ClientLease]:
        return backend, consumer, table, lease
