"""Real MQTT clients other than paho against a node: gmqtt (asyncio) and the mosquitto command
line clients `mosquitto_pub` and `mosquitto_sub`."""

from __future__ import annotations

import asyncio
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import gmqtt
import pytest
from gmqtt.mqtt.constants import MQTTv50, MQTTv311

from mop.settings import TlsSettings
from mop.testing.certs import TestCertificates
from mop.testing.node import RunningNode, node_settings, running_node
from tests.e2e.clients import Client

pytestmark = [pytest.mark.e2e, pytest.mark.both_modes]

TIMEOUT = 10.0

needs_mosquitto = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("mosquitto_pub", "mosquitto_sub", "stdbuf")),
    reason="the mosquitto command line clients are not installed (Debian: mosquitto-clients)",
)


# -- gmqtt ----------------------------------------------------------------------------------------


class GmqttInbox:
    """Collects what a gmqtt client receives, and its SUBACKs, on the asyncio loop."""

    def __init__(self, client: gmqtt.Client) -> None:
        self.messages: asyncio.Queue[tuple[str, bytes, int, dict[str, Any]]] = asyncio.Queue()
        self.subacks: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        client.on_message = self._on_message
        client.on_subscribe = self._on_subscribe

    def _on_message(
        self, client: gmqtt.Client, topic: str, payload: bytes, qos: int, properties: dict[str, Any]
    ) -> int:
        self.messages.put_nowait((topic, payload, qos, properties))
        return 0  # PUBACK / PUBREC reason code: success

    def _on_subscribe(self, client: gmqtt.Client, mid: int, qos: Any, properties: Any) -> None:
        self.subacks.put_nowait((mid, qos))

    async def suback(self) -> Any:
        _, granted = await asyncio.wait_for(self.subacks.get(), TIMEOUT)
        return granted

    async def message(self) -> tuple[str, bytes, int, dict[str, Any]]:
        return await asyncio.wait_for(self.messages.get(), TIMEOUT)


async def _gmqtt_pub_sub(port: int, version: int, qos: int) -> None:
    sub = gmqtt.Client(f"gm-sub-{version}-{qos}")
    inbox = GmqttInbox(sub)
    pub = gmqtt.Client(f"gm-pub-{version}-{qos}")
    await asyncio.wait_for(sub.connect("127.0.0.1", port, version=version), TIMEOUT)
    await asyncio.wait_for(pub.connect("127.0.0.1", port, version=version), TIMEOUT)
    try:
        sub.subscribe("gm/+/data", qos=qos)
        assert list(await inbox.suback()) == [qos]
        extra: dict[str, Any] = {}
        if version == MQTTv50:
            extra = {
                "user_property": [("unit", "celsius"), ("unit", "kelvin"), ("site", "lab")],
                "content_type": "text/plain",
                "response_topic": "gm/replies",
                "correlation_data": b"\x00\x07",
            }
        pub.publish("gm/kitchen/data", b"21.5", qos=qos, **extra)
        pub.publish("gm/hall/data", b"19.0", qos=qos, **extra)
        # MQTT orders messages per topic; across two topics either order is correct.
        received = {m[0]: m for m in [await inbox.message(), await inbox.message()]}
        assert sorted((m[0], m[1], m[2]) for m in received.values()) == [
            ("gm/hall/data", b"19.0", qos),
            ("gm/kitchen/data", b"21.5", qos),
        ]
        if version == MQTTv50:
            properties = received["gm/kitchen/data"][3]
            assert properties["user_property"] == extra["user_property"]
            assert properties["content_type"] == ["text/plain"]
            assert properties["response_topic"] == ["gm/replies"]
            assert properties["correlation_data"] == [b"\x00\x07"]
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(inbox.messages.get(), 0.3)
    finally:
        await asyncio.wait_for(pub.disconnect(), TIMEOUT)
        await asyncio.wait_for(sub.disconnect(), TIMEOUT)


@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize("version", [MQTTv50, MQTTv311], ids=["v5", "v311"])
def test_gmqtt_pub_sub(node: RunningNode, version: int, qos: int) -> None:
    asyncio.run(_gmqtt_pub_sub(node.mqtt_port, version, qos))


