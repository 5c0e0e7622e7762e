"""The broker-side Pulsar connection state machine, driven by a client made of the same codec."""

from __future__ import annotations

import pytest

from mop.protocols.pulsar.commands import (
    PROTOCOL_VERSION,
    Ack,
    AckType,
    AuthChallenge,
    AuthData,
    AuthResponse,
    CloseConsumer,
    Command,
    Connect,
    Connected,
    Error,
    Flow,
    GetLastMessageIdResponse,
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
    Send,
    SendError,
    SendReceipt,
    Subscribe,
    SubType,
    Success,
)
from mop.protocols.pulsar.connection import (
    NO_REQUEST_ID,
    REFRESH_AUTH_DATA,
    ConnectionLimits,
    ConnectionState,
    ServerConnection,
    lookup_connect,
    lookup_failed,
    lookup_redirect,
    message_id,
    partitioned_metadata,
    partitioned_metadata_failed,
)
from mop.protocols.pulsar.errors import (
    FrameTooLarge,
    LocalProtocolError,
    MalformedFrame,
    ProtocolViolation,
    ServerError,
)
from mop.protocols.pulsar.frames import (
    NEED_DATA,
    ChecksumMismatch,
    Frame,
    FrameDecoder,
    NeedData,
    UnknownCommand,
    encode_command,
    make_payload,
)
from mop.protocols.pulsar.metadata import MessageIdData, MessageMetadata

CONNECT = Connect(client_version="Pulsar-CPP-v4.2.0", protocol_version=20, auth_method_name="none")


def frames(data: bytes) -> list[Frame]:
    """What a client decodes from the broker's bytes."""
    decoder = FrameDecoder()
    decoder.feed(data)
    out = []
    while not isinstance(frame := decoder.next_frame(), NeedData):
        out.append(frame)
    return out


def receive(conn: ServerConnection, *commands: Command | bytes) -> list[object]:
    for command in commands:
        conn.receive_data(command if isinstance(command, bytes) else encode_command(command))
    events: list[object] = []
    while (event := conn.next_event()) is not NEED_DATA:
        events.append(event)
        if conn.state is ConnectionState.CONNECTING:
            break  # the broker answers CONNECT before it reads on
    return events


def state(conn: ServerConnection) -> ConnectionState:
    """The state now (a call, so that type checkers do not keep an earlier narrowing)."""
    return conn.state


def connected(limits: ConnectionLimits | None = None) -> ServerConnection:
    conn = ServerConnection(limits)
    assert receive(conn, CONNECT) == [CONNECT]
    conn.connected()
    return conn


def test_handshake() -> None:
    assert ServerConnection().state is ConnectionState.AWAITING_CONNECT
    conn = ServerConnection(ConnectionLimits(server_version="mop-1.0", max_message_size=1 << 20))
    assert conn.next_event() is NEED_DATA
    assert receive(conn, CONNECT) == [CONNECT]
    assert state(conn) is ConnectionState.CONNECTING
    assert conn.client_version == "Pulsar-CPP-v4.2.0"
    assert frames(conn.connected()) == [
        Connected(server_version="mop-1.0", protocol_version=20, max_message_size=1 << 20)
    ]
    assert state(conn) is ConnectionState.CONNECTED


@pytest.mark.parametrize(
    ("client", "negotiated"), [(20, 20), (21, 20), (99, PROTOCOL_VERSION), (15, 15), (0, 0)]
)
def test_protocol_version_negotiation(client: int, negotiated: int) -> None:
    conn = ServerConnection()
    receive(conn, Connect(client_version="c", protocol_version=client))
    assert conn.protocol_version == negotiated
    [answer] = frames(conn.connected())
    assert isinstance(answer, Connected)
    assert answer.protocol_version == negotiated


