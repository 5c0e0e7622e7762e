"""What the conformance tests run against: a deployment that opens backends of one kind, names
that no other test uses, and bounded ways to wait for deliveries.

A deployment is either `local` (a `LocalBackend` over durable storage in a directory; one
backend at a time owns that storage, and reopening it is a restart) or `cluster` (a
`ClusterBackend` reaching a mop broker process; any number of backends can be open at once, and
a new one on the same broker is a restart as far as the backend's state goes).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Protocol

import trio

from mop.backends.local import open_local_backend
from mop.broker.storage import open_durable_storage
from mop.message import Delivery
from mop.processor.backend import Backend, Consumer
from mop.settings import StorageSettings
from mop.topic_names import mqtt_to_pulsar

# How long any single wait for a delivery may take before the test fails. Generous: it bounds
# the test, it does not measure the backend.
DEADLINE = 5.0
# How long to watch for a message that must not come (after every expected one came).
QUIET = 0.5


class Deployment(Protocol):
    @property
    def shared(self) -> bool:
        """Whether several backends may be open at once (and see each other's state)."""
        ...

    def open_backend(self, *, tables: Iterable[str] = ()) -> AbstractAsyncContextManager[Backend]:
        """A running backend for the duration of the block, which can read `tables` at once
        (as a node names the tables of its adapters when it starts)."""
        ...


class LocalDeployment:
    """A merged node's backend over durable storage in `directory`."""

    shared = False

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @asynccontextmanager
    async def open_backend(self, *, tables: Iterable[str] = ()) -> AsyncIterator[Backend]:
        # Every table of the storage is in memory from the start: `tables` needs no loading.
        storage = await open_durable_storage(self.directory, StorageSettings())
        async with trio.open_nursery() as nursery:
            await nursery.start(storage.serve)
            # Closing the backend closes the storage, which ends `serve`.
            async with open_local_backend(storage) as backend:
                yield backend


class ClusterDeployment:
    """Separated mode's backend, reaching the brokers at `service_url` through pulsar-client."""

    shared = True

    def __init__(self, service_url: str) -> None:
        self.service_url = service_url

    def open_backend(self, *, tables: Iterable[str] = ()) -> AbstractAsyncContextManager[Backend]:
        # Imported here, as mop.node does: local runs need not load pulsar-client.
        from mop.testing.cluster import open_cluster_backend

        return open_cluster_backend(self.service_url, tables=list(tables))


@asynccontextmanager
async def open_peer(
    deployment: Deployment, backend: Backend, *, tables: Iterable[str] = ()
) -> AsyncIterator[Backend]:
    """Another backend of the deployment beside `backend`, as a second proxy would be; with
    local storage, which one process owns, it is `backend` itself."""
    if not deployment.shared:
        yield backend
        return
    async with deployment.open_backend(tables=tables) as peer:
        yield peer


class Names:
    """Topic, selector, subscription and table names of one test, unique on a shared broker."""

    def __init__(self) -> None:
        self.prefix = f"cf{uuid.uuid4().hex[:10]}"

    def mqtt(self, name: str = "") -> str:
        """An MQTT topic name or filter under this test's own first level."""
        return f"{self.prefix}/{name}" if name else self.prefix

    def topic(self, name: str = "") -> str:
        """The canonical (Pulsar) topic of `mqtt(name)`."""
        return mqtt_to_pulsar(self.mqtt(name))

    def sub(self, name: str) -> str:
        return f"{self.prefix}-{name}"


def payloads(deliveries: Sequence[Delivery]) -> list[bytes]:
    return [d.message.payload for d in deliveries]


async def receive(consumer: Consumer, count: int) -> list[Delivery]:
    """Exactly `count` deliveries (receive asks for no more than it still needs), or fail."""
    got: list[Delivery] = []
    with trio.move_on_after(DEADLINE):
        while len(got) < count:
            got.extend(await consumer.receive(count - len(got)))
    assert len(got) == count, f"{len(got)} of {count} deliveries in {DEADLINE}s: {payloads(got)}"
    return got


async def expect_nothing(consumer: Consumer, *, within: float = QUIET) -> None:
    """Fail if `consumer` gets any message within `within` seconds."""
    with trio.move_on_after(within):
        got = await consumer.receive(100)
        raise AssertionError(f"unexpected deliveries: {payloads(got)}")


async def collect(consumers: Sequence[Consumer], count: int) -> list[list[Delivery]]:
    """Receive from several consumers at once until they have `count` deliveries in all;
    returns what each one got."""
    got: list[list[Delivery]] = [[] for _ in consumers]
    enough = trio.Event()

    async def pump(index: int, consumer: Consumer) -> None:
        while True:
            got[index].extend(await consumer.receive(100))
            if sum(map(len, got)) >= count:
                enough.set()

    with trio.move_on_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            for index, consumer in enumerate(consumers):
                nursery.start_soon(pump, index, consumer)
            await enough.wait()
            nursery.cancel_scope.cancel()
    total = sum(map(len, got))
    assert total == count, f"{total} of {count} deliveries in {DEADLINE}s: {got}"
    return got
