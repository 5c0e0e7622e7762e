"""List the topics of a namespace over the Pulsar binary protocol (GET_TOPICS_OF_NAMESPACE).

pulsar-client sends this command only for its own regex subscriptions and has no call that
returns the list, so the data source asks for it on a short connection of its own, framed with
mop's Pulsar codec. Any Pulsar-protocol broker answers it (a mop node or Apache Pulsar); it
needs no authentication, which is what such a broker allows by default.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator
from typing import TypeVar
from urllib.parse import urlsplit

from mop.protocols.pulsar.commands import (
    PROTOCOL_VERSION,
    Connect,
    Connected,
    Error,
    GetTopicsOfNamespace,
    GetTopicsOfNamespaceResponse,
    Ping,
    Pong,
    TopicsMode,
)
from mop.protocols.pulsar.frames import Frame, FrameDecoder, NeedData, encode_command

__all__ = ["NamespaceListingError", "list_topics"]

_REQUEST_ID = 1
T = TypeVar("T")


class NamespaceListingError(RuntimeError):
    """No broker of the service URL answered the listing (or it refused it)."""


def list_topics(service_url: str, namespace: str, *, timeout: float = 30.0) -> list[str]:
    """Every topic of `namespace` ("tenant/namespace"), persistent and not, partitions named
    one by one. Tries each host of the service URL in turn."""
    failures = []
    for host, port in _addresses(service_url):
        try:
            return _ask(host, port, namespace, tls=service_url.startswith("pulsar+ssl://"),
                        timeout=timeout)
        except (OSError, NamespaceListingError) as exc:
            failures.append(f"{host}:{port}: {exc}")
    raise NamespaceListingError(
        f"cannot list the topics of {namespace!r} at {service_url}: {'; '.join(failures)}"
    )


def _addresses(service_url: str) -> Iterator[tuple[str, int]]:
    scheme, _, hosts = service_url.partition("://")
    default_port = 6651 if scheme == "pulsar+ssl" else 6650
    for host in hosts.strip("/").split(","):
        parts = urlsplit(f"//{host}")
        yield parts.hostname or "127.0.0.1", parts.port or default_port


def _ask(host: str, port: int, namespace: str, *, tls: bool, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    with socket.create_connection((host, port), timeout=timeout) as raw:
        sock = ssl.create_default_context().wrap_socket(raw, server_hostname=host) if tls else raw
        decoder = FrameDecoder()
        sock.sendall(encode_command(
            Connect(client_version="mop-spark", protocol_version=PROTOCOL_VERSION)
        ))
        _expect(sock, decoder, Connected, deadline)
        sock.sendall(encode_command(GetTopicsOfNamespace(
            request_id=_REQUEST_ID, namespace=namespace, mode=TopicsMode.ALL
        )))
        answer = _expect(sock, decoder, GetTopicsOfNamespaceResponse, deadline)
        return list(answer.topics)


def _expect(sock: socket.socket, decoder: FrameDecoder, kind: type[T], deadline: float) -> T:
    while True:
        frame = _next_frame(sock, decoder, deadline)
        if isinstance(frame, kind):
            return frame
        if isinstance(frame, Error):
            raise NamespaceListingError(f"{frame.error.name}: {frame.message}")
        if isinstance(frame, Ping):
            sock.sendall(encode_command(Pong()))
        # Anything else (a Pong, a command the codec does not know) is not the answer.


def _next_frame(sock: socket.socket, decoder: FrameDecoder, deadline: float) -> Frame:
    while isinstance(frame := decoder.next_frame(), NeedData):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise NamespaceListingError("no answer in time")
        sock.settimeout(remaining)
        data = sock.recv(65536)
        if not data:
            raise NamespaceListingError("the broker closed the connection")
        decoder.feed(data)
    return frame
