"""What a gRPC method handler sees of its call, whatever carries it.

The server (HTTP/2 framing, flow control, trailers) gives each call to the handler registered
for its path as a `Call`; the handler reads request messages, sends response messages and
returns (status OK) or raises `GrpcError` (that status). Messages are the serialized protobuf
bytes: each handler decodes and encodes its own types.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol


class Call(Protocol):
    # The method's path, e.g. "/mop.grpc.v1.PulsarGrpcService/produce".
    @property
    def method(self) -> str: ...

    # The call's custom metadata in the order sent: keys lower case; values of "-bin" keys
    # base64-decoded (then latin-1 text), the others as sent. Pseudo-headers and the headers
    # gRPC itself uses (content-type, te, grpc-timeout, grpc-encoding...) are not included.
    @property
    def metadata(self) -> tuple[tuple[str, str], ...]: ...

    # The client's address, "host:port".
    @property
    def peer(self) -> str: ...

    # The client's TLS certificate (DER), when it presented one on an mTLS listener.
    @property
    def peer_certificate(self) -> bytes | None: ...

    async def receive(self) -> bytes | None:
        """The next request message; None once the client has half-closed its side. The
        message's bytes are given back to the client's flow-control window only when they are
        asked for, so a handler that stops receiving back-pressures the client."""
        ...

    async def send(self, message: bytes) -> None:
        """Send one response message (the response headers go first, once); waits while the
        client's HTTP/2 window is closed. When the client goes away (it resets the stream or
        the connection closes) the server cancels the handler."""
        ...


# A method handler: serves one call until it returns (status OK) or raises GrpcError.
MethodHandler = Callable[[Call], Awaitable[None]]
