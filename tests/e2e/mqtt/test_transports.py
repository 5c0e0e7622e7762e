"""MQTT over WebSocket, TLS and mutual TLS, end to end with paho-mqtt; clients on different
transports of the same node talk to each other."""

from __future__ import annotations

import gc
import socket
import ssl
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt.client import WebsocketConnectionError

from mop.settings import TlsSettings
from mop.testing.certs import TestCertificates, make_test_certificates
from mop.testing.node import RunningNode, node_settings, running_node
from tests.e2e.clients import Client

pytestmark = [pytest.mark.e2e, pytest.mark.both_modes]


def paho_connect(client: Client) -> str | None:
    """`connect()` of the paho client; the error text when the handshake fails.

    paho does not close its socket when a TLS or WebSocket handshake fails; the leaked socket is
    collected here, where its ResourceWarning is expected, instead of in some later test.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            client.client.connect(client.host, client.port, keepalive=60)
        except (ssl.SSLError, OSError, WebsocketConnectionError) as exc:
            error = f"connect failed: {exc!r}"
        else:
            error = None
        gc.collect()
    return error


def refused(port: int, **kwargs: Any) -> str:
    """Try to connect a paho client that must not get a session; how it was refused."""
    client = Client(port, "refused", connect=False, **kwargs)
    try:
        error = paho_connect(client)
        if error is not None:
            return error
        client.client.loop_start()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if client._connack.event.is_set():
                connack = client._connack.result
                assert connack.reason_code != 0, "the connection was accepted"
                return f"CONNACK 0x{connack.reason_code:02X}"
            if not client.disconnects.empty():
                return "disconnected before CONNACK"
            time.sleep(0.02)
        raise AssertionError("neither accepted nor refused within 5 s")
    finally:
        client.client.loop_stop()
        sock = client.client.socket()
        if sock is not None:
            sock.close()


def round_trip(sender: Client, receiver: Client, topic: str, qos: int = 1) -> None:
    assert receiver.subscribe(topic, qos) == [qos]
    payload = f"{topic} via {sender.port}".encode()
    sender.publish(topic, payload, qos)
    [msg] = receiver.expect(1)
    assert (msg.topic, msg.payload, msg.qos) == (topic, payload, qos)
    receiver.expect_none(0.1)


# -- WebSocket ------------------------------------------------------------------------------------


@pytest.fixture
def ws_node() -> Iterator[RunningNode]:
    with running_node(node_settings(ws_enabled=True, ws_port=0)) as running:
        yield running


@pytest.mark.parametrize("version", [3, 4, 5])
def test_websocket_pub_sub(ws_node: RunningNode, version: int) -> None:
    ws_port = ws_node.port("ws")
    assert ws_port != ws_node.mqtt_port
    sub = Client(ws_port, f"ws-sub-{version}", version=version, transport="websockets")
    pub = Client(ws_port, f"ws-pub-{version}", version=version, transport="websockets")
    for qos in (0, 1, 2):
        round_trip(pub, sub, f"ws/{version}/{qos}", qos)
    sub.disconnect()
    pub.disconnect()


def test_websocket_and_tcp_clients_meet(ws_node: RunningNode) -> None:
    ws = Client(ws_node.port("ws"), "ws", transport="websockets")
    tcp = Client(ws_node.mqtt_port, "tcp")
    round_trip(tcp, ws, "meet/ws")
    round_trip(ws, tcp, "meet/tcp")
    ws.disconnect()
    tcp.disconnect()


def test_websocket_large_message(ws_node: RunningNode) -> None:
    """A message larger than one WebSocket read and frame crosses intact in both directions."""
    ws = Client(ws_node.port("ws"), "ws-big", transport="websockets")
    tcp = Client(ws_node.mqtt_port, "tcp-big")
    ws.subscribe("big/ws", 1)
    tcp.subscribe("big/tcp", 1)
    payload = bytes(range(256)) * 1024  # 256 KiB
    tcp.publish("big/ws", payload, 1)
    ws.publish("big/tcp", payload[::-1], 1)
    assert ws.expect(1)[0].payload == payload
    assert tcp.expect(1)[0].payload == payload[::-1]
    ws.disconnect()
    tcp.disconnect()


def test_websocket_wrong_path_is_refused(ws_node: RunningNode) -> None:
    client = Client(ws_node.port("ws"), "lost", transport="websockets", connect=False)
    client.client.ws_set_options(path="/not-mqtt")
    error = paho_connect(client)
    assert error is not None and "not upgraded" in error, error


def http_upgrade(port: int, path: str, subprotocols: str | None) -> bytes:
    """The head of the server's answer to a WebSocket opening handshake."""
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version: 13",
    ]
    if subprotocols is not None:
        lines.append(f"Sec-WebSocket-Protocol: {subprotocols}")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                break
            head += chunk
    return head


