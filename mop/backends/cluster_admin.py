"""The two questions pulsar-client for Python cannot be asked: which topics a namespace has
(GET_TOPICS_OF_NAMESPACE) and which broker owns a topic (LOOKUP, following redirects).

Each call opens a short binary-protocol connection of its own with mop's Pulsar codec, to the
first broker of the service URL that answers. Plain `pulsar://` URLs only.
"""

from __future__ import annotations

import itertools
from typing import Final

import trio

from mop.processor.backend import BackendError
from mop.protocols.pulsar.commands import (
    Command,
    Connect,
    Connected,
    Error,
    GetTopicsOfNamespace,
    GetTopicsOfNamespaceResponse,
    Lookup,
    LookupResponse,
    LookupType,
    Ping,
    Pong,
    TopicsMode,
)
from mop.protocols.pulsar.errors import RemoteProtocolError
from mop.protocols.pulsar.frames import FrameDecoder, NeedData, encode_command

__all__ = ["get_topics", "lookup", "service_hosts"]

_CLIENT_VERSION: Final = "mop-cluster"
_PROTOCOL_VERSION: Final = 20
_MAX_REDIRECTS: Final = 8


def service_hosts(service_url: str) -> list[tuple[str, int]]:
    """The (host, port) pairs of `pulsar://host1:port1,host2:port2`."""
    scheme, sep, rest = service_url.partition("://")
    if not sep or scheme != "pulsar":
        raise BackendError(
            f"{service_url!r}: only pulsar:// URLs can be asked for topics and owners",
            reason="not_supported",
        )
    hosts = []
    for part in rest.rstrip("/").split(","):
        host, _, port = part.rpartition(":")
        if not host or not port.isdigit():
            raise BackendError(f"{service_url!r}: expected host:port", reason="invalid_url")
        hosts.append((host.strip("[]"), int(port)))
    return hosts


class _Connection:
    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._decoder = FrameDecoder()
        self._ids = itertools.count(1)

    @classmethod
    async def open(cls, service_url: str) -> _Connection:
        failures = []
        for host, port in service_hosts(service_url):
            try:
                stream = await trio.open_tcp_stream(host, port)
            except OSError as exc:
                failures.append(f"{host}:{port}: {exc}")
                continue
            connection = cls(stream)
            try:
                await connection._send(
                    Connect(client_version=_CLIENT_VERSION, protocol_version=_PROTOCOL_VERSION)
                )
                reply = await connection._next()
            except BaseException:
                await stream.aclose()
                raise
            if isinstance(reply, Connected):
                return connection
            await stream.aclose()
            failures.append(f"{host}:{port}: refused ({reply!r:.200})")
        raise BackendError(
            f"no broker of {service_url} answers: {'; '.join(failures)}", reason="unavailable"
        )

    def request_id(self) -> int:
        return next(self._ids)

    async def _send(self, command: Command) -> None:
        await self._stream.send_all(encode_command(command))

    async def _next(self) -> object:
        while True:
            frame = self._decoder.next_frame()
            if not isinstance(frame, NeedData):
                if isinstance(frame, Ping):
                    await self._send(Pong())
                    continue
                return frame
            data = await self._stream.receive_some(65536)
            if not data:
                raise BackendError("the broker closed the connection", reason="unavailable")
            self._decoder.feed(data)

    async def ask(self, command: Command, request_id: int) -> object:
        await self._send(command)
        while True:
            reply = await self._next()
            if getattr(reply, "request_id", None) == request_id:
                if isinstance(reply, Error):
                    raise BackendError(f"{reply.error.name}: {reply.message}")
                return reply

    async def aclose(self) -> None:
        await self._stream.aclose()


async def _with_connection(service_url: str, seconds: float) -> _Connection:
    try:
        with trio.fail_after(seconds):
            return await _Connection.open(service_url)
    except trio.TooSlowError:
        raise BackendError(
            f"{service_url}: no answer in {seconds}s", reason="unavailable"
        ) from None


async def get_topics(service_url: str, namespace: str, *, seconds: float = 10.0) -> list[str]:
    """Every topic of `namespace` ("tenant/namespace"), persistent or not, asked within
    `seconds`."""
    connection = await _with_connection(service_url, seconds)
    try:
        with trio.fail_after(seconds):
            request_id = connection.request_id()
            reply = await connection.ask(
                GetTopicsOfNamespace(
                    request_id=request_id, namespace=namespace, mode=TopicsMode.ALL
                ),
                request_id,
            )
    except trio.TooSlowError:
        raise BackendError(f"topics of {namespace}: no answer", reason="unavailable") from None
    except (OSError, RemoteProtocolError, trio.BrokenResourceError) as exc:
        raise BackendError(f"topics of {namespace}: {exc}", reason="unavailable") from None
    finally:
        await connection.aclose()
    if not isinstance(reply, GetTopicsOfNamespaceResponse):
        raise BackendError(f"topics of {namespace}: unexpected answer {reply!r:.200}")
    return sorted(reply.topics)


async def lookup(service_url: str, topic: str, *, seconds: float = 10.0) -> str:
    """The service URL of the broker that owns `topic`, following redirects, within
    `seconds`."""
    url = service_url
    authoritative = False
    with trio.move_on_after(seconds) as scope:
        for _ in range(_MAX_REDIRECTS):
            connection = await _with_connection(url, seconds)
            try:
                request_id = connection.request_id()
                reply = await connection.ask(
                    Lookup(topic=topic, request_id=request_id, authoritative=authoritative),
                    request_id,
                )
            except (OSError, RemoteProtocolError, trio.BrokenResourceError) as exc:
                raise BackendError(f"lookup of {topic}: {exc}", reason="unavailable") from None
            finally:
                await connection.aclose()
            if not isinstance(reply, LookupResponse) or reply.response is LookupType.Failed:
                raise BackendError(f"lookup of {topic} failed: {reply!r:.200}")
            if not reply.broker_service_url:
                raise BackendError(f"lookup of {topic}: no broker URL in {reply!r:.200}")
            if reply.response is LookupType.Connect:
                return reply.broker_service_url
            url, authoritative = reply.broker_service_url, reply.authoritative
        raise BackendError(f"lookup of {topic}: more than {_MAX_REDIRECTS} redirects")
    assert scope.cancelled_caught
    raise BackendError(f"lookup of {topic}: no answer in {seconds}s", reason="unavailable")
