"""Helpers for the Pulsar end-to-end tests: a node with the Pulsar adapter on free ports, the
real pulsar-client connected to it, a raw socket client speaking mop's own codec, and the
third-party pulsar-lite broker in a process of its own."""

from __future__ import annotations

import dataclasses
import importlib.util
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pulsar
import pytest

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


@dataclasses.dataclass(frozen=True)
class Deployment:
    """Where a test's clients connect (see the `deployment` fixture of tests/e2e/pulsar)."""

    pulsar: RunningNode  # Pulsar clients
    mqtt: RunningNode  # MQTT clients
    separated: bool


def topic_for(name: str, domain: str = "persistent") -> str:
    """A topic of its own for each test (test names are unique)."""
    local = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in name)
    return f"{domain}://public/default/{local}"


def receive_all(consumer: pulsar.Consumer, count: int, timeout_ms: int = TIMEOUT_MS) -> list[Any]:
    return [consumer.receive(timeout_millis=timeout_ms) for _ in range(count)]


def send_round_robin(client: pulsar.Client, topic: str, prefix: str, count: int) -> None:
    """`count` messages ("{prefix}0", ...) to the partitioned `topic`, one partition after the
    other, so that every partition gets some."""
    producer = client.create_producer(
        topic,
        message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution,
        batching_enabled=False,
    )
    for n in range(count):
        producer.send(f"{prefix}{n}".encode())
    producer.close()


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


# ---- pulsar-lite: a Pulsar-protocol broker that is not mop ---------------------------------

LITE_START_TIMEOUT = 20.0
LITE_STOP_TIMEOUT = 10.0


def pulsar_lite_binary() -> Path:
    """The broker binary the `pulsar-lite` wheel ships (part of the `test` extra). Its Python
    wrapper is not used: it picks ports in 6650-6700 and logs to /tmp."""
    spec = importlib.util.find_spec("pulsar_lite")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(
            "pulsar-lite is not installed; it is part of the test extra: pip install -e '.[test]'"
        )
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "pulsar-lite"
    if not binary.is_file():
        pytest.fail(f"the pulsar-lite package has no broker binary at {binary}")
    return binary


def free_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class LiteBroker:
    """One pulsar-lite process on a loopback port, its data and log in `workdir`.

    pulsar-lite does not report the port it bound when given port 0, so a free port is picked
    first; a start that loses the port to another process is retried on another one.
    """

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "pulsar-lite.log"

    @property
    def service_url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    def start(self, timeout: float = LITE_START_TIMEOUT) -> None:
        binary = pulsar_lite_binary()
        self.workdir.mkdir(parents=True, exist_ok=True)
        # Its metrics endpoint would listen on 0.0.0.0:8080.
        config = self.workdir / "pulsar-lite.toml"
        config.write_text("[metrics]\nenabled = false\n")
        deadline = time.monotonic() + timeout
        for _ in range(3):
            self.port = free_port()
            with self.log_path.open("ab") as log:
                self.process = self._spawn(binary, config, log)
            if self._wait_ready(deadline):
                return
        raise AssertionError(f"pulsar-lite did not start in {timeout}s:\n{self.log()}")

    def _spawn(self, binary: Path, config: Path, log: IO[bytes]) -> subprocess.Popen[bytes]:
        try:
            return subprocess.Popen(
                [
                    str(binary),
                    "--config",
                    str(config),
                    "--addr",
                    f"127.0.0.1:{self.port}",
                    "--db-path",
                    str(self.workdir / "data"),
                    "--log-level",
                    "warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
            )
        except OSError as exc:
            pytest.fail(
                f"the pulsar-lite binary {binary} does not run here (its wheel is built"
                f" for Linux x86_64): {exc}"
            )

    def _wait_ready(self, deadline: float) -> bool:
        """Whether the broker accepts connections before `deadline` (False: it exited)."""
        assert self.process is not None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
            except OSError:
                time.sleep(0.05)
                continue
            return True
        self.close()
        raise AssertionError(f"pulsar-lite is not listening after its start timeout:\n{self.log()}")

    def close(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL if it lingers)."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=LITE_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=LITE_STOP_TIMEOUT)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-20_000:]
        except FileNotFoundError:
            return ""