@pytest.mark.parametrize(
    ("path", "offered", "status", "chosen"),
    [
        ("/mqtt", "mqtt", b"101", b"mqtt"),
        ("/mqtt", "mqttv3.1", b"101", b"mqttv3.1"),
        ("/mqtt", "mqttv3.1, mqtt", b"101", b"mqtt"),  # the server's preference wins
        ("/mqtt?x=1", "mqtt", b"101", b"mqtt"),
        ("/mqtt", None, b"101", None),
        ("/mqtt", "stomp", b"400", None),
        ("/other", "mqtt", b"404", None),
    ],
)
def test_websocket_handshake(
    ws_node: RunningNode, path: str, offered: str | None, status: bytes, chosen: bytes | None
) -> None:
    head = http_upgrade(ws_node.port("ws"), path, offered)
    assert head.startswith(b"HTTP/1.1 " + status), head
    protocol = [
        line for line in head.lower().split(b"\r\n") if line.startswith(b"sec-websocket-protocol:")
    ]
    if chosen is None:
        assert protocol == [], head
    else:
        assert protocol == [b"sec-websocket-protocol: " + chosen], head


def test_websocket_listener_is_off_by_default(node: RunningNode) -> None:
    with pytest.raises(LookupError):
        node.port("ws")


def test_plain_mqtt_on_the_websocket_port_is_refused(ws_node: RunningNode) -> None:
    assert refused(ws_node.port("ws")).startswith(("disconnected", "connect failed"))


# -- TLS ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def other_certs(tmp_path_factory: pytest.TempPathFactory) -> TestCertificates:
    """Certificates from a CA the node does not know."""
    return make_test_certificates(tmp_path_factory.mktemp("other-certs"))


def tls_settings(certs: TestCertificates, **kwargs: Any) -> TlsSettings:
    return TlsSettings(certfile=str(certs.server_cert), keyfile=str(certs.server_key), **kwargs)


def tls_client_options(
    certs: TestCertificates, *, client_cert: Path | None = None, client_key: Path | None = None
) -> dict[str, Any]:
    options: dict[str, Any] = {"ca_certs": str(certs.ca_cert)}
    if client_cert is not None:
        options["certfile"] = str(client_cert)
        options["keyfile"] = str(client_key)
    return options


@pytest.fixture
def tls_node(certs: TestCertificates) -> Iterator[RunningNode]:
    with running_node(node_settings(tls=tls_settings(certs), tls_port=0)) as running:
        yield running


@pytest.mark.parametrize("version", [4, 5])
def test_tls_pub_sub(tls_node: RunningNode, certs: TestCertificates, version: int) -> None:
    port = tls_node.port("tls")
    options = tls_client_options(certs)
    sub = Client(port, f"tls-sub-{version}", version=version, tls=options)
    pub = Client(port, f"tls-pub-{version}", version=version, tls=options)
    for qos in (0, 1, 2):
        round_trip(pub, sub, f"tls/{qos}", qos)
    # TLS and plain TCP clients share the node.
    tcp = Client(tls_node.mqtt_port, f"tcp-{version}", version=version)
    round_trip(tcp, sub, "tls/from-tcp")
    round_trip(sub, tcp, "tcp/from-tls")
    for client in (sub, pub, tcp):
        client.disconnect()


