"""WebSocketStream and accept_websocket: first over in-memory streams, then through listeners."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio
import trio.testing
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    Pong,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)

from mop.testing import TestCertificates
from mop.transport import (
    ListenerSpec,
    WebSocketHandshakeError,
    WebSocketStream,
    accept_websocket,
    server_ssl_context,
)

from .servers import Recorder, running


class Client:
    """A WebSocket client built on wsproto, as MQTT-over-WebSocket clients behave."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.pending: deque[Event] = deque()

    async def upgrade(
        self, *, path: str = "/mqtt", subprotocols: Sequence[str] = ("mqtt",)
    ) -> AcceptConnection | RejectConnection:
        request = Request(host="localhost", target=path, subprotocols=list(subprotocols))
        await self.send(request)
        answer = await self.next_event()
        assert isinstance(answer, AcceptConnection | RejectConnection)
        return answer

    async def send(self, event: Event) -> None:
        await self.stream.send_all(self.ws.send(event))

    async def next_event(self) -> Event:
        while not self.pending:
            data = await self.stream.receive_some(65536)
            self.ws.receive_data(bytes(data) if data else None)
            self.pending.extend(self.ws.events())
        return self.pending.popleft()

    async def receive_bytes(self, count: int) -> bytes:
        received = bytearray()
        while len(received) < count:
            event = await self.next_event()
            assert isinstance(event, BytesMessage), event
            received += event.data
        return bytes(received)

    async def rejection_body(self) -> bytes:
        body = bytearray()
        while True:
            event = await self.next_event()
            assert isinstance(event, RejectData)
            body += event.data
            if event.body_finished:
                return bytes(body)


@asynccontextmanager
async def websocket_pair(
    *, path: str | None = "/mqtt", subprotocols: Sequence[str] = ("mqtt", "mqttv3.1")
) -> AsyncIterator[tuple[Client, WebSocketStream]]:
    """A client and the server's WebSocketStream, over a memory stream (no sockets)."""
    client_side, server_side = trio.testing.memory_stream_pair()
    client = Client(client_side)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.upgrade)
        server = await accept_websocket(server_side, path=path, subprotocols=subprotocols)
    yield client, server


async def refusal(
    *, path: str, offered: Sequence[str], server_path: str = "/mqtt"
) -> tuple[RejectConnection, bytes, WebSocketHandshakeError]:
    client_side, server_side = trio.testing.memory_stream_pair()
    client = Client(client_side)
    # Memory streams buffer without limit, so the request can go out before the server runs.
    await client.send(Request(host="h", target=path, subprotocols=[*offered]))
    with pytest.raises(WebSocketHandshakeError) as refused:
        await accept_websocket(server_side, path=server_path, subprotocols=("mqtt",))
    answer = await client.next_event()
    assert isinstance(answer, RejectConnection)
    return answer, await client.rejection_body(), refused.value


# --- handshake ---------------------------------------------------------------------------------


async def test_server_prefers_its_own_subprotocol_order() -> None:
    client_side, server_side = trio.testing.memory_stream_pair()
    client = Client(client_side)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            partial(client.upgrade, path="/mqtt?id=1", subprotocols=["mqttv3.1", "mqtt"])
        )
        server = await accept_websocket(
            server_side, path="/mqtt", subprotocols=("mqtt", "mqttv3.1")
        )
    assert server.subprotocol == "mqtt"
    assert server.path == "/mqtt"


@pytest.mark.parametrize(
    ("offered", "server_offers", "chosen"),
    [((), ("mqtt",), None), (("mqttv3.1",), ("mqtt", "mqttv3.1"), "mqttv3.1"), (("x",), (), None)],
)
async def test_lenient_subprotocol_choice(
    offered: tuple[str, ...], server_offers: tuple[str, ...], chosen: str | None
) -> None:
    client_side, server_side = trio.testing.memory_stream_pair()
    client = Client(client_side)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(client.upgrade, path="/", subprotocols=offered))
        server = await accept_websocket(server_side, subprotocols=server_offers)
    assert server.subprotocol == chosen


async def test_wrong_path_gets_404() -> None:
    answer, body, error = await refusal(path="/other", offered=["mqtt"])
    assert answer.status_code == 404
    assert b"/other" in body
    assert error.status == 404


async def test_unsupported_subprotocol_gets_400() -> None:
    answer, body, error = await refusal(path="/mqtt", offered=["stomp"])
    assert answer.status_code == 400
    assert b"mqtt" in body
    assert error.status == 400


async def test_plain_http_request_gets_400() -> None:
    client_side, server_side = trio.testing.memory_stream_pair()
    await client_side.send_all(b"GET /mqtt HTTP/1.1\r\nHost: h\r\n\r\n")
    with pytest.raises(WebSocketHandshakeError, match="Upgrade"):
        await accept_websocket(server_side)
    answer = await client_side.receive_some()
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n")


