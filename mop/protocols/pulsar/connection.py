"""The broker side of one Pulsar connection as a pure state machine (no I/O).

Feed it bytes with `receive_data`, take commands with `next_event`, turn answers into bytes with
`send`. It enforces what is per connection: CONNECT first and once, CONNECTED before any other
answer, an AUTH_RESPONSE only in answer to an AUTH_CHALLENGE, version negotiation and frame size
limits. Producers, consumers and topics live above it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Final, cast

from mop.protocols.pulsar.commands import (
    PROTOCOL_VERSION,
    Ack,
    AckResponse,
    ActiveConsumerChange,
    AuthChallenge,
    AuthData,
    AuthResponse,
    CloseConsumer,
    CloseProducer,
    Command,
    Connect,
    Connected,
    ConsumerStats,
    ConsumerStatsResponse,
    Error,
    Flow,
    GetLastMessageId,
    GetLastMessageIdResponse,
    GetOrCreateSchema,
    GetOrCreateSchemaResponse,
    GetSchema,
    GetSchemaResponse,
    GetTopicsOfNamespace,
    GetTopicsOfNamespaceResponse,
    Lookup,
    LookupResponse,
    LookupType,
    Message,
    MetadataResult,
    PartitionedMetadata,
    PartitionedMetadataResponse,
    Ping,
    Pong,
    Producer,
    ProducerSuccess,
    ReachedEndOfTopic,
    RedeliverUnacknowledgedMessages,
    Seek,
    Send,
    SendError,
    SendReceipt,
    Subscribe,
    Success,
    Unsubscribe,
)
from mop.protocols.pulsar.errors import (
    LocalProtocolError,
    ProtocolViolation,
    RemoteProtocolError,
    ServerError,
)
from mop.protocols.pulsar.frames import (
    DEFAULT_MAX_MESSAGE_SIZE,
    FRAME_SIZE_PADDING,
    NEED_DATA,
    ChecksumMismatch,
    FrameDecoder,
    NeedData,
    UnknownCommand,
    encode_command,
    encode_message_frame,
    encode_send_receipt,
)
from mop.protocols.pulsar.metadata import MessageIdData

# The request id of an ERROR that answers no request (a broken frame, a refused handshake).
NO_REQUEST_ID: Final = (1 << 64) - 1

# What a broker challenges a client with when its credentials expired: "fetch them again".
REFRESH_AUTH_DATA: Final = b"PulsarAuthRefresh"


class ConnectionState(Enum):
    AWAITING_CONNECT = "awaiting_connect"  # nothing received yet
    CONNECTING = "connecting"  # CONNECT received; the broker owes CONNECTED (or ERROR)
    CONNECTED = "connected"
    # Connected, and an AUTH_CHALLENGE waits for its AUTH_RESPONSE (everything else goes on).
    CHALLENGED = "challenged"
    CLOSED = "closed"  # handshake refused or protocol error: nothing more is read


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What the broker announces in CONNECTED and enforces on this connection."""

    server_version: str = "mop"
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    # The highest protocol version offered; CONNECTED answers min(client's, this).
    protocol_version: int = PROTOCOL_VERSION
    # Largest frame accepted before the handshake: a CONNECT is small, and a peer that is not a
    # Pulsar client must not make the broker buffer megabytes.
    max_connect_frame_size: int = 64 * 1024

    @property
    def max_frame_size(self) -> int:
        return self.max_message_size + FRAME_SIZE_PADDING


# What a client may send, i.e. the events `next_event` returns once connected.
ClientEvent = (
    Connect
    | AuthResponse
    | Ping
    | Pong
    | PartitionedMetadata
    | Lookup
    | GetTopicsOfNamespace
    | Producer
    | Send
    | CloseProducer
    | Subscribe
    | Flow
    | Ack
    | RedeliverUnacknowledgedMessages
    | Unsubscribe
    | Seek
    | CloseConsumer
    | GetLastMessageId
    | GetSchema
    | GetOrCreateSchema
    | ConsumerStats
    | ChecksumMismatch
    | UnknownCommand
)

_CLIENT_EVENTS: Final[tuple[type, ...]] = (
    Ping,
    Pong,
    PartitionedMetadata,
    Lookup,
    GetTopicsOfNamespace,
    Producer,
    Send,
    CloseProducer,
    Subscribe,
    Flow,
    Ack,
    RedeliverUnacknowledgedMessages,
    Unsubscribe,
    Seek,
    CloseConsumer,
    GetLastMessageId,
    GetSchema,
    GetOrCreateSchema,
    ConsumerStats,
    ChecksumMismatch,
    UnknownCommand,
)
_SERVER_COMMANDS: Final[tuple[type, ...]] = (
    Ping,
    Pong,
    Success,
    Error,
    PartitionedMetadataResponse,
    LookupResponse,
    GetTopicsOfNamespaceResponse,
    ProducerSuccess,
    SendReceipt,
    SendError,
    CloseProducer,
    Message,
    CloseConsumer,
    ReachedEndOfTopic,
    GetLastMessageIdResponse,
    ActiveConsumerChange,
    AckResponse,
    GetSchemaResponse,
    GetOrCreateSchemaResponse,
    ConsumerStatsResponse,
)