def test_gmqtt_and_paho_interoperate(node: RunningNode) -> None:
    paho_sub = Client(node.mqtt_port, "paho-sub")
    paho_sub.subscribe("mixed/#", 1)

    async def main() -> None:
        client = gmqtt.Client("gm-mixed")
        inbox = GmqttInbox(client)
        await asyncio.wait_for(client.connect("127.0.0.1", node.mqtt_port), TIMEOUT)
        try:
            client.subscribe("back/#", qos=1)
            await inbox.suback()
            client.publish("mixed/from-gmqtt", b"hello paho", qos=1, user_property=("k", "v"))
            [msg] = await asyncio.to_thread(paho_sub.expect, 1)
            assert (msg.topic, msg.payload) == ("mixed/from-gmqtt", b"hello paho")
            assert msg.properties.UserProperty == [("k", "v")]
            await asyncio.to_thread(paho_sub.publish, "back/to-gmqtt", b"hello gmqtt", 1)
            topic, payload, qos, _ = await inbox.message()
            assert (topic, payload, qos) == ("back/to-gmqtt", b"hello gmqtt", 1)
        finally:
            await asyncio.wait_for(client.disconnect(), TIMEOUT)

    asyncio.run(main())
    paho_sub.disconnect()


# -- mosquitto_pub / mosquitto_sub ----------------------------------------------------------------


