"""The client side of the Pulsar binary protocol, spoken with mop's own codec: the questions
pulsar-client cannot be asked (which topics a namespace has, which broker owns a topic), for the
cluster backend, the Spark data source and the links between the brokers of a cluster.

`PulsarLink` is one connection: the CONNECT handshake, then one request at a time, its answer
matched by request id, PINGs answered on the way. `list_topics` asks a link for the topics of a
namespace; `lookup` finds the broker that owns a topic, following redirects; `connect_first`
opens a link to the first broker of a service URL that answers. Everything that goes wrong with
a connection or a broker's answer is a `LinkFailed`.

This is trio code over the pure core; it needs neither the serving part nor the processor.
"""

from __future__ import annotations

import itertools
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

import trio

from mop.protocols.pulsar.commands import (
    PROTOCOL_VERSION,
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
from mop.protocols.pulsar.frames import Frame, FrameDecoder, NeedData, encode_command
from mop.settings import ClusterSettings

__all__ = [
    "ClientAuth",
    "LinkFailed",
    "LookupFailed",
    "PulsarLink",
    "UnexpectedAnswer",
    "Unreachable",
    "cluster_client_auth",
    "connect_first",
    "list_topics",
    "lookup",
    "service_addresses",
]

_DEFAULT_PORTS: Final = {"pulsar": 6650, "pulsar+ssl": 6651}
MAX_REDIRECTS: Final = 8


class LinkFailed(Exception):
    """The broker could not be reached, closed the connection, refused the handshake, or
    answered a request with an ERROR (then `error` is that answer)."""

    def __init__(self, message: str, error: Error | None = None) -> None:
        super().__init__(message)
        self.error = error


class Unreachable(LinkFailed):
    """No broker of a service URL completed the handshake."""


class UnexpectedAnswer(LinkFailed):
    """The broker answered a request with a command of another kind."""


class LookupFailed(LinkFailed):
    """A lookup was answered, but without an owner: a failed lookup, no broker URL, or too many
    redirects."""


@dataclass(frozen=True, slots=True)
class ClientAuth:
    """What a client shows the brokers: an authentication method and its data in CONNECT
    ("token" with a JWT, "basic" with b"user:password"), and the TLS context that verifies
    brokers on pulsar+ssl:// URLs (None: the system's trust store)."""

    method: str | None = None
    data: bytes | None = field(default=None, repr=False)
    ssl_context: ssl.SSLContext | None = None
    # A file the token is read from again when a broker asks for fresh credentials
    # (AUTH_CHALLENGE), so that a token replaced there keeps the connections going.
    token_file: str | None = None

    def tls_context(self) -> ssl.SSLContext:
        return self.ssl_context or ssl.create_default_context()

    def current_data(self) -> bytes | None:
        """The credentials to show now: the token file's current token, if it can be read,
        else what was read at start."""
        if self.token_file:
            try:
                token = Path(self.token_file).read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError):
                return self.data
            if token:
                return token.encode()
        return self.data


NO_AUTH: Final = ClientAuth()


def cluster_client_auth(settings: ClusterSettings) -> ClientAuth:
    """The credentials and broker trust `cluster.auth` and `cluster.tls_cafile` describe;
    ValueError (one line naming the setting) when they cannot be used."""
    auth = settings.auth
    context = None
    if settings.tls_cafile:
        try:
            context = ssl.create_default_context(cafile=settings.tls_cafile)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"cluster.tls_cafile {settings.tls_cafile}: {exc}") from None
    if auth.method == "token":
        token = auth.token
        if auth.token_file:
            try:
                token = Path(auth.token_file).read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"cluster.auth.token_file {auth.token_file}: {exc}") from None
        if not token:
            raise ValueError('cluster.auth: method = "token" needs token or token_file')
        return ClientAuth("token", token.encode(), context, token_file=auth.token_file)
    if auth.method == "basic":
        if not auth.username or auth.password is None:
            raise ValueError('cluster.auth: method = "basic" needs username and password')
        if ":" in auth.username:
            raise ValueError("cluster.auth.username: must not contain ':'")
        return ClientAuth("basic", f"{auth.username}:{auth.password}".encode(), context)
    return ClientAuth(ssl_context=context)


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
        cls,
        host: str,
        port: int,
        client_version: str,
        *,
        tls: bool = False,
        auth: ClientAuth = NO_AUTH,
    ) -> PulsarLink:
        """Open a connection and complete the handshake, authenticated as `auth` says."""
        try:
            if tls:
                stream: trio.abc.Stream = await trio.open_ssl_over_tcp_stream(
                    host, port, ssl_context=auth.tls_context()
                )
            else:
                stream = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            raise LinkFailed(f"{host}:{port}: {exc}") from None
        link = cls(stream)
        try:
            await link._send(
                Connect(
                    client_version=client_version,
                    protocol_version=PROTOCOL_VERSION,
                    auth_method_name=auth.method,
                    auth_data=auth.current_data(),
                )
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


async def connect_first(
    service_url: str, client_version: str, *, auth: ClientAuth = NO_AUTH
) -> PulsarLink:
    """A link to the first broker of `service_url` that completes the handshake, its hosts tried
    in turn; Unreachable when none does, ValueError when the URL is not a service URL."""
    addresses, tls = service_addresses(service_url)
    failures = []
    for host, port in addresses:
        try:
            return await PulsarLink.connect(host, port, client_version, tls=tls, auth=auth)
        except LinkFailed as exc:
            failures.append(str(exc))
    raise Unreachable(f"no broker of {service_url} answers: {'; '.join(failures)}")


async def list_topics(
    link: PulsarLink, namespace: str, mode: TopicsMode = TopicsMode.ALL
) -> list[str]:
    """The topics of `namespace` ("tenant/namespace") that the broker at the other end of `link`
    answers with (GET_TOPICS_OF_NAMESPACE), partitions named one by one, in its order."""
    answer = await link.ask(
        GetTopicsOfNamespace(request_id=link.request_id(), namespace=namespace, mode=mode)
    )
    if not isinstance(answer, GetTopicsOfNamespaceResponse):
        raise UnexpectedAnswer(f"unexpected answer {answer!r:.200}")
    return list(answer.topics)


async def lookup(
    service_url: str,
    topic: str,
    client_version: str,
    *,
    max_redirects: int = MAX_REDIRECTS,
    auth: ClientAuth = NO_AUTH,
) -> str:
    """The service URL of the broker that owns `topic`, asking the first broker of
    `service_url` that answers and following its redirects (one short link per broker asked).
    Unreachable or ValueError as `connect_first`; LookupFailed when the owner is not named."""
    url = service_url
    authoritative = False
    what = f"lookup of {topic}"
    for _ in range(max_redirects):
        link = await connect_first(url, client_version, auth=auth)
        try:
            reply = await link.ask(
                Lookup(topic=topic, request_id=link.request_id(), authoritative=authoritative)
            )
        finally:
            await link.aclose()
        if not isinstance(reply, LookupResponse) or reply.response is LookupType.Failed:
            raise LookupFailed(f"{what} failed: {reply!r:.200}")
        if not reply.broker_service_url:
            raise LookupFailed(f"{what}: no broker URL in {reply!r:.200}")
        if reply.response is LookupType.Connect:
            return reply.broker_service_url
        url, authoritative = reply.broker_service_url, reply.authoritative
    raise LookupFailed(f"{what}: more than {max_redirects} redirects")