async def test_undecodable_host_gets_400() -> None:
    client_side, server_side = trio.testing.memory_stream_pair()
    request = Request(host="xn--", target="/mqtt", subprotocols=["mqtt"])
    await client_side.send_all(WSConnection(ConnectionType.CLIENT).send(request))
    with pytest.raises(WebSocketHandshakeError) as refused:
        await accept_websocket(server_side)
    assert refused.value.status == 400


async def test_oversized_request_is_refused() -> None:
    client_side, server_side = trio.testing.memory_stream_pair()
    await client_side.send_all(b"GET /mqtt HTTP/1.1\r\nHost: h\r\nX-Junk: " + b"a" * 100_000)
    with pytest.raises(WebSocketHandshakeError) as refused:
        await accept_websocket(server_side)
    assert refused.value.status == 400
    assert (await client_side.receive_some()).startswith(b"HTTP/1.1 400 ")


async def test_eof_during_handshake() -> None:
    client_side, server_side = trio.testing.memory_stream_pair()
    await client_side.send_all(b"GET /mqtt HTTP/1.1\r\n")
    await client_side.aclose()
    with pytest.raises(WebSocketHandshakeError, match="closed the connection"):
        await accept_websocket(server_side)


# --- the byte stream ---------------------------------------------------------------------------


async def test_payload_split_over_frames_and_messages_reads_as_one_stream() -> None:
    async with websocket_pair() as (client, server):
        payload = bytes(range(256)) * 40
        # One message in three frames, then two more messages.
        await client.send(BytesMessage(data=payload[:10], message_finished=False))
        await client.send(BytesMessage(data=payload[10:3000], message_finished=False))
        await client.send(BytesMessage(data=payload[3000:5000], message_finished=True))
        await client.send(BytesMessage(data=payload[5000:5001]))
        await client.send(BytesMessage(data=payload[5001:]))
        received = bytearray()
        while len(received) < len(payload):
            received += await server.receive_some(777)
        assert received == payload
        await server.send_all(b"reply")
        assert await client.receive_bytes(5) == b"reply"


async def test_receive_some_respects_max_bytes() -> None:
    async with websocket_pair() as (client, server):
        await client.send(BytesMessage(data=b"abcdef"))
        assert await server.receive_some(4) == b"abcd"
        assert await server.receive_some(4) == b"ef"
        with pytest.raises(ValueError, match="max_bytes"):
            await server.receive_some(0)


async def test_ping_is_answered_while_receiving() -> None:
    async with websocket_pair() as (client, server):
        await client.send(Ping(payload=b"are you there"))
        await client.send(BytesMessage(data=b"after the ping"))
        assert await server.receive_some() == b"after the ping"
        answer = await client.next_event()
        assert isinstance(answer, Pong)
        assert answer.payload == b"are you there"


async def test_close_from_peer_is_eof_and_is_answered() -> None:
    async with websocket_pair() as (client, server):
        await client.send(BytesMessage(data=b"last words"))
        await client.send(CloseConnection(code=1000))
        assert await server.receive_some() == b"last words"
        assert await server.receive_some() == b""
        assert await server.receive_some() == b""
        answer = await client.next_event()
        assert isinstance(answer, CloseConnection)
        assert answer.code == 1000
        with pytest.raises(trio.BrokenResourceError):
            await server.send_all(b"too late")
        await server.aclose()


async def test_dropped_connection_is_eof() -> None:
    async with websocket_pair() as (client, server):
        await client.stream.aclose()
        assert await server.receive_some() == b""


async def test_text_frame_closes_with_1003() -> None:
    async with websocket_pair() as (client, server):
        await client.send(TextMessage(data="{}"))
        with pytest.raises(trio.BrokenResourceError, match="text frame"):
            await server.receive_some()
        with pytest.raises(trio.BrokenResourceError):
            await server.receive_some()
        answer = await client.next_event()
        assert isinstance(answer, CloseConnection)
        assert answer.code == 1003


async def test_unmasked_frame_is_a_protocol_error() -> None:
    async with websocket_pair() as (client, server):
        # A binary frame without the mask clients must set.
        await client.stream.send_all(b"\x82\x02hi")
        with pytest.raises(trio.BrokenResourceError, match="protocol error"):
            await server.receive_some()
        answer = await client.next_event()
        assert isinstance(answer, CloseConnection)
        assert answer.code == 1002


async def test_aclose_sends_a_close_frame() -> None:
    async with websocket_pair() as (client, server):
        await server.aclose()
        answer = await client.next_event()
        assert isinstance(answer, CloseConnection)
        assert answer.code == 1000
        with pytest.raises(trio.ClosedResourceError):
            await server.send_all(b"x")
        with pytest.raises(trio.ClosedResourceError):
            await server.receive_some()
        await server.aclose()


