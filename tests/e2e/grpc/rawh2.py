"""A blocking HTTP/2 client on the `h2` library, for tests that need control of every byte a
gRPC call sends: malformed messages, missing or bad headers, resets mid-call, raw garbage.

    with RawH2(port) as conn:
        stream = conn.call(SEND, body=frame(Send(payload=b"x").SerializeToString()))
        assert conn.outcome(stream).status == 0

It does not answer for the peer's mistakes: what the node sends back is collected per stream
(`Outcome`) and per connection (`goaway`, `closed`), for the test to judge.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass, field
from types import TracebackType

import h2.config
import h2.connection
import h2.events
import h2.exceptions

TIMEOUT = 10.0


def frame(message: bytes, *, compressed: bool = False) -> bytes:
    """One gRPC length-prefixed message: the compressed flag, a 4-byte length, the bytes."""
    return struct.pack(">BI", 1 if compressed else 0, len(message)) + message


def grpc_headers(path: str, *extra: tuple[str, str]) -> list[tuple[str, str]]:
    """The request headers a gRPC client sends for `path`, then `extra` (metadata)."""
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "127.0.0.1"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        *extra,
    ]


@dataclass
class Outcome:
    """What came back on one stream."""

    headers: dict[str, str] = field(default_factory=dict)
    trailers: dict[str, str] = field(default_factory=dict)
    data: bytearray = field(default_factory=bytearray)
    reset: int | None = None  # the error code of a RST_STREAM from the node
    ended: bool = False

    @property
    def http_status(self) -> int | None:
        status = self.headers.get(":status")
        return None if status is None else int(status)

    @property
    def status(self) -> int | None:
        """The gRPC status, from the trailers (or the headers of a trailers-only answer)."""
        value = self.trailers.get("grpc-status", self.headers.get("grpc-status"))
        return None if value is None else int(value)

    @property
    def message(self) -> str:
        return self.trailers.get("grpc-message", self.headers.get("grpc-message", ""))

    def messages(self) -> list[bytes]:
        """The response messages (length-prefixed, uncompressed) in `data`."""
        found, view = [], memoryview(self.data)
        while len(view) >= 5:
            flag, length = struct.unpack(">BI", view[:5])
            assert flag == 0, "the node compressed a message unasked"
            found.append(bytes(view[5 : 5 + length]))
            view = view[5 + length :]
        assert not view, f"{len(view)} stray bytes after the last message"
        return found


class RawH2:
    """One HTTP/2 connection to the node, driven by hand."""

    def __init__(self, port: int, *, preface: bool = True) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        self.h2 = h2.connection.H2Connection(config=config)
        self.outcomes: dict[int, Outcome] = {}
        self.goaway: h2.events.ConnectionTerminated | None = None
        self.closed = False
        if preface:
            self.h2.initiate_connection()
            self.flush()

    def __enter__(self) -> RawH2:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def flush(self) -> None:
        data = self.h2.data_to_send()
        if data:
            self.sock.sendall(data)

    def send_raw(self, data: bytes) -> None:
        """Bytes straight onto the socket, past the HTTP/2 state machine."""
        self.sock.sendall(data)

    def call(
        self,
        path: str,
        *metadata: tuple[str, str],
        body: bytes = b"",
        end: bool = True,
        headers: list[tuple[str, str]] | None = None,
    ) -> int:
        """Open a stream with gRPC's headers for `path` (or exactly `headers`), send `body`
        and half-close unless `end` is False; the stream's id."""
        stream = self.h2.get_next_available_stream_id()
        self.h2.send_headers(stream, headers or grpc_headers(path, *metadata))
        self.outcomes[stream] = Outcome()
        if body or end:
            self.send_data(stream, body, end=end)
        self.flush()
        return stream

    def send_data(self, stream: int, body: bytes, *, end: bool = False) -> None:
        """`body` on `stream`, in frames and windows as the node allows (waits for window)."""
        view = memoryview(body)
        while True:
            window = min(self.h2.local_flow_control_window(stream), self.h2.max_outbound_frame_size)
            chunk = view[:window]
            last = len(chunk) == len(view)
            if chunk or last:
                self.h2.send_data(stream, bytes(chunk), end_stream=end and last)
                self.flush()
            view = view[len(chunk) :]
            if last:
                return
            self.receive_some()

    def reset(self, stream: int, code: int = 8) -> None:
        """RST_STREAM (CANCEL by default)."""
        self.h2.reset_stream(stream, error_code=code)
        self.flush()

    def receive_some(self, timeout: float = TIMEOUT) -> None:
        """Read what the node sends next (at least one chunk) and handle its events."""
        if self.closed:
            raise AssertionError("the node closed the connection")
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            raise AssertionError("the node sent nothing in time") from None
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.closed = True
            return
        for event in self.h2.receive_data(data):
            self._handle(event)
        self.flush()

    def _handle(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ResponseReceived):
            self.outcomes[event.stream_id].headers.update(_text(event.headers))
        elif isinstance(event, h2.events.TrailersReceived):
            self.outcomes[event.stream_id].trailers.update(_text(event.headers))
        elif isinstance(event, h2.events.DataReceived):
            self.outcomes[event.stream_id].data += event.data
            self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            self.outcomes[event.stream_id].ended = True
        elif isinstance(event, h2.events.StreamReset):
            outcome = self.outcomes.setdefault(event.stream_id, Outcome())
            outcome.reset = int(event.error_code)
            outcome.ended = True
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.goaway = event

    def outcome(self, stream: int, timeout: float = TIMEOUT) -> Outcome:
        """The stream's outcome once it has ended (trailers or a reset)."""
        deadline = time.monotonic() + timeout
        while not self.outcomes[stream].ended:
            if self.closed or self.goaway is not None:
                raise AssertionError(f"connection ended before stream {stream}: {self.goaway}")
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"stream {stream} did not end in time"
            self.receive_some(remaining)
        return self.outcomes[stream]

    def until_closed(self, timeout: float = TIMEOUT) -> None:
        """Read until the node closes the connection (it must, in time)."""
        deadline = time.monotonic() + timeout
        while not self.closed:
            remaining = deadline - time.monotonic()
            assert remaining > 0, "the node kept the connection open"
            try:
                self.receive_some(remaining)
            except h2.exceptions.ProtocolError:
                # Our state machine may refuse what follows a GOAWAY; the bytes still count.
                self.sock.settimeout(remaining)
                try:
                    while self.sock.recv(65536):
                        pass
                except OSError:
                    pass
                self.closed = True


def _text(headers: list[tuple[str | bytes, str | bytes]]) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in headers
    }
