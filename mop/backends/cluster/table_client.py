"""`open_tables`: tables of a running deployment read and written from outside it (by `mop ban`):
a Pulsar client and a `ClusterTable` per name, through the brokers' (or a merged node's) Pulsar
port, without what a proxy runs besides (presence, subscriptions, consumers)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from mop.backends.cluster.options import ProducerOptions
from mop.backends.cluster.producers import ProducerCache
from mop.backends.cluster.tables import ClusterTable
from mop.exception_groups import leaves
from mop.processor.backend import BackendError
from mop.protocols.pulsar.client import NO_AUTH, ClientAuth
from mop.protocols.pulsar.driver import ClientOptions, PulsarClient
from mop.version import VERSION

__all__ = ["open_tables"]


@dataclass(frozen=True, slots=True)
class _Access:
    """The `TableContext` of the tables of `open_tables`."""

    operation_timeout: float
    producers: ProducerCache
    client: Callable[[], PulsarClient]


@asynccontextmanager
async def open_tables(
    service_url: str,
    names: Iterable[str],
    *,
    tenant: str = "public",
    namespace: str = "default",
    operation_timeout: float = 10.0,
    auth: ClientAuth = NO_AUTH,
) -> AsyncIterator[dict[str, ClusterTable]]:
    """Load the tables `names` of the deployment at `service_url` (whose default tenant and
    namespace are `tenant` and `namespace`) and yield them by name, following their topics
    until the block ends. BackendError when the brokers cannot be reached or do not answer
    within `operation_timeout` seconds (each request, and the loading as a whole)."""
    timeout = operation_timeout
    options = ClientOptions(
        f"mop-cli/{VERSION}",
        operation_timeout=timeout,
        connect_timeout=timeout,
        auth=auth,
    )
    try:
        client = PulsarClient(service_url, options)
    except ValueError as exc:
        raise BackendError(f"{service_url}: {exc}", reason="invalid_url") from None
    tables = {name: ClusterTable(name, tenant=tenant, namespace=namespace) for name in names}
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(client.serve)
            producers = ProducerCache(client, ProducerOptions(send_timeout=timeout))
            try:
                with trio.move_on_after(timeout) as loading:
                    access = _Access(timeout, producers, lambda: client)
                    for table in tables.values():
                        await nursery.start(table.serve, access)
                if loading.cancelled_caught:
                    raise BackendError(
                        f"{service_url}: the deployment did not answer in {timeout:g}s",
                        reason="unavailable",
                    )
                yield tables
            finally:
                with trio.CancelScope(shield=True):
                    await producers.aclose()
                    for table in tables.values():
                        await table.aclose()
                    await client.aclose()
    except BaseExceptionGroup as group:
        # One cause (a table that cannot be read, say): raised alone.
        causes = leaves(group)
        if len(causes) == 1 and isinstance(causes[0], BackendError):
            raise causes[0] from None
        raise