async def test_concurrent_receivers_are_refused() -> None:
    async with websocket_pair() as (_client, server), trio.open_nursery() as nursery:
        nursery.start_soon(server.receive_some)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(trio.BusyResourceError):
            await server.receive_some()
        nursery.cancel_scope.cancel()


async def test_buffering_is_bounded_by_the_read_size() -> None:
    client_side, server_side = trio.testing.memory_stream_pair()
    client = Client(client_side)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.upgrade)
        server = await accept_websocket(server_side, receive_size=1000)
    # A single frame far larger than the read size arrives piecemeal.
    big = b"z" * 50_000
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.send, BytesMessage(data=big))
        received = bytearray()
        while len(received) < len(big):
            chunk = await server.receive_some()
            assert len(chunk) <= 1000
            received += chunk
    assert received == big


# --- through listeners -------------------------------------------------------------------------


def ws_spec(*, kind: str = "ws", handshake_timeout: float = 10.0, **extra: object) -> ListenerSpec:
    return ListenerSpec(
        name="mqtt-ws",
        kind=kind,
        host="127.0.0.1",
        port=0,
        ws_path="/mqtt",
        ws_subprotocols=("mqtt", "mqttv3.1"),
        handshake_timeout=handshake_timeout,
        **extra,  # type: ignore[arg-type]
    )


async def test_ws_listener_echo() -> None:
    recorder = Recorder()
    async with (
        running([ws_spec()], recorder) as bound,
        await trio.open_tcp_stream("127.0.0.1", bound[0].port) as tcp,
    ):
        client = Client(tcp)
        answer = await client.upgrade(subprotocols=["mqtt"])
        assert isinstance(answer, AcceptConnection)
        assert answer.subprotocol == "mqtt"
        # An MQTT CONNECT packet cut across three frames of one message.
        await client.send(BytesMessage(data=b"\x10\x0c\x00", message_finished=False))
        await client.send(BytesMessage(data=b"\x04MQTT\x04\x02", message_finished=False))
        await client.send(BytesMessage(data=b"\x00\x3c\x00\x00", message_finished=True))
        expected = b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00"
        assert await client.receive_bytes(len(expected)) == expected
        await client.send(Ping(payload=b"p"))
        assert await client.next_event() == Pong(payload=b"p")
        await client.send(CloseConnection(code=1000))
        closing = await client.next_event()
        assert isinstance(closing, CloseConnection)
    [info] = recorder.infos
    assert info.transport == "ws"
    assert info.ws_subprotocol == "mqtt"


async def test_ws_listener_wrong_path_gets_404() -> None:
    recorder = Recorder()
    async with (
        running([ws_spec()], recorder) as bound,
        await trio.open_tcp_stream("127.0.0.1", bound[0].port) as tcp,
    ):
        answer = await Client(tcp).upgrade(path="/ws")
        assert isinstance(answer, RejectConnection)
        assert answer.status_code == 404
    assert recorder.infos == []


async def test_slow_loris_is_dropped_while_others_are_served(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="mop.transport")
    async with running([ws_spec(handshake_timeout=0.5)], Recorder()) as bound:
        port = bound[0].port
        async with await trio.open_tcp_stream("127.0.0.1", port) as loris:
            started = time.monotonic()
            await loris.send_all(b"GET /mqtt HTTP/1.1\r\nHost: localhost\r\n")
            async with await trio.open_tcp_stream("127.0.0.1", port) as tcp:
                client = Client(tcp)
                assert isinstance(await client.upgrade(), AcceptConnection)
                await client.send(BytesMessage(data=b"served"))
                assert await client.receive_bytes(6) == b"served"
            with trio.fail_after(5):
                assert await loris.receive_some() == b""
            assert time.monotonic() - started >= 0.45
    assert any("handshake not finished" in r.getMessage() for r in caplog.records)


async def test_wss_listener(certificates: TestCertificates) -> None:
    context = server_ssl_context(
        certfile=str(certificates.server_cert),
        keyfile=str(certificates.server_key),
        cafile=str(certificates.ca_cert),
    )
    recorder = Recorder()
    async with running([ws_spec(kind="wss", ssl_context=context)], recorder) as bound:
        tls = await trio.open_ssl_over_tcp_stream(
            "127.0.0.1", bound[0].port, ssl_context=certificates.client_ssl_context()
        )
        async with tls:
            client = Client(tls)
            assert isinstance(await client.upgrade(), AcceptConnection)
            await client.send(BytesMessage(data=b"secure"))
            assert await client.receive_bytes(6) == b"secure"
    [info] = recorder.infos
    assert info.transport == "wss"
    assert info.ws_subprotocol == "mqtt"
    assert info.peer_certificate is not None