_S = ConnectionState
# The states in which the connection serves requests.
_SERVING: Final = (_S.CONNECTED, _S.CHALLENGED)
# (state, event type received) -> next state; a missing entry is a protocol violation.
_RECEIVE: Final[dict[tuple[ConnectionState, type], ConnectionState]] = {
    (_S.AWAITING_CONNECT, Connect): _S.CONNECTING,
    **{(state, event): state for state in _SERVING for event in _CLIENT_EVENTS},
    (_S.CHALLENGED, AuthResponse): _S.CONNECTED,
}
# (state, command type sent) -> next state; a missing entry is our own mistake.
_SEND: Final[dict[tuple[ConnectionState, type], ConnectionState]] = {
    (_S.CONNECTING, Connected): _S.CONNECTED,
    (_S.CONNECTING, Error): _S.CLOSED,
    (_S.AWAITING_CONNECT, Error): _S.CLOSED,
    (_S.CLOSED, Error): _S.CLOSED,
    **{(state, command): state for state in _SERVING for command in _SERVER_COMMANDS},
    (_S.CONNECTED, AuthChallenge): _S.CHALLENGED,
}


class ServerConnection:
    """One client connection, seen from the broker."""

    def __init__(self, limits: ConnectionLimits | None = None) -> None:
        self.limits = limits or ConnectionLimits()
        self.state = ConnectionState.AWAITING_CONNECT
        self.protocol_version = 0  # negotiated: set when CONNECT arrives
        self.client_version = ""
        # Frames received so far; a keepalive timer that sees no change drops the connection.
        self.frames_received = 0
        self._decoder = FrameDecoder(max_frame_size=self.limits.max_connect_frame_size)

    # -- receiving -------------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray) -> None:
        self._decoder.feed(data)

    def next_event(self) -> ClientEvent | NeedData:
        """The next command from the client, checked against the connection state.

        Raises RemoteProtocolError (with the ServerError to answer) when the client misbehaves;
        the connection is then CLOSED. A ChecksumMismatch is an event, not an error: the broker
        answers SEND_ERROR ChecksumError and goes on.
        """
        if self.state is ConnectionState.CLOSED:
            return NEED_DATA
        if self.state is ConnectionState.CONNECTING:
            raise LocalProtocolError("answer CONNECT (send CONNECTED or ERROR) before reading on")
        try:
            event = self._decoder.next_frame()
        except RemoteProtocolError:
            self.state = ConnectionState.CLOSED
            raise
        if isinstance(event, NeedData):
            return event
        self.frames_received += 1
        next_state = _RECEIVE.get((self.state, type(event)))
        if next_state is None:
            if self.state is ConnectionState.AWAITING_CONNECT:
                where = "before CONNECT"
            elif isinstance(event, AuthResponse):
                where = "without an AuthChallenge"
            else:
                where = "from a client"
            self.state = ConnectionState.CLOSED
            raise ProtocolViolation(f"{_name(event)} is not allowed {where}")
        self.state = next_state
        if isinstance(event, Connect):
            self._accept_connect(event)
        return cast(ClientEvent, event)  # the table admits only client events

    def _accept_connect(self, connect: Connect) -> None:
        self.client_version = connect.client_version
        self.protocol_version = max(0, min(connect.protocol_version, self.limits.protocol_version))
        self._decoder.max_frame_size = self.limits.max_frame_size

    # -- sending ---------------------------------------------------------------------------

    def send(self, command: Command) -> bytes:
        """The frame for `command`, checked against the connection state."""
        next_state = _SEND.get((self.state, type(command)))
        if next_state is None:
            raise LocalProtocolError(f"cannot send {_name(command)} while {self.state.value}")
        self.state = next_state
        return encode_command(command)

    def connected(self) -> bytes:
        """CONNECTED with the negotiated protocol version and the broker's limits."""
        return self.send(
            Connected(
                server_version=self.limits.server_version,
                protocol_version=self.protocol_version,
                max_message_size=self.limits.max_message_size,
            )
        )

    def auth_challenge(self, method: str, data: bytes = REFRESH_AUTH_DATA) -> bytes:
        """AUTH_CHALLENGE asking the client for fresh `method` credentials; the connection
        then takes one AUTH_RESPONSE (and goes on serving meanwhile)."""
        return self.send(
            AuthChallenge(
                server_version=self.limits.server_version,
                challenge=AuthData(auth_method_name=method, auth_data=data),
                protocol_version=self.protocol_version,
            )
        )

    def auth_refused(self, message: str) -> bytes:
        """The ERROR AuthenticationError that refuses a client's credentials (its request id
        answers no request, as Pulsar brokers send it). Refusing CONNECT closes the
        connection; later, the caller stops reading and closes it once the ERROR is out."""
        return self.send(
            Error(request_id=NO_REQUEST_ID, error=ServerError.AuthenticationError, message=message)
        )

    def protocol_error(self, error: RemoteProtocolError) -> bytes:
        """The ERROR that answers a RemoteProtocolError before the connection is closed."""
        self.state = ConnectionState.CLOSED
        return encode_command(
            Error(request_id=NO_REQUEST_ID, error=error.server_error, message=error.message)
        )

    def send_receipt(
        self,
        producer_id: int,
        sequence_id: int,
        ledger_id: int,
        entry_id: int,
        highest_sequence_id: int = 0,
    ) -> bytes:
        """SEND_RECEIPT for a persisted message (fast path of `send(SendReceipt(...))`)."""
        self._check_connected("SEND_RECEIPT")
        return encode_send_receipt(
            producer_id, sequence_id, ledger_id, entry_id, highest_sequence_id
        )

    def deliver(
        self,
        consumer_id: int,
        ledger_id: int,
        entry_id: int,
        raw: bytes,
        checksum: int | None,
        *,
        redelivery_count: int = 0,
        ack_set: Iterable[int] = (),
    ) -> bytes:
        """MESSAGE for a stored entry (`Payload.raw` and its CRC32C), the delivery fast path."""
        self._check_connected("MESSAGE")
        return encode_message_frame(
            consumer_id,
            ledger_id,
            entry_id,
            raw,
            checksum,
            redelivery_count=redelivery_count,
            ack_set=ack_set,
        )

    def _check_connected(self, what: str) -> None:
        if self.state not in _SERVING:
            raise LocalProtocolError(f"cannot send {what} while {self.state.value}")


