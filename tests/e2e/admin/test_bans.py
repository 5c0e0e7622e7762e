"""The admin API's bans with real MQTT clients: a ban disconnects the clients it covers and
keeps them out until it is lifted; bans are the deployment's, as `mop ban` keeps them."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from mop.testing.node import RunningNode
from tests.e2e.admin.api import Api, encoded, eventually
from tests.e2e.clients import Client

pytestmark = [pytest.mark.e2e, pytest.mark.both_modes]

ADMINISTRATIVE_ACTION = 0x98
BANNED = 0x8A


def test_a_ban_keeps_a_client_out_until_it_is_lifted(node: RunningNode) -> None:
    api = Api(node)
    client = Client(node.mqtt_port, "ban-me", version=5)
    now = time.time()
    ban = api.post(
        "/api/v1/bans",
        {"kind": "clientid", "value": "ban-me", "for": 600, "reason": "tests"},
        201,
    )
    assert (ban["kind"], ban["value"], ban["reason"]) == ("clientid", "ban-me", "tests")
    assert now + 590 < ban["until"] < time.time() + 610
    assert client.disconnects.get(timeout=10) == ADMINISTRATIVE_ACTION
    refused = Client(node.mqtt_port, "ban-me", version=5)
    assert refused.connack is not None and refused.connack.reason_code == BANNED
    assert api.get("/api/v1/bans")["items"] == [ban]

    api.delete("/api/v1/bans/clientid/ban-me")
    assert api.get("/api/v1/bans")["total"] == 0
    welcome = Client(node.mqtt_port, "ban-me", version=5)
    assert welcome.connack is not None and welcome.connack.reason_code == 0
    api.delete("/api/v1/bans/clientid/ban-me", 404)
    # No ban can name what is no address: there is none to lift.
    answer = api.delete("/api/v1/bans/address/0", 404)
    assert "neither an IP address nor a CIDR network" in answer.json()["error"]


def test_bans_of_users_and_networks(node: RunningNode) -> None:
    api = Api(node)
    user = Client(node.mqtt_port, "ban-user", version=4, username="mallory")
    ban = api.post("/api/v1/bans", {"kind": "username", "value": "mallory"}, 201)
    assert (ban["until"], ban["reason"]) == (None, "manual")
    assert user.disconnects.get(timeout=10) != 0

    network = api.post("/api/v1/bans", {"kind": "address", "value": "10.1.2.3/8"}, 201)
    assert network["value"] == "10.0.0.0/8"  # as every node reads it
    listed = [(item["kind"], item["value"]) for item in api.get("/api/v1/bans")["items"]]
    assert listed == [("username", "mallory"), ("address", "10.0.0.0/8")]
    api.delete(f"/api/v1/bans/address/{encoded('10.0.0.0/8')}")
    api.delete("/api/v1/bans/username/mallory")
    assert api.get("/api/v1/bans")["total"] == 0


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"kind": "nickname", "value": "x"}, "unknown ban kind"),
        ({"kind": "address", "value": "not-an-ip"}, "neither an IP address"),
        ({"kind": "clientid", "value": ""}, "must not be empty"),
        ({"kind": "clientid", "value": "x", "for": -1}, "positive number of seconds"),
        ({"kind": "clientid", "value": "x", "for": True}, "positive number of seconds"),
        ({"kind": "clientid"}, "must be strings"),
        ({"kind": "clientid", "value": "x", "when": 1}, "unknown fields: when"),
    ],
)
def test_bans_that_are_not_valid_are_refused(
    node: RunningNode, body: dict[str, object], error: str
) -> None:
    assert error in Api(node).post("/api/v1/bans", body, 400)["error"]


def test_a_ban_of_the_address_keeps_the_admin_out_too(node: RunningNode) -> None:
    api = Api(node)
    api.post("/api/v1/bans", {"kind": "address", "value": "127.0.0.1", "for": 1}, 201)
    assert "banned" in api.get("/api/v1/stats", 403)["error"]
    api.get("/healthz")  # public: no credentials checked
    eventually(lambda: api.call("GET", "/api/v1/stats").status == 200)


def _browser_post(node: RunningNode, path: str, body: bytes, headers: dict[str, str]) -> int:
    """A POST as a browser sends it for a page: a form's or a fetch's without preflight."""
    host, port = node.node.address("admin")
    request = urllib.request.Request(
        f"http://{host}:{port}{path}",
        data=body,
        method="POST",
        headers={"content-type": "text/plain", **headers},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def test_pages_of_other_sites_cannot_ban_or_publish(node: RunningNode) -> None:
    """A page of another site the operator visits may post to the API (a form, or a fetch
    of a "simple" request, goes without asking): the browser says where it comes from."""
    api = Api(node)
    host, port = node.node.address("admin")
    ban = json.dumps({"kind": "address", "value": "0.0.0.0/0"}).encode()
    publish = json.dumps({"topic": "site/cmd", "payload": "reboot"}).encode()
    for headers in (
        {"origin": "http://evil.example"},
        {"origin": "null"},
        {"origin": f"http://{host}:{port}", "sec-fetch-site": "cross-site"},
    ):
        assert _browser_post(node, "/api/v1/bans", ban, headers) == 403
        assert _browser_post(node, "/api/v1/publish", publish, headers) == 403
    assert api.get("/api/v1/bans")["total"] == 0
    # The node's own page, and tools that are no browser (curl), are served.
    same = {"origin": f"http://{host}:{port}", "sec-fetch-site": "same-origin"}
    assert _browser_post(node, "/api/v1/publish", publish, same) == 200
    assert _browser_post(node, "/api/v1/publish", publish, {}) == 200
