"""Helpers for the Pulsar end-to-end tests: a node with the Pulsar adapter on free ports, the
real pulsar-client connected to it, and a raw socket client speaking mop's own codec."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pulsar

from mop.protocols.pulsar.commands import Command, Connect
from mop.protocols.pulsar.frames import Frame, FrameDecoder, NeedData, encode_command
from mop.settings import PulsarSettings, Settings
from mop.testing.node import RunningNode, node_settings, running_node
from tests.e2e.raw import BlockingPeer

TIMEOUT_MS = 5000


def pulsar_settings(**mqtt: Any) -> Settings:
    return dataclasses.replace(
        node_settings(**mqtt), protocols=("mqtt", "pulsar"), pulsar=PulsarSettings(port=0)
    )


@contextmanager
def pulsar_node(settings: Settings | None = None) -> Iterator[RunningNode]:
    with running_node(settings or pulsar_settings()) as node:
        yield node


def pulsar_port(node: RunningNode) -> int:
    return node.node.address("pulsar", "tcp")[1]


def service_url(node: RunningNode) -> str:
    return f"pulsar://127.0.0.1:{pulsar_port(node)}"


@contextmanager
def pulsar_client(node: RunningNode, **options: Any) -> Iterator[pulsar.Client]:
    options.setdefault("operation_timeout_seconds", 10)
    client = pulsar.Client(
        service_url(node),
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        **options,
    )
    try:
        yield client
    finally:
        client.close()


def topic_for(name: str, domain: str = "persistent") -> str:
    """A topic of its own for each test (test names are unique)."""
    local = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in name)
    return f"{domain}://public/default/{local}"


def receive_all(consumer: pulsar.Consumer, count: int, timeout_ms: int = TIMEOUT_MS) -> list[Any]:
    return [consumer.receive(timeout_millis=timeout_ms) for _ in range(count)]


def expect_nothing(consumer: pulsar.Consumer, timeout_ms: int = 300) -> None:
    try:
        message = consumer.receive(timeout_millis=timeout_ms)
    except pulsar.Timeout:
        return
    raise AssertionError(f"unexpected message {message.data()!r}")


def ids(messages: list[Any]) -> list[tuple[int, int, int]]:
    return [
        (m.message_id().ledger_id(), m.message_id().entry_id(), m.message_id().batch_index())
        for m in messages
    ]


class RawPulsar(BlockingPeer[Frame]):
    """A blocking socket client that speaks frames with mop's codec: exact control of bytes."""

    item_name = "frame"

    def __init__(self, port: int) -> None:
        super().__init__(socket.create_connection(("127.0.0.1", port), timeout=10))
        self.decoder = FrameDecoder(max_frame_size=64 << 20)

    def _decode(self) -> Frame | None:
        frame = self.decoder.next_frame()
        return None if isinstance(frame, NeedData) else frame

    def _feed(self, data: bytes) -> None:
        self.decoder.feed(data)

    def send(self, command: Command) -> None:
        self.sock.sendall(encode_command(command))

    def connect(self) -> Frame | None:
        self.send(Connect(client_version="raw-test", protocol_version=20))
        return self.recv()
