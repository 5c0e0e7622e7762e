"""A real mosquitto bridge to mop, both ways: mosquitto (Debian's) runs with a `connection`
section to the node, as deployments that bridge their site brokers to a central one do.

A mosquitto bridge announces itself with the top bit of the protocol level and then relies on
the remote broker not to send its own messages back (No Local) and to keep the retain flag of
what it forwards (Retain As Published) on its 3.1/3.1.1 subscriptions; without them messages
loop between the brokers and retained messages lose their flag.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mop.testing.node import RunningNode
from tests.e2e.clients import Client

pytestmark = [pytest.mark.e2e, pytest.mark.both_modes]

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
TIMEOUT = 10.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture(
    params=[("mqttv311", True), ("mqttv311", False), ("mqttv50", True)],
    ids=["3.1.1", "3.1.1-no-notifications", "5.0"],
)
def mosquitto(node: RunningNode, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[int]:
    """A mosquitto broker bridged to the node (topics `br/#` both ways); its port. An MQTT
    3.1.1 bridge sets the bridge bit and leaves No Local and Retain As Published to the
    node; an MQTT 5 one asks for them itself. With mosquitto's default `notifications true`
    the bridge also has a will on, and publishes its state to,
    `$SYS/broker/connection/{id}/state`."""
    version, notifications = request.param
    if not Path(MOSQUITTO).exists():
        pytest.skip("mosquitto is not installed")
    port = free_port()
    config = tmp_path / "mosquitto.conf"
    config.write_text(
        f"listener {port} 127.0.0.1\n"
        "allow_anonymous true\n"
        "persistence false\n"
        "log_dest stdout\n"
        "connection to-mop\n"
        f"address 127.0.0.1:{node.mqtt_port}\n"
        "topic br/# both 1\n"
        f"bridge_protocol_version {version}\n"
        "try_private true\n"
        "cleansession true\n"
        "restart_timeout 1\n"
        f"notifications {'true' if notifications else 'false'}\n"
    )
    log = tmp_path / "mosquitto.log"
    with log.open("wb") as output:
        broker = subprocess.Popen([MOSQUITTO, "-c", str(config)], stdout=output, stderr=output)
    try:
        deadline = time.monotonic() + TIMEOUT
        while True:
            assert broker.poll() is None, f"mosquitto exited with {broker.returncode}"
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                    break
            except OSError:
                assert time.monotonic() < deadline, "mosquitto is not listening"
                time.sleep(0.05)
        yield port
    finally:
        broker.terminate()
        broker.wait(timeout=10)
        print(log.read_text())  # shown when the test fails


def bridged(mop: Client, mosquitto_port: int) -> None:
    """Wait until the bridge carries messages from mosquitto to the node."""
    probe = Client(mosquitto_port, "probe", version=4)
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        probe.publish("br/probe", b"?", 1)
        try:
            msg = mop.messages.get(timeout=0.3)
        except Exception:
            continue
        if msg.topic == "br/probe":
            break
    else:
        pytest.fail("the bridge did not come up")
    time.sleep(0.5)
    while not mop.messages.empty():
        mop.messages.get()
    probe.disconnect()


def drained(client: Client) -> None:
    while not client.messages.empty():
        client.messages.get()


def test_messages_cross_the_bridge_once_each_way(node: RunningNode, mosquitto: int) -> None:
    on_mop = Client(node.mqtt_port, "on-mop", version=4)
    on_mop.subscribe("br/#", 1)
    on_mosquitto = Client(mosquitto, "on-mosquitto", version=4)
    on_mosquitto.subscribe("br/#", 1)
    bridged(on_mop, mosquitto)
    drained(on_mosquitto)

    Client(mosquitto, "pub-mosquitto", version=4).publish("br/from-mosquitto", b"m", 1)
    Client(node.mqtt_port, "pub-mop", version=4).publish("br/from-mop", b"o", 1)
    time.sleep(1.0)  # time for copies that loop back
    for client in (on_mop, on_mosquitto):
        got = sorted((m.topic, m.payload) for m in client.expect(2))
        assert got == [("br/from-mop", b"o"), ("br/from-mosquitto", b"m")]
        client.expect_none(0.5)  # no copy came back over the bridge


def test_retained_messages_keep_their_flag_across_the_bridge(
    node: RunningNode, mosquitto: int
) -> None:
    on_mop = Client(node.mqtt_port, "rb-on-mop", version=4)
    on_mop.subscribe("br/#", 1)
    bridged(on_mop, mosquitto)
    Client(node.mqtt_port, "rb-pub-mop", version=4).publish("br/kept-mop", b"o", 1, retain=True)
    Client(mosquitto, "rb-pub-mq", version=4).publish("br/kept-mq", b"m", 1, retain=True)
    time.sleep(1.0)
    late_mosquitto = Client(mosquitto, "rb-late-mq", version=4)
    late_mosquitto.subscribe("br/kept-mop", 1)
    [msg] = late_mosquitto.expect(1)
    assert (msg.payload, msg.retain) == (b"o", True)
    late_mop = Client(node.mqtt_port, "rb-late-mop", version=4)
    late_mop.subscribe("br/kept-mq", 1)
    [msg] = late_mop.expect(1)
    assert (msg.payload, msg.retain) == (b"m", True)
