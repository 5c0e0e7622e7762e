"""Clients of mop's gRPC service for end-to-end tests: grpcio (Python, through its generic
`stream_stream` / `unary_unary` calls and mop's pb2 classes; no generated stubs) and the
grpc-js program in `js/` (Node), plus the settings of a node that serves gRPC.

    with GrpcClient(port) as client:
        results = client.produce(topic, [Send(payload=b"hi")])
        with client.consumer(topic, "sub") as consumer:
            message = consumer.receive()
            consumer.ack([message.message_id])
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
import pulsar
import pytest

from mop.protocols.grpc.proto.mop_grpc_pb2 import Ack, Message, MessageId, Send, SendResult
from mop.settings import PulsarSettings, Settings
from mop.testing.node import RunningNode, node_settings, running_node
from mop.topic_names import mqtt_to_pulsar
from tests.e2e.conftest import Topology

SERVICE = "/mop.grpc.v1.PulsarGrpcService"
PRODUCE = f"{SERVICE}/produce"
CONSUME = f"{SERVICE}/consume"
SEND = f"{SERVICE}/send"
TIMEOUT = 10.0
# How long a node may take to stop once its clients are done.
STOP_TIMEOUT = 10.0

Metadata = tuple[tuple[str, str], ...]


def with_grpc(settings: Settings) -> Settings:
    """`settings` (merged node or separated proxy) with the gRPC adapter on a free port too."""
    protocols = settings.protocols
    if "grpc" not in protocols:
        protocols = (*protocols, "grpc")
    return dataclasses.replace(
        settings, protocols=protocols, grpc=dataclasses.replace(settings.grpc, port=0)
    )


def grpc_port(node: RunningNode) -> int:
    return node.node.address("grpc", "tcp")[1]


@dataclasses.dataclass(frozen=True)
class Site:
    """Where a test's clients go: MQTT and gRPC to `node` (a merged node, or a separated
    proxy), Pulsar clients to `pulsar_url` (the same merged node, or the proxy's broker); the
    test's topics live in `namespace`."""

    node: RunningNode
    pulsar_url: str
    namespace: str

    @property
    def grpc_port(self) -> int:
        return grpc_port(self.node)

    def topic(self, mqtt_topic: str) -> str:
        """The full Pulsar name of an MQTT topic name, in this site's namespace."""
        return mqtt_to_pulsar(mqtt_topic, namespace=self.namespace)

    def pulsar_client(self) -> pulsar.Client:
        return pulsar.Client(
            self.pulsar_url,
            operation_timeout_seconds=10,
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        )


@contextlib.contextmanager
def grpc_site(topology: Topology) -> Iterator[Site]:
    """A node serving MQTT and gRPC in the test's mode (and Pulsar, when merged)."""
    settings = node_settings()
    if topology.mode == "merged":
        settings = dataclasses.replace(
            settings, protocols=("mqtt", "pulsar"), pulsar=PulsarSettings(port=0)
        )
    with contextlib.ExitStack() as stack:
        node = stack.enter_context(running_node(with_grpc(topology.settings(settings))))
        if topology.mode == "merged":
            yield Site(node, f"pulsar://127.0.0.1:{node.node.address('pulsar')[1]}", "default")
        else:
            yield Site(node, topology.service_url, topology.namespace)
        # A node closing drains its gRPC calls in about a second; running_node gives up
        # waiting (silently) after 30 s, so a stuck close must fail here.
        started = time.monotonic()
        stack.close()
        took = time.monotonic() - started
        assert took < STOP_TIMEOUT, f"the node took {took:.1f} s to stop"


def metadata(topic: str, **keys: str) -> Metadata:
    """Call metadata: the topic and keys given as python names (pulsar_subscription=...)."""
    pairs = [("pulsar-topic", topic)]
    pairs.extend((name.replace("_", "-"), value) for name, value in keys.items())
    return tuple(pairs)


class GrpcClient:
    """One grpcio channel to a node's gRPC port."""

    def __init__(self, port: int, *, options: Sequence[tuple[str, Any]] = ()) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=list(options))
        self._produce = self.channel.stream_stream(
            PRODUCE,
            request_serializer=Send.SerializeToString,
            response_deserializer=SendResult.FromString,
        )
        self._consume = self.channel.stream_stream(
            CONSUME,
            request_serializer=Ack.SerializeToString,
            response_deserializer=Message.FromString,
        )
        self._send = self.channel.unary_unary(
            SEND,
            request_serializer=Send.SerializeToString,
            response_deserializer=SendResult.FromString,
        )

    def __enter__(self) -> GrpcClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.channel.close()

    def produce(
        self, topic: str, sends: Iterable[Send], *, timeout: float = TIMEOUT, **keys: str
    ) -> list[SendResult]:
        """Stream `sends` on one produce call; every SendResult, in order."""
        call = self._produce(iter(sends), metadata=metadata(topic, **keys), timeout=timeout)
        return list(call)

    def produce_call(self, topic: str, sends: Iterable[Send], **keys: str) -> Any:
        """A produce call left to the caller: iterate it for the SendResults."""
        return self._produce(iter(sends), metadata=metadata(topic, **keys))

    def send(
        self, topic: str, message: Send, *, timeout: float = TIMEOUT, **keys: str
    ) -> SendResult:
        result: SendResult = self._send(message, metadata=metadata(topic, **keys), timeout=timeout)
        return result

    def consumer(self, topic: str, subscription: str, **keys: str) -> GrpcConsumer:
        """A consume call on `subscription` of `topic`; its messages are read by a thread."""
        return GrpcConsumer(
            self._consume, metadata(topic, pulsar_subscription=subscription, **keys)
        )

    def consume_call(self, topic: str, subscription: str, acks: Iterator[Ack], **keys: str) -> Any:
        """A consume call left to the caller: nothing reads it until the caller iterates it."""
        return self._consume(
            acks, metadata=metadata(topic, pulsar_subscription=subscription, **keys)
        )