def test_requests_and_answers_once_connected() -> None:
    conn = connected()
    lookup = Lookup(topic="persistent://public/default/t", request_id=2)
    meta = PartitionedMetadata(topic="persistent://public/default/t", request_id=1)
    producer = Producer(topic="persistent://public/default/t", producer_id=0, request_id=0)
    assert receive(conn, meta, lookup, producer) == [meta, lookup, producer]
    out = conn.send(partitioned_metadata(1)) + conn.send(lookup_connect(2, "pulsar://h:6650"))
    out += conn.send(ProducerSuccess(request_id=0, producer_name="standalone-0-0"))
    assert frames(out) == [
        PartitionedMetadataResponse(request_id=1, partitions=0, response=MetadataResult.Success),
        LookupResponse(
            request_id=2, response=LookupType.Connect, broker_service_url="pulsar://h:6650"
        ),
        ProducerSuccess(request_id=0, producer_name="standalone-0-0"),
    ]


def test_send_receipt_and_delivery_fast_paths() -> None:
    conn = connected()
    payload = make_payload(MessageMetadata(producer_name="p", sequence_id=5, publish_time=1), b"x")
    [send] = receive(conn, Send(producer_id=0, sequence_id=5, payload=payload))
    assert isinstance(send, Send)
    assert send.payload == payload
    out = conn.send_receipt(0, 5, 1, 7) + conn.deliver(
        3, 1, 7, payload.raw, payload.checksum, redelivery_count=2, ack_set=(1018,)
    )
    assert frames(out) == [
        SendReceipt(
            producer_id=0, sequence_id=5, message_id=MessageIdData(ledger_id=1, entry_id=7)
        ),
        Message(
            consumer_id=3,
            message_id=MessageIdData(ledger_id=1, entry_id=7),
            redelivery_count=2,
            ack_set=(1018,),
            payload=payload,
        ),
    ]


def test_ping_pong_both_ways() -> None:
    conn = connected()
    assert receive(conn, Ping()) == [Ping()]
    assert frames(conn.send(Pong())) == [Pong()]
    assert frames(conn.send(Ping())) == [Ping()]
    assert receive(conn, Pong()) == [Pong()]


def test_frames_received_counts_every_frame() -> None:
    conn = ServerConnection()
    receive(conn, CONNECT)
    conn.connected()
    receive(conn, Ping(), Flow(consumer_id=0, message_permits=10))
    assert conn.frames_received == 3


def test_command_before_connect_is_refused() -> None:
    conn = ServerConnection()
    with pytest.raises(ProtocolViolation, match="before CONNECT") as info:
        receive(conn, Lookup(topic="t", request_id=1))
    assert info.value.server_error is ServerError.NotAllowedError
    assert conn.state is ConnectionState.CLOSED
    [error] = frames(conn.protocol_error(info.value))
    assert error == Error(
        request_id=NO_REQUEST_ID, error=ServerError.NotAllowedError, message=info.value.message
    )
    assert conn.next_event() is NEED_DATA  # a closed connection reads nothing more


def test_second_connect_is_refused() -> None:
    conn = connected()
    with pytest.raises(ProtocolViolation, match="Connect"):
        receive(conn, CONNECT)
    assert conn.state is ConnectionState.CLOSED


def test_broker_only_commands_from_a_client_are_refused() -> None:
    conn = connected()
    with pytest.raises(ProtocolViolation, match="Success"):
        receive(conn, Success(request_id=1))


def test_reading_on_before_answering_connect_is_our_mistake() -> None:
    conn = ServerConnection()
    receive(conn, CONNECT)
    with pytest.raises(LocalProtocolError, match="answer CONNECT"):
        conn.next_event()


def test_connected_comes_first() -> None:
    conn = ServerConnection()
    with pytest.raises(LocalProtocolError, match="Connected"):
        conn.connected()  # no CONNECT yet
    receive(conn, CONNECT)
    with pytest.raises(LocalProtocolError, match="Success"):
        conn.send(Success(request_id=0))
    with pytest.raises(LocalProtocolError, match="SEND_RECEIPT"):
        conn.send_receipt(0, 0, 0, 0)
    with pytest.raises(LocalProtocolError, match="MESSAGE"):
        conn.deliver(0, 0, 0, b"\x00\x00\x00\x00", None)
    conn.connected()
    with pytest.raises(LocalProtocolError, match="Connected"):
        conn.connected()