def test_tls_large_message(tls_node: RunningNode, certs: TestCertificates) -> None:
    port = tls_node.port("tls")
    options = tls_client_options(certs)
    sub = Client(port, "tls-big-sub", tls=options)
    pub = Client(port, "tls-big-pub", tls=options)
    sub.subscribe("big", 1)
    payload = bytes(range(256)) * 2048  # 512 KiB, many TLS records
    pub.publish("big", payload, 1)
    assert sub.expect(1)[0].payload == payload
    sub.disconnect()
    pub.disconnect()


def test_tls_client_that_does_not_trust_the_server(
    tls_node: RunningNode, other_certs: TestCertificates
) -> None:
    how = refused(tls_node.port("tls"), tls={"ca_certs": str(other_certs.ca_cert)})
    assert "CERTIFICATE_VERIFY_FAILED" in how, how


def test_plain_mqtt_on_the_tls_port_gets_no_connack(tls_node: RunningNode) -> None:
    with socket.create_connection(("127.0.0.1", tls_node.port("tls")), timeout=10) as sock:
        sock.sendall(b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01x")  # a 3.1.1 CONNECT
        data = b""
        deadline = time.monotonic() + 12
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(4096)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            data += chunk
        else:
            raise AssertionError("the TLS listener kept a plain connection open")
    assert not data.startswith(b"\x20"), data


def test_tls_listener_keeps_serving_after_failed_handshakes(
    tls_node: RunningNode, certs: TestCertificates, other_certs: TestCertificates
) -> None:
    for _ in range(5):
        refused(tls_node.port("tls"), tls={"ca_certs": str(other_certs.ca_cert)})
    client = Client(tls_node.port("tls"), "after", tls=tls_client_options(certs))
    round_trip(client, client, "after/failures")
    client.disconnect()


# -- mutual TLS -----------------------------------------------------------------------------------


@pytest.fixture
def mtls_node(certs: TestCertificates) -> Iterator[RunningNode]:
    tls = tls_settings(certs, cafile=str(certs.ca_cert), require_client_cert=True)
    with running_node(node_settings(tls=tls, tls_port=0)) as running:
        yield running


def test_mtls_client_with_certificate(mtls_node: RunningNode, certs: TestCertificates) -> None:
    options = tls_client_options(certs, client_cert=certs.client_cert, client_key=certs.client_key)
    port = mtls_node.port("tls")
    sub = Client(port, "mtls-sub", tls=options)
    pub = Client(port, "mtls-pub", version=4, tls=options)
    round_trip(pub, sub, "mtls/t")
    sub.disconnect()
    pub.disconnect()


def test_mtls_client_without_certificate_is_refused(
    mtls_node: RunningNode, certs: TestCertificates
) -> None:
    how = refused(mtls_node.port("tls"), tls=tls_client_options(certs))
    assert not how.startswith("CONNACK"), how
    # A client with a certificate still gets in afterwards.
    options = tls_client_options(certs, client_cert=certs.client_cert, client_key=certs.client_key)
    client = Client(mtls_node.port("tls"), "mtls-after", tls=options)
    assert client.connack is not None and client.connack.reason_code == 0
    client.disconnect()


def test_mtls_client_with_a_certificate_from_another_ca_is_refused(
    mtls_node: RunningNode, certs: TestCertificates, other_certs: TestCertificates
) -> None:
    options = tls_client_options(
        certs, client_cert=other_certs.client_cert, client_key=other_certs.client_key
    )
    how = refused(mtls_node.port("tls"), tls=options)
    assert not how.startswith("CONNACK"), how


def test_mtls_plain_tcp_listener_is_unaffected(mtls_node: RunningNode) -> None:
    client = Client(mtls_node.mqtt_port, "plain")
    round_trip(client, client, "plain/t")
    client.disconnect()