class GrpcConsumer:
    """A consume call whose messages a thread reads into a queue, with acks sent on demand."""

    def __init__(self, consume: Any, call_metadata: Metadata) -> None:
        self._acks: queue.Queue[Ack | None] = queue.Queue()
        self.messages: queue.Queue[Message | grpc.RpcError | None] = queue.Queue()
        self.call = consume(self._requests(), metadata=call_metadata)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def __enter__(self) -> GrpcConsumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _requests(self) -> Iterator[Ack]:
        while (ack := self._acks.get()) is not None:
            yield ack

    def _read(self) -> None:
        try:
            for message in self.call:
                self.messages.put(message)
        except grpc.RpcError as error:
            self.messages.put(error)
        self.messages.put(None)

    def receive(self, timeout: float = TIMEOUT) -> Message:
        item = self.messages.get(timeout=timeout)
        if isinstance(item, grpc.RpcError):
            raise item
        if item is None:
            raise AssertionError("the consume call ended")
        return item

    def receive_many(self, count: int, timeout: float = TIMEOUT) -> list[Message]:
        return [self.receive(timeout) for _ in range(count)]

    def expect_nothing(self, timeout: float = 0.5) -> None:
        try:
            item = self.messages.get(timeout=timeout)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected {item!r}")

    def ack(self, ids: Sequence[MessageId], *, cumulative: bool = False) -> None:
        kind = Ack.AckType.CUMULATIVE if cumulative else Ack.AckType.INDIVIDUAL
        self._acks.put(Ack(type=kind, message_ids=list(ids)))

    def close(self) -> None:
        """Half-close the acks, which ends the call once the node has taken those sent before
        (and closed its consumer, so that the subscription takes another at once); cancel
        it if it does not end in time."""
        self._acks.put(None)
        self._reader.join(TIMEOUT)
        self.call.cancel()
        self._reader.join(TIMEOUT)


def pairs(properties: Iterable[Any]) -> list[tuple[str, str]]:
    """A message's properties as (key, value) pairs, in order."""
    return [(p.key, p.value) for p in properties]


# ---- grpc-js (Node) --------------------------------------------------------------------------

JS_DIR = Path(__file__).resolve().parent / "js"


def node_missing() -> str | None:
    """Why the grpc-js client cannot run here, or None."""
    if shutil.which("node") is None:
        return "no `node` on PATH (Node 20 or later)"
    if not (JS_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir():
        return f"its packages are not installed: npm ci --prefix {JS_DIR}"
    return None


def skip_unless_node() -> None:
    """Skip the calling test module when the grpc-js client cannot run (an error under tox,
    which installs its packages: REQUIRE_NODE_TESTS=1)."""
    reason = node_missing()
    if reason is None:
        return
    if os.environ.get("REQUIRE_NODE_TESTS") == "1":
        raise RuntimeError(f"REQUIRE_NODE_TESTS=1 but the grpc-js client cannot run: {reason}")
    pytest.skip(f"grpc-js tests: {reason}", allow_module_level=True)


def run_js(request: dict[str, Any], *, timeout: float = 30) -> dict[str, Any]:
    """Run one request (see js/client.mjs) with the grpc-js client; its JSON answer."""
    done = subprocess.run(
        ["node", str(JS_DIR / "client.mjs"), json.dumps(request)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"grpc-js client failed ({done.returncode}): {done.stderr}"
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer
