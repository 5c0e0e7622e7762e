"""What goes wrong for a `PulsarClient`: a connection lost, a broker's refusal (with its
`ServerError`), a broker that cannot be found or reached, a message too large to send, an
operation on something closed."""

from __future__ import annotations

from mop.protocols.pulsar.errors import ServerError

__all__ = [
    "ClientClosed",
    "ConnectionLost",
    "DriverError",
    "MessageTooLarge",
    "NoBrokerAnswers",
    "ServerRefused",
    "Unavailable",
]


class DriverError(Exception):
    """Base of the client's errors."""


class ConnectionLost(DriverError):
    """The connection to a broker ended before the answer came."""


class Unavailable(DriverError):
    """No broker could be reached, or none owns the topic now (after retrying until the
    operation timeout)."""


class NoBrokerAnswers(Unavailable):
    """None of the service URL's brokers could be connected to; `attempts` says why, one
    "url: reason" per broker tried."""

    def __init__(self, service_url: str, attempts: list[str]) -> None:
        super().__init__(f"no broker of {service_url} answers: {'; '.join(attempts)}")
        self.attempts = attempts


class ClientClosed(DriverError):
    """The producer, consumer or client was closed."""


class MessageTooLarge(DriverError):
    """A message larger than the broker takes (the `max_message_size` of its CONNECTED): it
    is not sent, since the broker would drop the connection over it."""


class ServerRefused(DriverError):
    """The broker answered ERROR (or SEND_ERROR): `error` says why."""

    def __init__(self, error: ServerError, message: str) -> None:
        super().__init__(f"{error.name}: {message}")
        self.error = error
        self.message = message
