"""serve_listeners over plain TCP: readiness, echo, isolation of failures, start-up errors."""

from __future__ import annotations

import errno
import logging
import socket
from functools import partial

import pytest
import trio

from mop.log_limit import LimitedLog
from mop.transport import (
    ConnectionInfo,
    ListenerSpec,
    listeners,
    open_listeners,
    serve_listeners,
    serve_open_listeners,
)
from mop.transport.listeners import _accept

from .servers import Recorder, exchange, running


def tcp_spec(name: str, port: int = 0) -> ListenerSpec:
    return ListenerSpec(name=name, kind="tcp", host="127.0.0.1", port=port)


async def test_two_listeners_echo_and_report_their_ports() -> None:
    recorder = Recorder()
    async with running([tcp_spec("first"), tcp_spec("second")], recorder) as bound:
        assert [entry.spec.name for entry in bound] == ["first", "second"]
        assert all(entry.host == "127.0.0.1" and entry.port > 0 for entry in bound)
        assert bound[0].port != bound[1].port
        for entry in bound:
            async with await trio.open_tcp_stream("127.0.0.1", entry.port) as client:
                assert await exchange(client, b"hello " + entry.spec.name.encode()) == (
                    b"hello " + entry.spec.name.encode()
                )
                client_address = client.socket.getsockname()
            info = recorder.infos[-1]
            assert info.transport == "tcp"
            assert info.local == ("127.0.0.1", entry.port)
            assert info.peer == client_address
            assert info.peer_certificate is None
            assert info.ws_subprotocol is None


async def test_accepted_sockets_have_nodelay() -> None:
    seen: list[int] = []

    async def handler(stream: trio.abc.Stream, info: ConnectionInfo) -> None:
        assert isinstance(stream, trio.SocketStream)
        seen.append(stream.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    async with (
        running([tcp_spec("mqtt")], handler) as bound,
        await trio.open_tcp_stream("127.0.0.1", bound[0].port) as client,
    ):
        assert await client.receive_some() == b""
    assert seen == [1]


async def test_transport_closes_the_stream_after_the_handler() -> None:
    async def handler(stream: trio.abc.Stream, info: ConnectionInfo) -> None:
        await stream.send_all(b"bye")

    async with (
        running([tcp_spec("mqtt")], handler) as bound,
        await trio.open_tcp_stream("127.0.0.1", bound[0].port) as client,
    ):
        assert await client.receive_some() == b"bye"
        assert await client.receive_some() == b""


async def test_a_failing_handler_does_not_stop_the_listener(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls = 0

    async def handler(stream: trio.abc.Stream, info: ConnectionInfo) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("handler bug")
        await Recorder()(stream, info)

    async with running([tcp_spec("mqtt")], handler) as bound:
        async with await trio.open_tcp_stream("127.0.0.1", bound[0].port) as doomed:
            assert await doomed.receive_some() == b""
        async with await trio.open_tcp_stream("127.0.0.1", bound[0].port) as client:
            assert await exchange(client, b"still here") == b"still here"

    failures = [r for r in caplog.records if r.name == "mop.transport" and r.exc_info]
    assert len(failures) == 1
    assert failures[0].levelno == logging.ERROR
    assert "handler bug" in str(failures[0].exc_info[1] if failures[0].exc_info else "")


async def test_a_vanishing_peer_is_logged_quietly(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mop.transport")
    reading = trio.Event()
    done = trio.Event()

    async def handler(stream: trio.abc.Stream, info: ConnectionInfo) -> None:
        try:
            reading.set()
            await stream.receive_some()
            # Write until the reset shows up.
            while True:
                await stream.send_all(b"x" * 65536)
        finally:
            done.set()

    async with running([tcp_spec("mqtt")], handler) as bound:
        client = await trio.open_tcp_stream("127.0.0.1", bound[0].port)
        await reading.wait()
        # SO_LINGER 0 makes close() send a reset instead of a FIN.
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        await client.send_all(b"go")
        await client.aclose()
        with trio.fail_after(5):
            await done.wait()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("lost" in r.getMessage() for r in caplog.records)


async def test_port_conflict_fails_before_started() -> None:
    occupied = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = occupied[0].socket.getsockname()[1]
    started: list[object] = []

    class Status:
        def started(self, value: object = None) -> None:
            started.append(value)

    try:
        specs = [tcp_spec("fine"), tcp_spec("busy", port)]
        with pytest.raises(OSError, match=rf"'busy' \(tcp\) cannot listen on 127\.0\.0\.1:{port}"):
            await serve_listeners(specs, Recorder(), task_status=Status())
    finally:
        for listener in occupied:
            await listener.aclose()
    assert started == []


async def test_opened_listeners_refuse_connections_until_they_are_served() -> None:
    opened = await open_listeners([tcp_spec("early")])
    [bound] = opened.bound
    assert bound.port > 0
    # Bound while the node is still starting, not listening: no handshake completes (no
    # readiness probe sees it up, no client's CONNECT waits in a backlog to be taken later).
    with pytest.raises(OSError):
        await trio.open_tcp_stream("127.0.0.1", bound.port)
    async with trio.open_nursery() as nursery:
        served = await nursery.start(serve_open_listeners, opened, Recorder())
        assert served == [bound]
        async with await trio.open_tcp_stream("127.0.0.1", bound.port) as client:
            assert await exchange(client, b"served") == b"served"
        nursery.cancel_scope.cancel()


async def test_opened_listeners_that_are_never_served_close() -> None:
    opened = await open_listeners([tcp_spec("unused")])
    port = opened.bound[0].port
    await opened.aclose()
    with pytest.raises(OSError):
        await trio.open_tcp_stream("127.0.0.1", port)


async def test_stops_accepting_when_cancelled() -> None:
    async with running([tcp_spec("mqtt")], Recorder()) as bound:
        port = bound[0].port
    with pytest.raises(OSError):
        await trio.open_tcp_stream("127.0.0.1", port)


async def test_no_specs_serves_nothing_until_cancelled() -> None:
    async with running([], Recorder()) as bound:
        assert bound == []
        await trio.sleep(0.01)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"kind": "udp"}, "kind must be one of"),
        ({"kind": "tls"}, "needs an ssl_context"),
        ({"kind": "wss"}, "needs an ssl_context"),
        ({"port": 70000}, "out of range"),
        ({"handshake_timeout": 0}, "must be positive"),
        ({"connection_rate": -1.0}, "connection_rate and burst"),
        ({"connection_burst": -1}, "connection_rate and burst"),
    ],
)
def test_invalid_specs_are_refused(changes: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"name": "mqtt", "kind": "tcp", "host": "127.0.0.1", "port": 0}
    with pytest.raises(ValueError, match=message):
        ListenerSpec(**{**fields, **changes})  # type: ignore[arg-type]


