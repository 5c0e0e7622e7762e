"""`PulsarClient`: mop's own Pulsar client, on trio and mop's codec, for the separated proxy.

It keeps one connection per broker (`BrokerConnection`), shared by every producer and consumer
it has there, finds a topic's broker with LOOKUP (following Redirect answers, retrying while
brokers answer ServiceNotReady or cannot be reached, until the operation timeout), and runs the
reconnection of its producers and consumers in its own nursery: when a broker goes away or
gives a topic up, they look the topic up again and carry on.

Everything runs on the trio thread that called `serve`: no thread, no callback from elsewhere.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import trio

from mop.exception_groups import leaves
from mop.protocols.pulsar.client import NO_AUTH, ClientAuth, service_addresses
from mop.protocols.pulsar.commands import (
    Lookup,
    LookupResponse,
    LookupType,
    MetadataResult,
    PartitionedMetadata,
    PartitionedMetadataResponse,
)
from mop.protocols.pulsar.driver.connection import BrokerConnection
from mop.protocols.pulsar.driver.errors import (
    ClientClosed,
    ConnectionLost,
    DriverError,
    NoBrokerAnswers,
    ServerRefused,
    Unavailable,
)
from mop.protocols.pulsar.driver.stats import LinkStats
from mop.protocols.pulsar.errors import RemoteProtocolError, ServerError

__all__ = ["ClientOptions", "PulsarClient", "connect_failure", "retryable"]

log = logging.getLogger("mop.pulsar.driver")

MAX_REDIRECTS: Final = 8
# How long a service URL address is waited for before the next is tried beside it (the delay
# of "happy eyeballs", RFC 8305): a silent broker must not use up the whole connect timeout.
NEXT_ADDRESS_AFTER: Final = 0.25
# Answers after which the same operation is tried again (after a pause), until its timeout.
_RETRYABLE: Final = frozenset(
    {ServerError.ServiceNotReady, ServerError.TooManyRequests, ServerError.MetadataError}
)
_T = TypeVar("_T")


def retryable(exc: BaseException) -> bool:
    """Whether an operation that failed with `exc` may succeed if tried again soon."""
    if isinstance(exc, ConnectionLost | Unavailable):
        return True
    return isinstance(exc, ServerRefused) and exc.error in _RETRYABLE


def connect_failure(exc: BaseException, connect_timeout: float) -> str:
    """What went wrong with a connection to a broker, in a few words: "connection refused",
    "timed out after 10 s", "host name not found", or the error itself."""
    if isinstance(exc, trio.TooSlowError):
        return f"timed out after {connect_timeout:g} s"
    if isinstance(exc, socket.gaierror):
        return f"host name not found ({exc.strerror or exc})"
    # trio tries every address of the host: its error says "all attempts failed", and the
    # attempts' own errors, which tell why, are its cause.
    cause = exc.__cause__
    if isinstance(exc, OSError) and isinstance(cause, BaseExceptionGroup):
        reasons = dict.fromkeys(_os_reason(leaf) for leaf in leaves(cause))
        return "; ".join(reasons)
    if isinstance(exc, OSError):
        return _os_reason(exc)
    return str(exc) or type(exc).__name__


def _os_reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        # OpenSSL's reason ("WRONG_VERSION_NUMBER") where the error came from OpenSSL.
        return f"TLS: {getattr(exc, 'reason', None) or exc}"
    if isinstance(exc, OSError) and exc.errno is not None:
        # The system's words for it ("connection refused"), without the address trio adds.
        return os.strerror(exc.errno).lower()
    return str(exc) or type(exc).__name__


class ClientOptions:
    """How a `PulsarClient` talks to the brokers."""

    __slots__ = (
        "auth",
        "client_version",
        "connect_timeout",
        "keepalive",
        "operation_timeout",
        "stats",
    )

    def __init__(
        self,
        client_version: str,
        *,
        operation_timeout: float = 30.0,
        connect_timeout: float = 10.0,
        auth: ClientAuth = NO_AUTH,
        keepalive: float = 30.0,
        stats: LinkStats | None = None,
    ) -> None:
        self.client_version = client_version
        self.operation_timeout = operation_timeout
        self.connect_timeout = connect_timeout
        # The credentials shown to every broker, and the trust for pulsar+ssl:// brokers.
        self.auth = auth
        # A connection silent this long is pinged; twice this long, it is given up as stalled.
        self.keepalive = keepalive
        # What the clients with these options count about their links to the brokers.
        self.stats = stats if stats is not None else LinkStats()


class PulsarClient:
    """See the module docstring. Run it with `await nursery.start(client.serve)`; `aclose()`
    closes its connections (producers and consumers should be closed first)."""

    def __init__(self, service_url: str, options: ClientOptions) -> None:
        self.service_url = service_url
        # ValueError for a URL that is not pulsar:// or pulsar+ssl://
        self._addresses, self._tls = service_addresses(service_url)
        self.options = options
        # By (address connected to, broker a proxy there is asked to reach, or None).
        self._connections: dict[tuple[str, str | None], BrokerConnection] = {}
        self._connecting: dict[tuple[str, str | None], trio.Event] = {}
        self._next_address = itertools.cycle(range(len(self._addresses)))
        self._nursery: trio.Nursery | None = None
        self._closed = False
        self._stop = trio.Event()

    @property
    def nursery(self) -> trio.Nursery:
        """Where the client runs connections and reconnections."""
        if self._nursery is None or self._closed:
            raise ClientClosed("the client is not running")
        return self._nursery

    @property
    def closed(self) -> bool:
        return self._closed

    async def start(self, run: Callable[..., Awaitable[object]]) -> None:
        """`await nursery.start(run)` in the client's nursery (for producers and consumers);
        ClientClosed once the client stops, also while its nursery is winding down."""
        try:
            await self.nursery.start(run)
        except RuntimeError as exc:
            if self._nursery is None or "closed" not in str(exc):
                raise
            raise ClientClosed("the client is closed") from None

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await self._stop.wait()
            finally:
                # However it ends (`aclose`, or cancelled from outside), the client is done from
                # now on: what is still starting (a producer whose caller is shielded, say)
                # must not wait for connections while the nursery winds down.
                self._closed = True
                for connection in list(self._connections.values()):
                    connection.close()
                self._connections.clear()
            nursery.cancel_scope.cancel()

    async def aclose(self) -> None:
        """Close every connection and stop `serve`."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        for connection in list(self._connections.values()):
            connection.close()
        self._connections.clear()
        self._stop.set()
        await trio.lowlevel.checkpoint()

    # -- connections -----------------------------------------------------------------------

    async def connection(self, url: str, proxy_to: str | None = None) -> BrokerConnection:
        """The connection to the broker at `url` (`pulsar://host:port`), opened on first use.
        With `proxy_to`, `url` is a Pulsar proxy, asked in CONNECT to reach that broker (one
        connection per broker behind it)."""
        key = (url, proxy_to)
        while True:
            if self._closed:
                raise ClientClosed("the client is closed")
            existing = self._connections.get(key)
            if existing is not None and not existing.closed:
                await trio.lowlevel.checkpoint()
                return existing
            opening = self._connecting.get(key)
            if opening is None:
                break
            await opening.wait()
        opening = self._connecting[key] = trio.Event()
        try:
            connection = await self._open(url, proxy_to)
            self._connections[key] = connection
            return connection
        finally:
            del self._connecting[key]
            opening.set()

    async def _open(self, url: str, proxy_to: str | None) -> BrokerConnection:
        try:
            addresses, _tls = service_addresses(url)
        except ValueError as exc:
            raise Unavailable(f"broker URL {url!r}: {exc}") from None
        host, port = addresses[0]
        tls = url.startswith("pulsar+ssl://")
        options = self.options
        try:
            with trio.fail_after(options.connect_timeout):
                if tls:
                    stream: trio.abc.Stream = await trio.open_ssl_over_tcp_stream(
                        host, port, ssl_context=options.auth.tls_context()
                    )
                else:
                    stream = await trio.open_tcp_stream(host, port)
                connection = BrokerConnection(
                    stream,
                    url,
                    keepalive=options.keepalive,
                    link=options.stats.link(proxy_to or url),
                )
                try:
                    await connection.handshake(
                        options.client_version, auth=options.auth, proxy_to_broker_url=proxy_to
                    )
                except BaseException:
                    with trio.CancelScope(shield=True):
                        await stream.aclose()
                    raise
        except (OSError, trio.TooSlowError, ConnectionLost, RemoteProtocolError) as exc:
            raise Unavailable(f"{url}: {connect_failure(exc, options.connect_timeout)}") from None
        try:
            await self.start(connection.serve)
        except BaseException:
            # The client stopped while this connection was opening: it must not be left open.
            with trio.CancelScope(shield=True):
                await stream.aclose()
            raise
        if self._closed:  # it stopped meanwhile: this one goes with the others
            connection.close()
            raise ClientClosed("the client is closed")
        log.debug(
            "connected to %s%s (%s)",
            url,
            f" for {proxy_to}" if proxy_to else "",
            connection.server_version or "unnamed broker",
        )
        return connection

    async def reach(self) -> BrokerConnection:
        """A connection to one of the service URL's brokers: an open one, or a new one to the
        next that answers (Unavailable when none does). For health checks."""
        return await self._service_connection()

    async def _service_connection(self) -> BrokerConnection:
        """A connection to one of the service URL's brokers (the first that answers). The
        addresses are tried in turn, each with a head start of `NEXT_ADDRESS_AFTER` before the
        next is tried beside it (at once when it fails): a broker that silently drops traffic
        then costs that head start, not the whole connect timeout, and a live one further on is
        still reached in time. NoBrokerAnswers says why each address failed, in order."""
        count = len(self._addresses)
        first = next(self._next_address)
        scheme = "pulsar+ssl" if self._tls else "pulsar"
        urls = [
            f"{scheme}://{host}:{port}"
            for host, port in (self._addresses[(first + i) % count] for i in range(count))
        ]
        failures: dict[int, str] = {}
        done = [trio.Event() for _ in urls]
        answered: list[BrokerConnection] = []
        closed: list[ClientClosed] = []

        async def attempt(index: int, scope: trio.CancelScope) -> None:
            try:
                connection = await self.connection(urls[index])
            except Unavailable as exc:
                failures[index] = str(exc)
            except ClientClosed as exc:
                closed.append(exc)
                scope.cancel()
            else:
                answered.append(connection)
                scope.cancel()  # the others are not needed (one that opened meanwhile stays)
            finally:
                done[index].set()

        async with trio.open_nursery() as nursery:
            for index in range(count):
                nursery.start_soon(attempt, index, nursery.cancel_scope)
                with trio.move_on_after(NEXT_ADDRESS_AFTER):
                    await done[index].wait()
                if answered or closed:
                    break
        if answered:
            return answered[0]
        if closed:
            raise closed[0]
        raise NoBrokerAnswers(self.service_url, [failures[i] for i in sorted(failures)])

    # -- lookups ---------------------------------------------------------------------------

    async def lookup(self, topic: str) -> BrokerConnection:
        """The connection to the broker that owns `topic` now, retried until the operation
        timeout while brokers cannot be reached or are not ready."""
        return await self.retrying(f"lookup of {topic}", lambda: self._lookup_once(topic))

    async def _lookup_once(self, topic: str) -> BrokerConnection:
        service = connection = await self._service_connection()
        authoritative = False
        for _ in range(MAX_REDIRECTS):
            self.options.stats.lookups += 1
            answer = await connection.request(
                Lookup(topic=topic, request_id=connection.next_id(), authoritative=authoritative),
                self.options.operation_timeout,
            )
            if not isinstance(answer, LookupResponse):
                raise Unavailable(f"lookup of {topic}: unexpected answer {answer!r:.200}")
            if answer.response is LookupType.Failed or answer.response is None:
                raise ServerRefused(
                    answer.error or ServerError.ServiceNotReady,
                    f"lookup of {topic}: {answer.message or 'failed'}",
                )
            url = answer.broker_service_url_tls if self._tls else answer.broker_service_url
            url = url or answer.broker_service_url
            if not url:
                raise Unavailable(f"lookup of {topic}: no broker URL in the answer")
            # Brokers behind a Pulsar proxy: reached through the service URL, the proxy told
            # in CONNECT which broker to reach.
            if answer.proxy_through_service_url:
                connection = await self.connection(service.address, proxy_to=url)
            else:
                connection = await self.connection(url)
            if answer.response is LookupType.Connect:
                return connection
            authoritative = answer.authoritative
        raise Unavailable(f"lookup of {topic}: more than {MAX_REDIRECTS} redirects")

    async def partitions(self, topic: str) -> int:
        """How many partitions `topic` has (0: not partitioned), as the brokers' metadata
        says (PARTITIONED_METADATA, asked of any broker of the service URL), retried until
        the operation timeout while brokers cannot be reached or are not ready."""
        return await self.retrying(
            f"partitioned metadata of {topic}", lambda: self._partitions_once(topic)
        )

    async def _partitions_once(self, topic: str) -> int:
        connection = await self._service_connection()
        answer = await connection.request(
            PartitionedMetadata(topic=topic, request_id=connection.next_id()),
            self.options.operation_timeout,
        )
        if not isinstance(answer, PartitionedMetadataResponse):
            raise Unavailable(f"partitioned metadata of {topic}: unexpected answer {answer!r:.200}")
        if answer.response is MetadataResult.Failed:
            raise ServerRefused(
                answer.error or ServerError.ServiceNotReady,
                f"partitioned metadata of {topic}: {answer.message or 'failed'}",
            )
        return answer.partitions or 0

    async def retrying(self, what: str, attempt: Callable[[], Awaitable[_T]]) -> _T:
        """`attempt()` until it succeeds, fails for good, or the operation timeout passes
        (then the last retryable error is raised, as Unavailable)."""
        deadline = trio.current_time() + self.options.operation_timeout
        pause = 0.05
        while True:
            try:
                with trio.fail_after(max(0.0, deadline - trio.current_time())):
                    return await attempt()
            except trio.TooSlowError:
                raise Unavailable(f"{what}: no answer within the operation timeout") from None
            except DriverError as exc:
                if not retryable(exc) or self._closed:
                    raise
                if trio.current_time() + pause >= deadline:
                    raise Unavailable(f"{what}: {exc}") from None
                log.debug("%s: %s; trying again", what, exc)
            await trio.sleep(pause)
            pause = min(1.0, pause * 2)
