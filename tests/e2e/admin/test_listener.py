"""The admin HTTP listener of a running node: health, readiness, node information and the
Prometheus scrape endpoint, over real HTTP."""

from __future__ import annotations

import dataclasses
import http.client
import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from mop.node import StartupError, open_node
from mop.settings import AdminSettings
from mop.testing.metrics import scrape_metrics
from mop.testing.node import RunningNode, node_settings, running_node
from tests.e2e.clients import Client

pytestmark = [pytest.mark.e2e, pytest.mark.both_modes]


def get(node: RunningNode, path: str, *, host_header: str | None = None) -> tuple[int, str, bytes]:
    host, port = node.node.address("admin")
    request = urllib.request.Request(f"http://{host}:{port}{path}")
    if host_header is not None:
        request.add_header("Host", host_header)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.headers["content-type"], answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["content-type"], error.read()


def get_json(node: RunningNode, path: str) -> Any:
    status, content_type, body = get(node, path)
    assert status == 200, body
    assert content_type == "application/json"
    return json.loads(body)


def test_health_and_readiness(node: RunningNode) -> None:
    assert get_json(node, "/healthz") == {"status": "ok"}
    assert get_json(node, "/readyz") == {"status": "ready"}


def test_node_information_names_the_listeners(node: RunningNode, mode: str) -> None:
    info = get_json(node, "/api/v1/node")
    assert info["mode"] == mode
    assert info["protocols"] == ["mqtt"]
    assert info["uptime"] >= 0
    mqtt_port = node.mqtt_port
    admin_port = node.node.address("admin")[1]
    listeners = {(item["protocol"], item["kind"], item["port"]) for item in info["listeners"]}
    assert ("mqtt", "tcp", mqtt_port) in listeners
    assert ("admin", "tcp", admin_port) in listeners


def test_metrics_follow_real_clients(node: RunningNode) -> None:
    client = Client(node.mqtt_port, "metrics-1")
    client.subscribe("metrics/#", qos=1)
    assert client.publish("metrics/a", b"hello", qos=1) == 0
    client.expect(1)
    page = scrape_metrics(*node.node.address("admin"))
    assert page.matching("mop_connections_active") == [({"protocol": "mqtt"}, 1.0)]
    assert page.value("mop_messages_total", protocol="mqtt", direction="in") >= 1
    assert page.value("mop_messages_total", protocol="mqtt", direction="out") >= 1


def test_a_connection_its_client_closes_is_closed_at_once(node: RunningNode) -> None:
    """A client that closes its kept-alive connection once answered gets it closed by the node
    at once, not when the keep-alive timeout runs out: held, each such connection would keep a
    file descriptor of the node's process (which its MQTT listeners share) for that long."""
    host, port = node.node.address("admin")
    connection = http.client.HTTPConnection(host, port, timeout=10)
    try:
        connection.request("GET", "/healthz")
        answer = connection.getresponse()
        assert answer.status == 200 and not answer.will_close
        answer.read()
        sock = connection.sock
        assert sock is not None
        # Time for the node to wait for the next request, the state in which it used to miss
        # that the client had gone.
        time.sleep(0.3)
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(5)
        assert sock.recv(1) == b"", "the node sent more than its answer"
    finally:
        connection.close()


def test_unknown_path_is_a_json_404(node: RunningNode) -> None:
    status, content_type, body = get(node, "/api/v1/nothing")
    assert status == 404
    assert content_type == "application/json"
    assert "no such resource" in json.loads(body)["error"]


@pytest.mark.merged_only(reason="about the admin listener alone, the same in both modes")
def test_a_loopback_listener_answers_loopback_hosts_only(node: RunningNode) -> None:
    """DNS rebinding: a page whose host name now points at 127.0.0.1 sends its own name."""
    port = node.node.address("admin")[1]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
        assert get(node, "/api/v1/node", host_header=host)[0] == 200, host
    for path in ("/api/v1/node", "/metrics", "/", "/api/v1/openapi.yaml", "/api/v1/nothing"):
        status, content_type, body = get(node, path, host_header=f"rebound.example:{port}")
        assert (status, content_type) == (421, "application/json"), path
        assert "admin.allowed_hosts" in json.loads(body)["error"]
    # Load balancers ask for health with any host.
    for path in ("/healthz", "/readyz"):
        assert get(node, path, host_header="lb-probe")[0] == 200, path


@pytest.mark.merged_only(reason="about the admin listener alone, the same in both modes")
def test_allowed_hosts_name_the_hosts_answered() -> None:
    admin = AdminSettings(port=0, allowed_hosts=("mop.example",))
    with running_node(dataclasses.replace(node_settings(), admin=admin)) as running:
        assert get(running, "/api/v1/node", host_header="mop.example:8080")[0] == 200
        assert get(running, "/api/v1/node", host_header="localhost")[0] == 421


@pytest.mark.merged_only(reason="about the node's own startup, the same in both modes")
async def test_admin_port_in_use_stops_the_node_with_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = dataclasses.replace(node_settings(), admin=AdminSettings(port=port))
        with pytest.raises(StartupError, match=rf"admin 127\.0\.0\.1:{port}: .*in use"):
            async with open_node(settings):
                pass


@pytest.mark.merged_only(reason="about the node's own startup, the same in both modes")
def test_admin_can_be_turned_off() -> None:
    settings = dataclasses.replace(node_settings(), admin=AdminSettings(enabled=False))
    with running_node(settings) as running, pytest.raises(LookupError):
        running.node.address("admin")
