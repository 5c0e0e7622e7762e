"""The protocol handler lifecycle (Pulsar PIP-41's, in trio terms) and handler discovery.

A node calls, in this order: `initialize(settings)` -> `advertised_data()` -> `listeners()` (the
node binds them, so that a port in use stops it before it writes anything) ->
`await start(services)` (then the node accepts connections) -> `await close()`; once started,
`admin_view()` shows the admin API the handler's clients (`mop.protocols.introspection`).
Handlers are found through the `mop.protocols` entry-point group, so a package can add one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Final, Protocol
from urllib.parse import urlsplit

import trio

from mop.membership import Membership
from mop.processor import MessagingProcessor
from mop.protocols.introspection import AdminView
from mop.protocols.pulsar.client import NO_AUTH, ClientAuth
from mop.settings import Settings
from mop.transport import BoundListener, Handler, ListenerSpec

ENTRY_POINT_GROUP = "mop.protocols"


@dataclass(frozen=True, slots=True)
class NodeServices:
    """What a node hands its protocol handlers when they start."""

    processor: MessagingProcessor
    # Background tasks of the handler live here; the node cancels it after `close`.
    nursery: trio.Nursery
    # The node's cluster: its members, this broker's URL, which member owns a topic.
    membership: Membership
    # The node's own credentials towards other brokers (`cluster.auth`, read once).
    broker_auth: ClientAuth = NO_AUTH


class ProtocolHandler(Protocol):
    name: str
    # The processor tables the handler reads as it starts: a separated proxy loads them before
    # it reports ready.
    tables: tuple[str, ...]

    def initialize(self, settings: Settings) -> None:
        """Read the settings; no I/O yet."""
        ...

    def advertised_data(self) -> dict[str, str]:
        """What this handler serves, for discovery (e.g. {"mqtt": "mqtt://127.0.0.1:1883"})."""
        ...

    async def start(self, services: NodeServices) -> None:
        """Start background work; return once the handler is ready for connections."""
        ...

    def listeners(self) -> list[tuple[ListenerSpec, Handler]]:
        """The listeners to serve and the connection handler for each (asked before `start`;
        a handler is called only once `start` has returned)."""
        ...

    def admin_view(self) -> AdminView:
        """What the admin API may see of this handler's clients and do with them (after
        `start`)."""
        ...

    async def close(self) -> None:
        """Stop: finish or refuse in-flight work; the node closes connections afterwards."""
        ...


# The listener kind behind each URL scheme protocol handlers advertise (others: "tcp").
_SCHEME_KINDS: Final = {
    "mqtts": "tls",
    "ws": "ws",
    "wss": "wss",
    "pulsar+ssl": "tls",
    "grpc+tls": "tls",
}


def protocol_data(
    handlers: Mapping[str, ProtocolHandler], bound: Iterable[BoundListener]
) -> dict[str, dict[str, str]]:
    """What each handler advertises (PIP-41's protocol data), by handler name, with the port
    its listener bound where a URL says port 0 ("pick a free port")."""
    ports = {(entry.spec.name, entry.spec.kind): entry.port for entry in bound}
    data: dict[str, dict[str, str]] = {}
    for name, handler in handlers.items():
        urls = {}
        for key, url in handler.advertised_data().items():
            parts = urlsplit(url)
            port = ports.get((name, _SCHEME_KINDS.get(parts.scheme, "tcp")))
            if parts.port == 0 and port is not None and parts.hostname is not None:
                host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
                url = parts._replace(netloc=f"{host}:{port}").geturl()
            urls[key] = url
        data[name] = urls
    return data


class UnknownProtocol(LookupError):
    pass


def load_protocol(name: str) -> ProtocolHandler:
    """Instantiate the handler registered under `name` in the `mop.protocols` group."""
    found = entry_points(group=ENTRY_POINT_GROUP, name=name)
    for entry in found:
        handler_class = entry.load()
        handler: ProtocolHandler = handler_class()
        return handler
    known = sorted(e.name for e in entry_points(group=ENTRY_POINT_GROUP))
    raise UnknownProtocol(f"unknown protocol {name!r} (installed: {', '.join(known) or 'none'})")