def test_client_only_commands_cannot_be_sent() -> None:
    conn = connected()
    with pytest.raises(LocalProtocolError, match="Subscribe"):
        conn.send(
            Subscribe(
                topic="t", subscription="s", sub_type=SubType.Shared, consumer_id=0, request_id=0
            )
        )


def test_refused_handshake() -> None:
    conn = ServerConnection()
    receive(conn, CONNECT)
    out = conn.send(
        Error(request_id=NO_REQUEST_ID, error=ServerError.AuthenticationError, message="bad token")
    )
    assert isinstance(frames(out)[0], Error)
    assert conn.state is ConnectionState.CLOSED


def test_request_errors_keep_the_connection() -> None:
    conn = connected()
    conn.send(Error(request_id=4, error=ServerError.ConsumerBusy, message="exclusive"))
    conn.send(
        SendError(producer_id=0, sequence_id=1, error=ServerError.ChecksumError, message="crc")
    )
    assert conn.state is ConnectionState.CONNECTED


def test_frame_limit_before_and_after_connect() -> None:
    limits = ConnectionLimits(max_message_size=1000, max_connect_frame_size=100)
    conn = ServerConnection(limits)
    conn.receive_data((200).to_bytes(4, "big"))
    with pytest.raises(FrameTooLarge):
        conn.next_event()
    assert conn.state is ConnectionState.CLOSED

    conn = connected(limits)
    meta = MessageMetadata(producer_name="p", sequence_id=0, publish_time=0)
    big = make_payload(meta, b"x" * 5000)
    [event] = receive(conn, Send(producer_id=0, sequence_id=0, payload=big))
    assert isinstance(event, Send)  # above the message size but within the 10 KiB frame slack
    conn.receive_data((limits.max_frame_size - 3).to_bytes(4, "big"))
    with pytest.raises(FrameTooLarge):
        conn.next_event()


def test_garbage_closes_only_with_a_protocol_error() -> None:
    conn = connected()
    with pytest.raises(MalformedFrame):
        receive(conn, bytes.fromhex("0000000600000002ffff"))
    assert conn.state is ConnectionState.CLOSED
    [error] = frames(conn.protocol_error(MalformedFrame("garbage")))
    assert isinstance(error, Error)
    assert error.error is ServerError.UnknownError


def test_checksum_mismatch_and_unknown_commands_are_events() -> None:
    conn = connected()
    payload = make_payload(MessageMetadata(producer_name="p", sequence_id=0, publish_time=0), b"a")
    corrupt = bytearray(encode_command(Send(producer_id=1, sequence_id=2, payload=payload)))
    corrupt[-1] ^= 0xFF
    unknown = bytes.fromhex("00000009000000050832920300")  # type 50, empty body
    [mismatch, other, ack] = receive(
        conn, bytes(corrupt), unknown, Ack(consumer_id=0, ack_type=AckType.Individual)
    )
    assert isinstance(mismatch, ChecksumMismatch)
    assert mismatch.command == Send(producer_id=1, sequence_id=2)
    assert other == UnknownCommand(50)
    assert isinstance(ack, Ack)
    assert conn.state is ConnectionState.CONNECTED


