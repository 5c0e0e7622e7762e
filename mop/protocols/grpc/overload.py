"""What gRPC clients are told when the node is overloaded: the answer to a connection over a
listener's connection rate or over the node's connection limit, made before any connection
state exists."""

from __future__ import annotations

from typing import Final

import h2.config
import h2.connection
import h2.errors

__all__ = ["LIMIT_REFUSAL", "rate_refusal"]


def _refusal(reason: bytes) -> bytes:
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    connection.initiate_connection()
    # ENHANCE_YOUR_CALM with no stream taken: gRPC clients back off and connect again.
    connection.close_connection(
        error_code=h2.errors.ErrorCodes.ENHANCE_YOUR_CALM, additional_data=reason
    )
    return connection.data_to_send()


_RATE_EXCEEDED: Final = _refusal(
    b"connection rate exceeded (limits.connection_rate): try again later"
)
# The answer to a connection when the node serves limits.max_connections already.
LIMIT_REFUSAL: Final = _refusal(b"too many connections (limits.max_connections)")


def rate_refusal(first: bytes) -> bytes:
    """The server preface and a GOAWAY (ENHANCE_YOUR_CALM) that turn away a connection over
    its listener's connection rate, whatever it sent first."""
    return _RATE_EXCEEDED
