"""Errors of the Pulsar protocol core, named after whose fault they are (the h11 convention).

`RemoteProtocolError` means the peer sent something invalid and carries the `ServerError` to put
in the ERROR frame that answers it; `LocalProtocolError` means our own code misused the API.
"""

from __future__ import annotations

from enum import IntEnum


class ServerError(IntEnum):
    """The ServerError enum of the Pulsar protocol (reference §11)."""

    UnknownError = 0
    MetadataError = 1
    PersistenceError = 2
    AuthenticationError = 3
    AuthorizationError = 4
    ConsumerBusy = 5
    ServiceNotReady = 6
    ProducerBlockedQuotaExceededError = 7
    ProducerBlockedQuotaExceededException = 8
    ChecksumError = 9
    UnsupportedVersionError = 10
    TopicNotFound = 11
    SubscriptionNotFound = 12
    ConsumerNotFound = 13
    TooManyRequests = 14
    TopicTerminatedError = 15
    ProducerBusy = 16
    InvalidTopicName = 17
    IncompatibleSchema = 18
    ConsumerAssignError = 19
    TransactionCoordinatorNotFound = 20
    InvalidTxnStatus = 21
    NotAllowedError = 22
    TransactionConflict = 23
    TransactionNotFound = 24
    ProducerFenced = 25


class PulsarError(Exception):
    """Base of every error raised by the Pulsar protocol core."""


class RemoteProtocolError(PulsarError):
    """The peer broke the protocol; the connection cannot continue.

    `server_error` is what the broker puts in the ERROR frame it sends before closing.
    """

    server_error: ServerError = ServerError.UnknownError

    def __init__(self, message: str, *, server_error: ServerError | None = None) -> None:
        super().__init__(message)
        self.message = message
        if server_error is not None:
            self.server_error = server_error

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, server_error={self.server_error.name})"


class MalformedFrame(RemoteProtocolError):
    """The bytes do not parse as a frame, a command or a metadata block."""


class FrameTooLarge(RemoteProtocolError):
    """A frame announces a size above the configured maximum."""

    server_error = ServerError.NotAllowedError


class ProtocolViolation(RemoteProtocolError):
    """The frame parses but breaks a rule of the protocol (e.g. a command before CONNECT)."""

    server_error = ServerError.NotAllowedError


class LocalProtocolError(PulsarError):
    """Our own code asked for something the protocol does not allow."""


__all__ = [
    "FrameTooLarge",
    "LocalProtocolError",
    "MalformedFrame",
    "ProtocolViolation",
    "PulsarError",
    "RemoteProtocolError",
    "ServerError",
]