def test_answer_builders() -> None:
    assert lookup_redirect(3, "pulsar://owner:6650") == LookupResponse(
        request_id=3,
        response=LookupType.Redirect,
        broker_service_url="pulsar://owner:6650",
        authoritative=True,
    )
    assert lookup_failed(3, ServerError.TopicNotFound, "no such namespace") == LookupResponse(
        request_id=3,
        response=LookupType.Failed,
        error=ServerError.TopicNotFound,
        message="no such namespace",
    )
    assert partitioned_metadata_failed(1, ServerError.TopicNotFound, "x").response is (
        MetadataResult.Failed
    )
    # An empty topic's last id has entry -1, which goes on the wire as 2^64 - 1.
    empty = message_id(1, -1)
    assert empty.entry_id == (1 << 64) - 1
    conn = connected()
    [answer] = frames(conn.send(GetLastMessageIdResponse(request_id=9, last_message_id=empty)))
    assert answer == GetLastMessageIdResponse(request_id=9, last_message_id=empty)
    [close] = frames(conn.send(CloseConsumer(consumer_id=1, request_id=0)))
    assert close == CloseConsumer(consumer_id=1, request_id=0)


def test_auth_challenge_takes_one_auth_response() -> None:
    conn = connected()
    [challenge] = frames(conn.auth_challenge("token"))
    assert challenge == AuthChallenge(
        server_version="mop",
        challenge=AuthData(auth_method_name="token", auth_data=REFRESH_AUTH_DATA),
        protocol_version=20,
    )
    assert state(conn) is ConnectionState.CHALLENGED
    # Requests go on while the answer is awaited, both ways.
    flow = Flow(consumer_id=0, message_permits=1)
    assert receive(conn, flow) == [flow]
    conn.send(Success(request_id=1))
    conn.send_receipt(0, 1, 2, 3)
    with pytest.raises(LocalProtocolError, match="AuthChallenge"):
        conn.auth_challenge("token")  # one at a time
    response = AuthResponse(response=AuthData(auth_method_name="token", auth_data=b"t"))
    assert receive(conn, response) == [response]
    assert state(conn) is ConnectionState.CONNECTED
    conn.auth_challenge("token")  # the next refresh
    assert state(conn) is ConnectionState.CHALLENGED


def test_auth_response_without_a_challenge_is_refused() -> None:
    conn = connected()
    with pytest.raises(ProtocolViolation, match="AuthResponse is not allowed without") as info:
        receive(conn, AuthResponse())
    assert info.value.server_error is ServerError.NotAllowedError
    assert conn.state is ConnectionState.CLOSED
    conn = connected()
    conn.auth_challenge("token")
    receive(conn, AuthResponse())
    with pytest.raises(ProtocolViolation):
        receive(conn, AuthResponse())  # a second answer to one challenge


def test_auth_challenge_needs_a_connection() -> None:
    conn = ServerConnection()
    with pytest.raises(LocalProtocolError, match="AuthChallenge"):
        conn.auth_challenge("token")
    receive(conn, CONNECT)
    with pytest.raises(LocalProtocolError, match="AuthChallenge"):
        conn.auth_challenge("token")  # CONNECTED first
    with pytest.raises(ProtocolViolation, match="before CONNECT"):
        receive(ServerConnection(), AuthResponse())


def test_auth_refused_at_connect_closes_and_later_is_an_answer() -> None:
    conn = ServerConnection()
    receive(conn, CONNECT)
    [error] = frames(conn.auth_refused("Unable to authenticate"))
    assert error == Error(
        request_id=NO_REQUEST_ID,
        error=ServerError.AuthenticationError,
        message="Unable to authenticate",
    )
    assert conn.state is ConnectionState.CLOSED
    # Once connected the caller closes the connection after the ERROR; until it is out,
    # receipts may still be written.
    conn = connected()
    conn.auth_challenge("token")
    assert isinstance(frames(conn.auth_refused("no"))[0], Error)
    assert state(conn) is ConnectionState.CHALLENGED
    conn.send_receipt(0, 1, 2, 3)


def test_lookup_connect_with_a_tls_url() -> None:
    assert lookup_connect(
        7, "pulsar://h:6650", broker_url_tls="pulsar+ssl://h:6651"
    ) == LookupResponse(
        request_id=7,
        response=LookupType.Connect,
        broker_service_url="pulsar://h:6650",
        broker_service_url_tls="pulsar+ssl://h:6651",
    )