# -- connection rate ------------------------------------------------------------------------------


def rate_limited(rate: float, burst: int) -> ListenerSpec:
    def refusal(first: bytes) -> bytes:
        return b"later, " + first

    return ListenerSpec(
        name="limited",
        kind="tcp",
        host="127.0.0.1",
        port=0,
        connection_rate=rate,
        connection_burst=burst,
        refusal=refusal,
    )


async def test_connections_over_the_rate_are_refused_before_the_handler() -> None:
    recorder = Recorder()
    refused: list[str] = []
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(
            partial(
                serve_listeners,
                [rate_limited(0.001, 2)],  # two now, then hardly ever
                recorder,
                on_refused=lambda spec: refused.append(spec.name),
            )
        )
        port = bound[0].port
        for index in range(2):
            async with await trio.open_tcp_stream("127.0.0.1", port) as client:
                assert await exchange(client, b"hello %d" % index) == b"hello %d" % index
        # Over the burst: answered from the first bytes, then closed; the handler never runs.
        async with await trio.open_tcp_stream("127.0.0.1", port) as client:
            await client.send_all(b"CONNECT")
            received = b""
            with trio.fail_after(5):
                while data := await client.receive_some():
                    received += data
        assert received == b"later, CONNECT"
        # A client that sends nothing is closed without an answer.
        async with await trio.open_tcp_stream("127.0.0.1", port) as client:
            with trio.fail_after(5):
                assert await client.receive_some() == b""
        nursery.cancel_scope.cancel()
    assert len(recorder.infos) == 2
    assert refused == ["limited", "limited"]


async def test_the_rate_lets_connections_in_again_as_it_refills() -> None:
    recorder = Recorder()
    async with running([rate_limited(2.0, 1)], recorder) as bound:
        port = bound[0].port

        async def served() -> bool:
            async with await trio.open_tcp_stream("127.0.0.1", port) as client:
                return await exchange(client, b"ping") == b"ping"

        assert await served()
        assert not await served()  # within half a second of the first
        await trio.sleep(0.6)
        assert await served()
    assert len(recorder.infos) == 2


