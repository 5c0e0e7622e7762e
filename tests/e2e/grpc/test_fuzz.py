"""Hostile HTTP/2 against the gRPC port, with a raw `h2` client: malformed gRPC messages, bad
and missing metadata, huge headers, the wrong content type, resets mid-call, garbage instead of
the HTTP/2 preface and random frames. A stream-level mistake ends that stream with a status
and leaves the connection's other calls alone; a connection-level one ends that connection
(GOAWAY or a close); either way the node goes on serving everyone else.

Merged mode only: the HTTP/2 and gRPC layers are the same code in front of either backend.
The Hypothesis tests are bounded (examples and time) and use no example database.
"""

from __future__ import annotations

import contextlib
import struct
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mop.protocols.grpc.proto.mop_grpc_pb2 import Send, SendResult
from mop.protocols.grpc.status import StatusCode
from mop.testing.node import RunningNode, node_settings, running_node
from tests.e2e.grpc.interop import CONSUME, PRODUCE, SEND, GrpcClient, grpc_port, with_grpc
from tests.e2e.grpc.rawh2 import RawH2, frame, grpc_headers

pytestmark = pytest.mark.e2e

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# Everything a bad request may be answered with: never OK, never UNKNOWN (a crash).
REFUSALS = {
    StatusCode.INVALID_ARGUMENT,
    StatusCode.INTERNAL,
    StatusCode.RESOURCE_EXHAUSTED,
    StatusCode.UNIMPLEMENTED,
    StatusCode.NOT_FOUND,
}
FUZZ = settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def node() -> Iterator[RunningNode]:
    with running_node(with_grpc(node_settings())) as running:
        yield running


@pytest.fixture
def port(node: RunningNode) -> Iterator[int]:
    """The node's gRPC port; after the test, the node must still serve a new client."""
    port = grpc_port(node)
    yield port
    assert_serving(port)


@pytest.fixture
def topic() -> str:
    return f"fuzz-{uuid.uuid4().hex[:12]}"


def assert_serving(port: int) -> None:
    with GrpcClient(port) as client:
        result = client.send(f"fuzz-alive-{uuid.uuid4().hex[:8]}", Send(payload=b"alive"))
    assert result.WhichOneof("result") == "message_id", result


class Keeper:
    """A produce call kept open on a connection while a test misbehaves on other streams of it:
    it must still store a message afterwards and end with OK."""

    def __init__(self, conn: RawH2, topic: str) -> None:
        self.conn = conn
        self.stream = conn.call(PRODUCE, ("pulsar-topic", topic), end=False)
        self.sent = 0
        self.check()

    def check(self) -> None:
        """Send one more message and wait for its SendResult."""
        self.sent += 1
        message = Send(payload=b"keeper", sequence_id=self.sent).SerializeToString()
        self.conn.send_data(self.stream, frame(message))
        outcome = self.conn.outcomes[self.stream]
        while complete_messages(outcome.data) < self.sent:
            assert not outcome.ended, outcome
            self.conn.receive_some()

    def finish(self) -> None:
        self.check()
        self.conn.send_data(self.stream, b"", end=True)
        outcome = self.conn.outcome(self.stream)
        assert outcome.status == StatusCode.OK, outcome
        results = [SendResult.FromString(m) for m in outcome.messages()]
        assert [r.sequence_id for r in results] == list(range(1, self.sent + 1))
        assert all(r.WhichOneof("result") == "message_id" for r in results), results


def complete_messages(data: bytes | bytearray) -> int:
    """How many whole length-prefixed messages `data` starts with."""
    count, offset = 0, 0
    while offset + 5 <= len(data):
        (length,) = struct.unpack(">I", data[offset + 1 : offset + 5])
        if offset + 5 + length > len(data):
            break
        offset += 5 + length
        count += 1
    return count


def refused(conn: RawH2, stream: int, *codes: StatusCode) -> str:
    outcome = conn.outcome(stream)
    assert outcome.status in codes, outcome
    return outcome.message


# ---- malformed gRPC messages (stream level) ------------------------------------------------