class MosquittoSub:
    """`mosquitto_sub` in the background; `-d` makes it report its SUBACK, so the test knows
    when publishing can start (`stdbuf` keeps its piped output line buffered). `finish()`
    returns its output lines without the debug ones."""

    def __init__(self, port: int, *args: str) -> None:
        self._out: queue.Queue[str | None] = queue.Queue()
        self.process = subprocess.Popen(
            ["stdbuf", "-oL", "mosquitto_sub", "-p", str(port), "-h", "127.0.0.1", "-d", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._debug: list[str] = []
        self._lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._out.put(line.rstrip("\n"))
        self._out.put(None)

    def _take(self, line: str) -> None:
        if line.startswith(("Client ", "Subscribed (")):
            self._debug.append(line)
        else:
            self._lines.append(line)

    def wait_subscribed(self) -> None:
        deadline = time.monotonic() + TIMEOUT
        while not any("received SUBACK" in line for line in self._debug):
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"mosquitto_sub did not subscribe: {self._debug}"
            try:
                line = self._out.get(timeout=remaining)
            except queue.Empty:
                continue
            assert line is not None, f"mosquitto_sub exited: {self.finish()}"
            self._take(line)

    def finish(self, timeout: float = TIMEOUT) -> list[str]:
        """Wait for the process to exit by itself; its output lines."""
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
            raise AssertionError(f"mosquitto_sub did not finish; printed {self._lines}") from None
        self._reader.join(5)
        while True:
            try:
                line = self._out.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self._take(line)
        assert self.process.stderr is not None
        errors = self.process.stderr.read()
        self.process.stdout.close()  # type: ignore[union-attr]
        self.process.stderr.close()
        assert self.process.returncode == 0, (self.process.returncode, errors, self._debug)
        return self._lines

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(5)
        self._reader.join(5)  # it reads until the end of the output; then the pipes can close
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def mosquitto_subs() -> Iterator[Any]:
    started: list[MosquittoSub] = []

    def start(port: int, *args: str) -> MosquittoSub:
        sub = MosquittoSub(port, *args)
        started.append(sub)
        return sub

    yield start
    for sub in started:
        sub.stop()


def mosquitto_pub(port: int, *args: str, stdin: str | None = None) -> None:
    result = subprocess.run(
        ["mosquitto_pub", "-p", str(port), "-h", "127.0.0.1", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, (result.returncode, result.stderr)


@needs_mosquitto
@pytest.mark.parametrize("version", ["mqttv311", "mqttv5", "mqttv31"])
def test_mosquitto_sub_receives_qos_0_1_2(
    node: RunningNode, mosquitto_subs: Any, version: str
) -> None:
    port = node.mqtt_port
    sub = mosquitto_subs(port, "-V", version, "-t", "t/#", "-q", "2", "-C", "3", "-v")
    sub.wait_subscribed()
    for qos in (0, 1, 2):
        mosquitto_pub(
            port, "-V", version, "-t", f"t/q{qos}", "-m", f"message {qos}", "-q", str(qos)
        )
    # Three topics: any order between them is correct MQTT.
    assert sorted(sub.finish()) == ["t/q0 message 0", "t/q1 message 1", "t/q2 message 2"]


@needs_mosquitto
def test_mosquitto_delivery_qos_and_flags(node: RunningNode, mosquitto_subs: Any) -> None:
    port = node.mqtt_port
    sub = mosquitto_subs(
        port, "-V", "mqttv5", "-t", "f/#", "-q", "1", "-C", "3", "-F", "%t|%q|%r|%p"
    )
    sub.wait_subscribed()
    for qos in (0, 1, 2):
        mosquitto_pub(port, "-t", "f/x", "-m", f"q{qos}", "-q", str(qos))
    # Delivered at the lower of the publish QoS and the granted QoS 1.
    assert sub.finish() == ["f/x|0|0|q0", "f/x|1|0|q1", "f/x|1|0|q2"]


@needs_mosquitto
def test_mosquitto_retained_message(node: RunningNode, mosquitto_subs: Any) -> None:
    port = node.mqtt_port
    mosquitto_pub(port, "-t", "ret/state", "-m", "on", "-q", "1", "-r")
    sub = mosquitto_subs(port, "-t", "ret/#", "-C", "1", "-F", "%t|%r|%p")
    assert sub.finish() == ["ret/state|1|on"]
    # An empty retained message clears it: a new subscriber gets only live messages.
    mosquitto_pub(port, "-t", "ret/state", "-n", "-q", "1", "-r")
    later = mosquitto_subs(port, "-t", "ret/#", "-C", "1", "-F", "%t|%r|%p")
    later.wait_subscribed()
    mosquitto_pub(port, "-t", "ret/state", "-m", "live", "-q", "1")
    assert later.finish() == ["ret/state|0|live"]


@needs_mosquitto
def test_mosquitto_pub_v5_user_property(node: RunningNode, mosquitto_subs: Any) -> None:
    port = node.mqtt_port
    paho_sub = Client(port, "paho-v5")
    paho_sub.subscribe("up/#", 1)
    mosquitto = mosquitto_subs(port, "-V", "mqttv5", "-t", "up/#", "-C", "1", "-F", "%t|%P|%p")
    mosquitto.wait_subscribed()
    mosquitto_pub(
        port,
        "-V",
        "mqttv5",
        "-t",
        "up/x",
        "-m",
        "with props",
        "-q",
        "1",
        "-D",
        "publish",
        "user-property",
        "k",
        "v",
        "-D",
        "publish",
        "user-property",
        "region",
        "eu",
        "-D",
        "publish",
        "content-type",
        "text/plain",
    )
    [msg] = paho_sub.expect(1)
    assert msg.payload == b"with props"
    assert msg.properties.UserProperty == [("k", "v"), ("region", "eu")]
    assert msg.properties.ContentType == "text/plain"
    [line] = mosquitto.finish()
    assert line.startswith("up/x|") and line.endswith("|with props"), line
    assert "k:v" in line and "region:eu" in line
    paho_sub.disconnect()


@needs_mosquitto
def test_mosquitto_pub_lines_in_order(node: RunningNode) -> None:
    """`mosquitto_pub -l` sends one message per input line over one connection, pipelined."""
    sub = Client(node.mqtt_port, "lines")
    sub.subscribe("lines", 1)
    lines = [f"line {i}" for i in range(200)]
    mosquitto_pub(node.mqtt_port, "-t", "lines", "-q", "1", "-l", stdin="\n".join(lines) + "\n")
    assert [m.payload.decode() for m in sub.expect(len(lines))] == lines
    sub.disconnect()


@needs_mosquitto
def test_mosquitto_will_on_abnormal_exit(node: RunningNode, mosquitto_subs: Any) -> None:
    watcher = Client(node.mqtt_port, "watcher")
    watcher.subscribe("wills/#", 1)
    holder = mosquitto_subs(
        node.mqtt_port,
        "-t",
        "nothing",
        "-i",
        "will-holder",
        "--will-topic",
        "wills/holder",
        "--will-payload",
        "gone",
        "--will-qos",
        "1",
    )
    holder.wait_subscribed()
    holder.process.kill()  # no DISCONNECT: the will is published
    holder.process.wait(5)
    [msg] = watcher.expect(1)
    assert (msg.topic, msg.payload) == ("wills/holder", b"gone")
    watcher.disconnect()


# -- mosquitto over TLS ---------------------------------------------------------------------------


@needs_mosquitto
def test_mosquitto_over_mtls(certs: TestCertificates, mosquitto_subs: Any) -> None:
    tls = TlsSettings(
        certfile=str(certs.server_cert),
        keyfile=str(certs.server_key),
        cafile=str(certs.ca_cert),
        require_client_cert=True,
    )
    with running_node(node_settings(tls=tls, tls_port=0)) as node:
        port = node.port("tls")
        options = [
            "--cafile",
            str(certs.ca_cert),
            "--cert",
            str(certs.client_cert),
            "--key",
            str(certs.client_key),
        ]
        sub = mosquitto_subs(port, *options, "-t", "secure/#", "-C", "1", "-v")
        sub.wait_subscribed()
        mosquitto_pub(port, *options, "-t", "secure/x", "-m", "over mtls", "-q", "1")
        assert sub.finish() == ["secure/x over mtls"]
        # Without a client certificate, mosquitto_pub cannot publish.
        result = subprocess.run(
            [
                "mosquitto_pub",
                "-p",
                str(port),
                "-h",
                "127.0.0.1",
                "--cafile",
                str(certs.ca_cert),
                "-t",
                "secure/x",
                "-m",
                "no cert",
                "-q",
                "1",
            ],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        assert result.returncode != 0
