"""A small client side of the Pulsar binary protocol, for the questions pulsar-client cannot be
asked (which topics a namespace has, which broker owns a topic) and for links between brokers.

`PulsarLink` is one connection spoken with mop's own codec: the CONNECT handshake, then one
request at a time, its answer matched by request id, PINGs answered on the way. Everything that
goes wrong with the connection or the broker's answer is a `LinkFailed`.
"""

from __future__ import annotations

import itertools
import ssl
from collections.abc import Callable
from typing import Final
from urllib.parse import urlsplit

import trio

from mop.protocols.pulsar.commands import (
    PROTOCOL_VERSION,
    Command,
    Connect,
    Connected,
    Error,
    Ping,
    Pong,
)
from mop.protocols.pulsar.errors import RemoteProtocolError
from mop.protocols.pulsar.frames import Frame, FrameDecoder, NeedData, encode_command

__all__ = ["LinkFailed", "PulsarLink", "service_addresses"]

_DEFAULT_PORTS: Final = {"pulsar": 6650, "pulsar+ssl": 6651}


class LinkFailed(Exception):
    """The broker could not be reached, closed the connection, refused the handshake, or
    answered a request with an ERROR (then `error` is that answer)."""

    def __init__(self, message: str, error: Error | None = None) -> None:
        super().__init__(message)
        self.error = error


def service_addresses(service_url: str) -> tuple[list[tuple[str, int]], bool]:
    """The (host, port) pairs of `pulsar://host1:port1,host2` (or `pulsar+ssl://...`) and
    whether they speak TLS; ports default to 6650 (6651 with TLS). ValueError when the URL is
    not of that form."""
    scheme, sep, rest = service_url.partition("://")
    if not sep or scheme not in _DEFAULT_PORTS or not rest.strip("/"):
        raise ValueError(f"{service_url!r} is not a pulsar:// or pulsar+ssl:// service URL")
    addresses = []
    for part in rest.strip("/").split(","):
        parts = urlsplit(f"//{part.strip()}")
        try:
            port = parts.port
        except ValueError:
            port = None
            parts = urlsplit("//")
        if not parts.hostname:
            raise ValueError(f"{service_url!r}: expected host[:port], got {part!r}")
        addresses.append((parts.hostname, port or _DEFAULT_PORTS[scheme]))
    return addresses, scheme == "pulsar+ssl"


class PulsarLink:
    """One client connection to a Pulsar-protocol broker (see the module docstring). A link
    serves one request at a time; callers that share one hold a lock around `ask`."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self._stream = stream
        self._decoder = FrameDecoder()
        self._ids = itertools.count(1)

    @classmethod
    async def connect(
        cls, host: str, port: int, client_version: str, *, tls: bool = False
    ) -> PulsarLink:
        """Open a connection and complete the handshake (no authentication)."""
        try:
            if tls:
                stream: trio.abc.Stream = await trio.open_ssl_over_tcp_stream(
                    host, port, ssl_context=ssl.create_default_context()
                )
            else:
                stream = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            raise LinkFailed(f"{host}:{port}: {exc}") from None
        link = cls(stream)
        try:
            await link._send(
                Connect(client_version=client_version, protocol_version=PROTOCOL_VERSION)
            )
            answer = await link._next(lambda frame: isinstance(frame, Connected | Error))
            if not isinstance(answer, Connected):
                raise LinkFailed(f"{host}:{port}: handshake refused ({answer!r:.200})")
        except BaseException:
            await link.aclose()
            raise
        return link

    def request_id(self) -> int:
        return next(self._ids)

    async def ask(self, command: Command) -> Frame:
        """Send `command` (it carries a request id) and return the answer with that id;
        LinkFailed for an ERROR answer."""
        request_id = getattr(command, "request_id")  # noqa: B009 - every request has one
        await self._send(command)
        answer = await self._next(lambda frame: getattr(frame, "request_id", None) == request_id)
        if isinstance(answer, Error):
            raise LinkFailed(f"{answer.error.name}: {answer.message}", answer)
        return answer

    async def _send(self, command: Command) -> None:
        try:
            await self._stream.send_all(encode_command(command))
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise LinkFailed(f"cannot send: {exc or type(exc).__name__}") from None

    async def _next(self, wanted: Callable[[Frame], bool]) -> Frame:
        """The next frame `wanted` accepts, answering PINGs on the way."""
        while True:
            try:
                frame = self._decoder.next_frame()
            except RemoteProtocolError as exc:
                raise LinkFailed(f"undecodable answer: {exc}") from None
            if isinstance(frame, NeedData):
                try:
                    data = await self._stream.receive_some(65536)
                except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    raise LinkFailed(f"cannot receive: {exc or type(exc).__name__}") from None
                if not data:
                    raise LinkFailed("the broker closed the connection")
                self._decoder.feed(data)
            elif isinstance(frame, Ping):
                await self._send(Pong())
            elif wanted(frame):
                return frame

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self._stream.aclose()