def test_a_length_prefix_longer_than_the_data_is_an_error_of_that_stream(
    port: int, topic: str
) -> None:
    with RawH2(port) as conn:
        keeper = Keeper(conn, topic)
        body = struct.pack(">BI", 0, 100) + b"only ten b"
        stream = conn.call(SEND, ("pulsar-topic", topic), body=body)
        refused(conn, stream, StatusCode.INTERNAL, StatusCode.INVALID_ARGUMENT)
        keeper.finish()


def test_a_truncated_prefix_is_an_error_of_that_stream(port: int, topic: str) -> None:
    with RawH2(port) as conn:
        keeper = Keeper(conn, topic)
        stream = conn.call(SEND, ("pulsar-topic", topic), body=b"\x00\x00\x00")
        refused(conn, stream, StatusCode.INTERNAL, StatusCode.INVALID_ARGUMENT)
        keeper.finish()


def test_a_compressed_message_without_an_encoding_is_internal(port: int, topic: str) -> None:
    # The gRPC spec: a set compressed flag without grpc-encoding fails the call with INTERNAL.
    with RawH2(port) as conn:
        keeper = Keeper(conn, topic)
        message = Send(payload=b"x").SerializeToString()
        stream = conn.call(SEND, ("pulsar-topic", topic), body=frame(message, compressed=True))
        refused(conn, stream, StatusCode.INTERNAL)
        keeper.finish()


def test_an_unknown_encoding_is_unimplemented(port: int, topic: str) -> None:
    with RawH2(port) as conn:
        message = Send(payload=b"x").SerializeToString()
        headers = grpc_headers(SEND, ("pulsar-topic", topic), ("grpc-encoding", "snappy-ish"))
        stream = conn.call(SEND, headers=headers, body=frame(message, compressed=True))
        refused(conn, stream, StatusCode.UNIMPLEMENTED)


def test_a_message_over_the_size_limit_is_resource_exhausted(port: int, topic: str) -> None:
    # Only the prefix announces 64 MiB: the node must refuse on the prefix, not buffer it.
    with RawH2(port) as conn:
        keeper = Keeper(conn, topic)
        body = struct.pack(">BI", 0, 64 << 20) + b"\x0a" * 1000
        stream = conn.call(SEND, ("pulsar-topic", topic), body=body, end=False)
        refused(conn, stream, StatusCode.RESOURCE_EXHAUSTED)
        keeper.finish()


def test_bytes_that_are_no_send_message_are_refused(port: int, topic: str) -> None:
    with RawH2(port) as conn:
        keeper = Keeper(conn, topic)
        # Field 1 (payload) as a length-delimited value claiming 200 bytes it does not have.
        stream = conn.call(SEND, ("pulsar-topic", topic), body=frame(b"\x0a\xc8\x01abc"))
        refused(conn, stream, StatusCode.INVALID_ARGUMENT, StatusCode.INTERNAL)
        keeper.finish()


def test_two_messages_on_a_unary_call_are_refused(port: int, topic: str) -> None:
    with RawH2(port) as conn:
        message = frame(Send(payload=b"x").SerializeToString())
        stream = conn.call(SEND, ("pulsar-topic", topic), body=message + message)
        refused(conn, stream, StatusCode.INVALID_ARGUMENT, StatusCode.INTERNAL)


# ---- headers and metadata (stream level) ---------------------------------------------------


def test_a_missing_topic_is_invalid_argument(port: int, topic: str) -> None:
    with RawH2(port) as conn:
        keeper = Keeper(conn, topic)
        stream = conn.call(SEND, body=frame(Send(payload=b"x").SerializeToString()))
        assert "pulsar-topic" in refused(conn, stream, StatusCode.INVALID_ARGUMENT)
        keeper.finish()


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("pulsar-subscription-type", "sideways"),
        ("pulsar-initial-position", "yesterday"),
        ("pulsar-receiver-queue-size", "-5"),
        ("pulsar-receiver-queue-size", "lots"),
    ],
)
def test_bad_consumer_metadata_names_the_key(port: int, topic: str, key: str, value: str) -> None:
    with RawH2(port) as conn:
        metadata = [("pulsar-topic", topic), ("pulsar-subscription", "s"), (key, value)]
        stream = conn.call(CONSUME, *metadata, end=False)
        assert key in refused(conn, stream, StatusCode.INVALID_ARGUMENT)