async def test_a_refused_client_that_sent_more_reads_the_answer_then_a_clean_end() -> None:
    """What a refused client sent after its first bytes is read and dropped: the answer is
    followed by a FIN, not by a reset that could take it away."""
    async with running([rate_limited(0.001, 1)], Recorder()) as bound:
        port = bound[0].port
        async with await trio.open_tcp_stream("127.0.0.1", port) as admitted:
            assert await exchange(admitted, b"first") == b"first"
            async with await trio.open_tcp_stream("127.0.0.1", port) as client:
                await client.send_all(b"CONNECT" + b"x" * 300_000)
                received = b""
                with trio.fail_after(5):
                    while data := await client.receive_some():
                        received += data
        assert received.startswith(b"later, CONNECT")


async def test_a_refused_client_is_not_read_from_without_end() -> None:
    """A refused client that goes on sending is closed all the same, within a second or a
    mebibyte of what it sends after the answer."""
    async with running([rate_limited(0.001, 1)], Recorder()) as bound:
        port = bound[0].port
        async with await trio.open_tcp_stream("127.0.0.1", port) as admitted:
            assert await exchange(admitted, b"first") == b"first"
            async with await trio.open_tcp_stream("127.0.0.1", port) as client:
                await client.send_all(b"CONNECT")
                assert (await client.receive_some()).startswith(b"later, CONNECT")
                with trio.fail_after(5), pytest.raises(trio.BrokenResourceError):
                    while True:
                        await client.send_all(b"x" * 65536)


class _RunsOutOfDescriptors(trio.abc.Listener[trio.SocketStream]):
    """Fails its first accepts as a process out of file descriptors does, then hands out one
    end of a real connection."""

    def __init__(self, failures: int, stream: trio.SocketStream) -> None:
        self.failures = failures
        self.stream: trio.SocketStream | None = stream
        self.closed = False

    async def accept(self) -> trio.SocketStream:
        await trio.lowlevel.checkpoint()
        if self.failures:
            self.failures -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        if self.stream is None:
            await trio.sleep_forever()
        stream, self.stream = self.stream, None
        assert stream is not None
        return stream

    async def aclose(self) -> None:
        self.closed = True


async def test_accept_keeps_going_when_out_of_file_descriptors(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A limiter of its own: what other tests logged does not count against this one.
    monkeypatch.setattr(listeners, "_accept_failures", LimitedLog(listeners.logger))
    a, b = socket.socketpair()
    served = trio.Event()

    async def serve(stream: trio.SocketStream) -> None:
        served.set()

    listener = _RunsOutOfDescriptors(3, trio.SocketStream(trio.socket.from_stdlib_socket(a)))
    with caplog.at_level(logging.ERROR, logger="mop.transport"), trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_accept, listener, serve, nursery)
            await served.wait()
            nursery.cancel_scope.cancel()
    b.close()
    a.close()
    assert listener.closed
    # Ten tries a second while it lasts, one line per interval: not a flood.
    assert sum("EMFILE" in record.getMessage() for record in caplog.records) == 1


async def test_accept_stops_on_other_errors() -> None:
    class Broken(trio.abc.Listener[trio.SocketStream]):
        async def accept(self) -> trio.SocketStream:
            await trio.lowlevel.checkpoint()
            raise OSError(errno.EBADF, "Bad file descriptor")

        async def aclose(self) -> None:
            pass

    async def serve(stream: trio.SocketStream) -> None:
        raise AssertionError("nothing was accepted")

    with pytest.raises(BaseExceptionGroup) as caught:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_accept, Broken(), serve, nursery)
    assert caught.value.subgroup(OSError) is not None


async def test_connections_to_a_listener_share_one_local_address() -> None:
    recorder = Recorder()
    async with running([tcp_spec("shared")], recorder) as bound:
        for _ in range(2):
            async with await trio.open_tcp_stream("127.0.0.1", bound[0].port) as client:
                assert await exchange(client, b"x") == b"x"
    first, second = recorder.infos
    assert first.local == ("127.0.0.1", bound[0].port)
    assert first.local is second.local  # one tuple, not one per connection
    assert first.peer != second.peer
