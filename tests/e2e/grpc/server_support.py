"""A gRPC server with methods of a test's own, on a free loopback port in a trio thread, for
grpcio clients; and the raw-bytes stubs that call its methods without generated code."""

from __future__ import annotations

import dataclasses
import ssl
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import Any

import grpc
import trio

from mop.counters import ProtocolStats
from mop.protocols.grpc.serving.calls import MethodHandler
from mop.protocols.grpc.serving.server import GrpcServer
from mop.settings import GrpcSettings, Settings
from mop.testing.node import node_settings
from mop.transport import ListenerSpec, serve_listeners


@dataclasses.dataclass
class ServerUnderTest:
    port: int
    server: GrpcServer
    token: trio.lowlevel.TrioToken

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the server's trio thread (to look at its state)."""
        return trio.from_thread.run_sync(fn, trio_token=self.token)

    def run(self, fn: Callable[[], Any]) -> Any:
        return trio.from_thread.run(fn, trio_token=self.token)


@contextmanager
def serving(
    methods: Mapping[str, MethodHandler],
    settings: GrpcSettings | None = None,
    *,
    ssl_context: ssl.SSLContext | None = None,
) -> Iterator[ServerUnderTest]:
    """A GrpcServer serving `methods` until the block ends (then closed as a node closes it)."""
    settings = settings or GrpcSettings(port=0)
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        server = GrpcServer(settings, methods, ProtocolStats("grpc"))
        kind = "tcp" if ssl_context is None else "tls"
        spec = ListenerSpec("grpc", kind, "127.0.0.1", 0, ssl_context=ssl_context)
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(serve_listeners, [spec], server.handle_connection)
            stop = trio.Event()
            box["running"] = ServerUnderTest(
                bound[0].port, server, trio.lowlevel.current_trio_token()
            )
            box["stop"] = stop
            ready.set()
            await stop.wait()
            await server.close()
            nursery.cancel_scope.cancel()

    def run() -> None:
        try:
            trio.run(main)
        except BaseException as exc:  # reported to the test thread below
            box["error"] = exc
        finally:
            ready.set()

    thread = threading.Thread(target=run, name="grpc-server", daemon=True)
    thread.start()
    ready.wait(10)
    if "running" not in box:
        raise RuntimeError(f"server did not start: {box.get('error')!r}")
    running: ServerUnderTest = box["running"]
    try:
        yield running
    finally:
        with suppress(trio.RunFinishedError):
            trio.from_thread.run_sync(box["stop"].set, trio_token=running.token)
        thread.join(10)
        if "error" in box:
            raise box["error"]


def grpc_node_settings(**grpc_options: Any) -> Settings:
    """A throw-away merged node serving gRPC (and MQTT) on free loopback ports."""
    grpc_options.setdefault("port", 0)
    grpc_options.setdefault("tls_port", 0)
    return dataclasses.replace(
        node_settings(), protocols=("mqtt", "grpc"), grpc=GrpcSettings(**grpc_options)
    )


def _identity(data: bytes) -> bytes:
    return data


def unary(channel: grpc.Channel, path: str) -> grpc.UnaryUnaryMultiCallable:
    return channel.unary_unary(path, request_serializer=_identity, response_deserializer=_identity)


def stream_stream(channel: grpc.Channel, path: str) -> grpc.StreamStreamMultiCallable:
    return channel.stream_stream(
        path, request_serializer=_identity, response_deserializer=_identity
    )


def unary_stream(channel: grpc.Channel, path: str) -> grpc.UnaryStreamMultiCallable:
    return channel.unary_stream(path, request_serializer=_identity, response_deserializer=_identity)
