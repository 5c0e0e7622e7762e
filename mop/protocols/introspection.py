"""What the admin API sees of a protocol's clients and state, and what it may do with them.

Every protocol handler offers an `AdminView` (`ProtocolHandler.admin_view()`): the clients
connected to this node as plain records, and a way to disconnect one. A protocol that keeps
sessions and retained messages and takes messages to publish (MQTT) offers those too, as the
view's `sessions`, `retained` and `publisher`; the others leave them None. The records are
frozen snapshots: reading them never reaches back into a connection.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar


@dataclass(frozen=True, slots=True)
class SubscriptionInfo:
    """One subscription of a client or session. `filter` is an MQTT topic filter (a Pulsar
    consumer's topic, by its MQTT name where it has one); `group` is the shared subscription
    group (`$share/{group}/...`), or the Pulsar subscription name."""

    client_id: str
    filter: str
    qos: int
    group: str | None = None


@dataclass(frozen=True, slots=True)
class ClientInfo:
    """A client connected to this node, as it is now. Counters count from its connect."""

    client_id: str
    protocol: str
    username: str | None
    peer: str  # "host:port"
    connected_at: float  # seconds since the epoch
    protocol_version: str  # "5.0", "3.1.1", "3.1", "pulsar"
    keep_alive: int  # seconds (0: none)
    clean_start: bool
    subscriptions: int
    inflight: int  # sent and not yet acknowledged by the client
    queued: int  # waiting on this node to be sent (for room in the client's window)
    messages_in: int
    messages_out: int


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A session that outlives connections: connected (here or through another node of the
    deployment) or offline until it expires."""

    client_id: str
    connected: bool
    expiry_interval: int  # seconds; 0xFFFFFFFF: never expires
    disconnected_at: float | None  # None while connected
    expires_at: float | None  # None while connected or when it never expires
    subscriptions: tuple[SubscriptionInfo, ...]
    inflight: int  # messages sent to the client and not yet acknowledged by it
    will: bool  # a will waits (for its delay, or for the end of the session)


@dataclass(frozen=True, slots=True)
class RetainedInfo:
    topic: str
    payload: bytes
    qos: int
    published_at: float  # seconds since the epoch


@dataclass(frozen=True, slots=True)
class PublishRequest:
    """A message an operator publishes: `topic` is a topic name (no wildcards)."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    user_properties: tuple[tuple[str, str], ...] = ()


class BadTopic(ValueError):
    """A topic (or filter) the protocol's clients could not use either: not valid, or
    reserved (`reserved`: `$SYS` and the deployment's own topics)."""

    def __init__(self, message: str, *, reserved: bool = False) -> None:
        super().__init__(message)
        self.reserved = reserved


class TooLarge(ValueError):
    """A message larger than the protocol's clients may publish to this node."""


class SessionBusy(Exception):
    """The session is connected through another node of the deployment: it is that node's
    to end."""


class SessionsView(Protocol):
    def sessions(self) -> Iterable[SessionInfo]:
        """Every session of the deployment: those connected here as they are now, the others
        as the shared session table has them."""
        ...

    def session(self, client_id: str) -> SessionInfo | None: ...

    async def delete(self, client_id: str) -> bool:
        """End a session now (its client disconnected first, when connected here); False
        when there is none. SessionBusy when it is connected through another node."""
        ...


class RetainedView(Protocol):
    def __len__(self) -> int: ...

    def matching(self, topic_filter: str) -> Iterator[RetainedInfo]:
        """The retained messages of the topics the filter matches; BadTopic for a filter
        that is not valid."""
        ...

    def get(self, topic: str) -> RetainedInfo | None: ...

    async def delete(self, topic: str) -> bool:
        """Clear the retained message of `topic`; False when it has none. BadTopic for a
        topic the node keeps for itself (`$SYS`)."""
        ...


class Publisher(Protocol):
    async def publish(self, request: PublishRequest) -> str:
        """Publish as the protocol's own clients would (a retained message is retained) and
        return the message id; BadTopic when the topic is not valid or not allowed,
        ValueError for another request the protocol does not take (retained messages turned
        off), BackendError when the message could not be stored."""
        ...


class AdminView(Protocol):
    """One protocol's clients on this node, for the admin API."""

    def connected(self) -> int:
        """How many clients are connected now (cheap: no records made)."""
        ...

    def clients(self) -> Iterable[ClientInfo]: ...

    def client(self, client_id: str) -> ClientInfo | None: ...

    def subscriptions(self, client_id: str) -> list[SubscriptionInfo] | None:
        """The subscriptions of a connected client; None when it is not connected here."""
        ...

    def kick(self, client_id: str) -> bool:
        """Disconnect the client (telling it why where its protocol can: MQTT 5 reason 0x98,
        administrative action); its session stays as its expiry says. False when it is not
        connected here."""
        ...

    @property
    def sessions(self) -> SessionsView | None: ...

    @property
    def retained(self) -> RetainedView | None: ...

    @property
    def publisher(self) -> Publisher | None: ...


class ListedConnection(Protocol):
    """A connection an adapter lists as one admin client, under its own id."""

    @property
    def admin_id(self) -> str: ...


_C = TypeVar("_C", bound=ListedConnection)


class ConnectionsView(Generic[_C]):
    """An `AdminView` for an adapter whose clients are its connections and that keeps no
    sessions or retained messages of its own (publishing goes through the MQTT view): what
    such adapters share. A subclass says how a connection is described, which subscriptions
    it holds and how it is closed."""

    sessions = None
    retained = None
    publisher = None

    def _connections(self) -> Iterable[_C]:
        raise NotImplementedError

    def _describe(self, connection: _C) -> ClientInfo:
        raise NotImplementedError

    def _subscriptions_of(self, connection: _C) -> list[SubscriptionInfo]:
        raise NotImplementedError

    def _close(self, connection: _C) -> None:
        raise NotImplementedError

    def connected(self) -> int:
        return sum(1 for _ in self._connections())

    def clients(self) -> list[ClientInfo]:
        return [self._describe(connection) for connection in list(self._connections())]

    def _find(self, client_id: str) -> _C | None:
        for connection in self._connections():
            if connection.admin_id == client_id:
                return connection
        return None

    def client(self, client_id: str) -> ClientInfo | None:
        connection = self._find(client_id)
        return self._describe(connection) if connection is not None else None

    def subscriptions(self, client_id: str) -> list[SubscriptionInfo] | None:
        connection = self._find(client_id)
        return self._subscriptions_of(connection) if connection is not None else None

    def kick(self, client_id: str) -> bool:
        connection = self._find(client_id)
        if connection is None:
            return False
        self._close(connection)
        return True