def test_a_bad_producer_access_mode_names_the_key(port: int, topic: str) -> None:
    with RawH2(port) as conn:
        metadata = [("pulsar-topic", topic), ("pulsar-producer-access-mode", "rude")]
        stream = conn.call(PRODUCE, *metadata, end=False)
        refused(conn, stream, StatusCode.INVALID_ARGUMENT)


def test_an_invalid_topic_name_is_invalid_argument(port: int) -> None:
    with RawH2(port) as conn:
        stream = conn.call(
            SEND,
            ("pulsar-topic", "persistent://only-a-tenant"),
            body=frame(Send(payload=b"x").SerializeToString()),
        )
        refused(conn, stream, StatusCode.INVALID_ARGUMENT)


def test_an_unknown_method_is_unimplemented(port: int, topic: str) -> None:
    with RawH2(port) as conn:
        keeper = Keeper(conn, topic)
        stream = conn.call("/mop.grpc.v1.PulsarGrpcService/explode", ("pulsar-topic", topic))
        refused(conn, stream, StatusCode.UNIMPLEMENTED)
        keeper.finish()


def test_a_wrong_content_type_is_http_415(port: int, topic: str) -> None:
    with RawH2(port) as conn:
        keeper = Keeper(conn, topic)
        headers = [
            (name, "text/plain" if name == "content-type" else value)
            for name, value in grpc_headers(SEND, ("pulsar-topic", topic))
        ]
        stream = conn.call(SEND, headers=headers, body=b"hello")
        outcome = conn.outcome(stream)
        assert outcome.http_status == 415, outcome
        keeper.finish()


def test_a_get_is_refused_and_the_connection_goes_on(port: int, topic: str) -> None:
    with RawH2(port) as conn:
        keeper = Keeper(conn, topic)
        headers = [
            (name, "GET" if name == ":method" else value)
            for name, value in grpc_headers(SEND, ("pulsar-topic", topic))
        ]
        stream = conn.call(SEND, headers=headers)
        outcome = conn.outcome(stream)
        assert outcome.http_status == 405, outcome
        keeper.finish()


def test_huge_headers_end_at_most_their_connection(port: int, topic: str) -> None:
    """A 1 MiB header list is more than any node must take: refused on its stream (431, a
    status, a reset) or, as HPACK state may be lost, with a GOAWAY for the connection."""
    with RawH2(port) as conn:
        metadata = [(f"x-big-{n}", "v" * 8000) for n in range(128)]
        stream = conn.call(SEND, ("pulsar-topic", topic), *metadata)
        try:
            outcome = conn.outcome(stream)
        except AssertionError:
            assert conn.goaway is not None or conn.closed
        else:
            assert outcome.reset is not None or outcome.http_status != 200 or outcome.status


# ---- resets and connection-level garbage ---------------------------------------------------


def test_a_reset_mid_call_leaves_the_connection_and_its_other_calls(port: int, topic: str) -> None:
    with RawH2(port) as conn:
        keeper = Keeper(conn, topic)
        half = frame(Send(payload=b"y" * 1000).SerializeToString())[:600]
        produce = conn.call(PRODUCE, ("pulsar-topic", topic), body=half, end=False)
        consume = conn.call(
            CONSUME,
            ("pulsar-topic", topic),
            ("pulsar-subscription", "reset-me"),
            end=False,
        )
        conn.reset(produce)
        conn.reset(consume)
        keeper.check()
        again = conn.call(
            SEND, ("pulsar-topic", topic), body=frame(Send(payload=b"z").SerializeToString())
        )
        assert conn.outcome(again).status == StatusCode.OK
        keeper.finish()