def _name(command: object) -> str:
    if isinstance(command, UnknownCommand):
        return f"command type {command.type}"
    if isinstance(command, ChecksumMismatch):
        return type(command.command).__name__
    return type(command).__name__


# --- answers whose shape is easy to get wrong ----------------------------------------------------


def lookup_connect(
    request_id: int,
    broker_url: str | None,
    *,
    broker_url_tls: str | None = None,
    authoritative: bool = False,
) -> LookupResponse:
    """This broker serves the topic: the client connects to `broker_url` (its pool key), or
    to `broker_url_tls` when it speaks TLS."""
    return LookupResponse(
        request_id=request_id,
        response=LookupType.Connect,
        broker_service_url=broker_url,
        broker_service_url_tls=broker_url_tls,
        authoritative=authoritative,
    )


def lookup_redirect(request_id: int, owner_url: str) -> LookupResponse:
    """Another broker owns the topic; authoritative, so the owner answers Connect, not Redirect."""
    return LookupResponse(
        request_id=request_id,
        response=LookupType.Redirect,
        broker_service_url=owner_url,
        authoritative=True,
    )


def lookup_failed(request_id: int, error: ServerError, message: str) -> LookupResponse:
    return LookupResponse(
        request_id=request_id, response=LookupType.Failed, error=error, message=message
    )


def partitioned_metadata(request_id: int, partitions: int = 0) -> PartitionedMetadataResponse:
    """0 partitions: a non-partitioned topic (the client then looks the topic itself up)."""
    return PartitionedMetadataResponse(
        request_id=request_id, partitions=partitions, response=MetadataResult.Success
    )


def partitioned_metadata_failed(
    request_id: int, error: ServerError, message: str
) -> PartitionedMetadataResponse:
    return PartitionedMetadataResponse(
        request_id=request_id, response=MetadataResult.Failed, error=error, message=message
    )


def message_id(ledger_id: int, entry_id: int, batch_index: int = -1) -> MessageIdData:
    """A MessageIdData; an empty topic's last id has entry -1, sent as 2^64 - 1 (reference §9)."""
    return MessageIdData(
        ledger_id=ledger_id & 0xFFFF_FFFF_FFFF_FFFF,
        entry_id=entry_id & 0xFFFF_FFFF_FFFF_FFFF,
        batch_index=batch_index,
    )


__all__ = [
    "NO_REQUEST_ID",
    "REFRESH_AUTH_DATA",
    "ClientEvent",
    "ConnectionLimits",
    "ConnectionState",
    "ServerConnection",
    "lookup_connect",
    "lookup_failed",
    "lookup_redirect",
    "message_id",
    "partitioned_metadata",
    "partitioned_metadata_failed",
]
