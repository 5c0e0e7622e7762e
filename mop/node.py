"""A mop node: the one place that decides between merged and separated mode and wires it all.

`open_node(settings)` builds the backend for the configured mode, the MessagingProcessor on
top of it and the protocol handlers on top of that, serves their listeners and, on exit, closes
everything in reverse order. `serve_node` is the same as a `serve_*` task for `nursery.start`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import trio

from mop.backends.local import LocalBackend
from mop.broker.storage import StorageError, open_durable_storage
from mop.processor import Backend, MessagingProcessor
from mop.protocols.base import NodeServices, ProtocolHandler, UnknownProtocol, load_protocol
from mop.settings import Settings
from mop.transport import BoundListener, Handler, ListenerSpec, serve_listeners

log = logging.getLogger("mop.node")


class StartupError(Exception):
    """The node cannot start; the message says why in one line."""


@dataclass(frozen=True, slots=True)
class Node:
    settings: Settings
    processor: MessagingProcessor
    protocols: dict[str, ProtocolHandler]
    listeners: tuple[BoundListener, ...]

    def address(self, protocol: str = "mqtt", kind: str = "tcp") -> tuple[str, int]:
        """Where the node listens for `protocol` over `kind` (handy with port 0)."""
        for bound in self.listeners:
            if bound.spec.name == protocol and bound.spec.kind == kind:
                return bound.host, bound.port
        raise LookupError(f"no {protocol} listener over {kind}")


async def start_backend(settings: Settings, nursery: trio.Nursery) -> Backend:
    """The constructor switch: merged mode gets the colocated broker over durable storage in
    `data_dir`, separated mode remote brokers through lookup. Background work runs in
    `nursery`; the caller closes the backend with `aclose()`."""
    if settings.mode == "separated":
        raise StartupError(
            'separated mode is not available yet in this release; set mode = "merged"'
        )
    directory = Path(settings.data_dir) / "broker"
    try:
        storage = await open_durable_storage(directory, settings.storage)
    except (StorageError, OSError) as exc:
        raise StartupError(f"storage in {directory}: {exc}") from None
    log.info("storage: %s", storage.recovery)
    backend = LocalBackend(
        storage,
        tenant=settings.default_tenant,
        namespace=settings.default_namespace,
        advertised_url=settings.cluster.advertised_url
        or f"pulsar://{settings.pulsar.host}:{settings.pulsar.port}",
    )
    try:
        await nursery.start(storage.serve)
        await nursery.start(backend.serve)
    except BaseException:
        with trio.CancelScope(shield=True):
            await backend.aclose()
        raise
    return backend


@asynccontextmanager
async def open_node(settings: Settings) -> AsyncIterator[Node]:
    handlers = _load_handlers(settings)
    backend: Backend | None = None
    try:
        async with trio.open_nursery() as nursery:
            backend = await start_backend(settings, nursery)
            processor = MessagingProcessor(backend, max_connections=settings.mqtt.max_connections)
            services = NodeServices(processor=processor, nursery=nursery)
            for handler in handlers.values():
                handler.initialize(settings)
                log.debug("%s advertises %s", handler.name, handler.advertised_data())
            for handler in handlers.values():
                await handler.start(services)
            bound: list[BoundListener] = []
            for handler in handlers.values():
                bound.extend(await _serve(nursery, handler))
            for entry in bound:
                log.info(
                    "%s listening on %s %s:%d",
                    entry.spec.name,
                    entry.spec.kind,
                    entry.host,
                    entry.port,
                )
            try:
                yield Node(settings, processor, handlers, tuple(bound))
            finally:
                for handler in handlers.values():
                    await handler.close()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        _raise_startup_error(group)
        raise
    finally:
        if backend is not None:
            with trio.CancelScope(shield=True):
                await backend.aclose()


async def serve_node(
    settings: Settings, *, task_status: trio.TaskStatus[Node] = trio.TASK_STATUS_IGNORED
) -> NoReturn:
    async with open_node(settings) as node:
        task_status.started(node)
        await trio.sleep_forever()
    raise AssertionError("unreachable")  # pragma: no cover


def _load_handlers(settings: Settings) -> dict[str, ProtocolHandler]:
    handlers = {}
    for name in settings.protocols:
        try:
            handlers[name] = load_protocol(name)
        except UnknownProtocol as exc:
            raise StartupError(f"protocols: {exc}") from None
    return handlers


async def _serve(nursery: trio.Nursery, handler: ProtocolHandler) -> list[BoundListener]:
    bound: list[BoundListener] = []
    by_handler: dict[Handler, list[ListenerSpec]] = {}
    for spec, connection_handler in handler.listeners():
        by_handler.setdefault(connection_handler, []).append(spec)
    for connection_handler, specs in by_handler.items():
        try:
            bound += await nursery.start(serve_listeners, specs, connection_handler)
        except OSError as exc:
            raise StartupError(f"{handler.name}: {exc}") from None
    return bound


def _raise_startup_error(group: BaseExceptionGroup) -> None:
    """Surface a lone StartupError from inside the node's nursery as itself."""
    leaves = list(_leaves(group))
    if len(leaves) == 1 and isinstance(leaves[0], StartupError):
        raise leaves[0] from None


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]