def test_garbage_instead_of_the_preface_ends_only_that_connection(port: int, topic: str) -> None:
    with RawH2(port) as bystander:
        keeper = Keeper(bystander, topic)
        with RawH2(port, preface=False) as conn:
            conn.send_raw(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\xff" * 100)
            conn.until_closed()
        keeper.finish()


def test_a_frame_on_stream_zero_that_needs_a_stream_is_a_goaway(port: int) -> None:
    with RawH2(port) as conn:
        conn.receive_some()  # the node's SETTINGS
        # A DATA frame (type 0) on stream 0 is a connection error (PROTOCOL_ERROR).
        conn.send_raw(struct.pack(">I", 5)[1:] + b"\x00\x00" + struct.pack(">I", 0) + b"hello")
        conn.until_closed()
        assert conn.goaway is not None and conn.goaway.error_code != 0, conn.goaway


@FUZZ
@given(garbage=st.binary(min_size=1, max_size=64))
def test_random_bytes_instead_of_the_preface(node: RunningNode, garbage: bytes) -> None:
    if PREFACE.startswith(garbage):
        garbage += b"\x00"  # a prefix of the preface would only wait for the rest
    with RawH2(grpc_port(node), preface=False) as conn:
        conn.send_raw(garbage + b"\xee" * (len(PREFACE) - len(garbage) % len(PREFACE)))
        conn.until_closed()


@FUZZ
@given(frames=st.binary(min_size=9, max_size=200))
def test_random_frames_after_the_preface(node: RunningNode, frames: bytes) -> None:
    """Whatever follows a valid preface, the node answers, resets or closes; it never hangs
    in a way that keeps another connection from being served."""
    port = grpc_port(node)
    with RawH2(port) as conn:
        conn.send_raw(frames)
        # Nothing to say is an answer too (e.g. to an unknown frame type, which HTTP/2 ignores).
        with contextlib.suppress(AssertionError):
            conn.receive_some(timeout=0.5)
    assert_serving(port)


def test_random_message_bytes_on_one_connection(port: int, topic: str) -> None:
    """Any body on a send call ends that call with a status (OK when the bytes happen to be a
    valid Send), and the connection keeps serving its other call."""
    with RawH2(port) as conn:
        keeper = Keeper(conn, topic)

        @FUZZ
        @given(body=st.binary(max_size=300), framed=st.booleans())
        def one(body: bytes, framed: bool) -> None:
            stream = conn.call(SEND, ("pulsar-topic", topic), body=frame(body) if framed else body)
            outcome = conn.outcome(stream)
            assert outcome.status in REFUSALS | {StatusCode.OK}, outcome

        one()
        keeper.finish()


# Header names h2 itself refuses to send (connection-specific ones) are left out.
CONNECTION_HEADERS = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
    "host",
}
METADATA_KEY = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=20
).filter(lambda key: key not in CONNECTION_HEADERS)
METADATA_VALUE = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40
)


def test_random_metadata_on_one_connection(port: int, topic: str) -> None:
    with RawH2(port) as conn:
        keeper = Keeper(conn, topic)

        @FUZZ
        @given(
            extra=st.lists(
                st.tuples(
                    st.sampled_from(
                        [
                            "pulsar-topic",
                            "pulsar-producer-name",
                            "pulsar-producer-access-mode",
                            "authorization",
                            "grpc-timeout",
                            "grpc-encoding",
                        ]
                    )
                    | METADATA_KEY,
                    METADATA_VALUE,
                ),
                max_size=6,
            )
        )
        def one(extra: list[tuple[str, str]]) -> None:
            headers = grpc_headers(SEND, ("pulsar-topic", topic), *extra)
            stream = conn.call(
                SEND, headers=headers, body=frame(Send(payload=b"m").SerializeToString())
            )
            outcome = conn.outcome(stream)
            allowed = REFUSALS | {
                StatusCode.OK,
                StatusCode.DEADLINE_EXCEEDED,
                StatusCode.UNAUTHENTICATED,
            }
            assert outcome.status in allowed or outcome.http_status in {400, 415}, outcome

        one()
        keeper.finish()
