"""What Pulsar clients are told when the node is overloaded: the answer to a connection over a
listener's connection rate, sent before any connection state exists."""

from __future__ import annotations

from typing import Final

from mop.protocols.pulsar.commands import Error
from mop.protocols.pulsar.connection import NO_REQUEST_ID
from mop.protocols.pulsar.errors import ServerError
from mop.protocols.pulsar.frames import encode_command

__all__ = ["rate_refusal"]

_RATE_EXCEEDED: Final = encode_command(
    Error(
        request_id=NO_REQUEST_ID,
        error=ServerError.TooManyRequests,
        message="connection rate exceeded (limits.connection_rate): try again later",
    )
)


def rate_refusal(first: bytes) -> bytes:
    """The ERROR (TooManyRequests) that turns away a connection over its listener's
    connection rate, whatever it sent first; clients try to connect again after a while."""
    return _RATE_EXCEEDED
