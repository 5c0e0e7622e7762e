"""Who may use the admin API once authentication is configured: users of the password file
(HTTP Basic) and JWT subjects (Bearer) listed in `admin.roles`; others are refused, and wrong
passwords count against the address like any client's."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest

from mop.security.passwords import update_password_file
from mop.settings import AuthSettings, JwtSettings, Settings
from mop.testing.node import RunningNode, node_settings, running_node
from tests.e2e.admin.api import Api, eventually

pytestmark = [pytest.mark.e2e, pytest.mark.both_modes]

SECRET = "admin-api-test-secret-of-32-bytes!"


def write_passwords(path: Path, users: dict[str, str]) -> str:
    text = ""
    for user, password in users.items():
        text = update_password_file(text, user, password.encode())
    path.write_text(text)
    return str(path)


def secured_settings(tmp_path: Path, **auth: Any) -> Settings:
    return dataclasses.replace(
        node_settings(),
        auth=AuthSettings(
            password_file=write_passwords(tmp_path / "passwords", {"admin": "a1", "bob": "b2"}),
            jwt=JwtSettings(secret=SECRET),
            **auth,
        ),
    )


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[RunningNode]:
    with running_node(secured_settings(tmp_path, max_failures=0)) as node:
        yield node


def token(sub: str) -> str:
    return jwt.encode({"sub": sub, "exp": int(time.time()) + 300}, SECRET, algorithm="HS256")


def test_admins_only(secured: RunningNode) -> None:
    anonymous = Api(secured).call("GET", "/api/v1/stats")
    assert anonymous.status == 401
    assert anonymous.headers["www-authenticate"] == 'Basic realm="mop"'
    assert Api(secured, user=("admin", "wrong")).call("GET", "/api/v1/stats").status == 401
    refused = Api(secured, user=("bob", "b2")).call("GET", "/api/v1/clients")
    assert refused.status == 403
    assert "admin.roles" in refused.json()["error"]
    admin = Api(secured, user=("admin", "a1"))
    assert admin.get("/api/v1/stats")["connections"] == 0
    assert admin.get("/api/v1/log-level")["level"]


def test_bearer_tokens(secured: RunningNode) -> None:
    assert Api(secured, token=token("admin")).get("/api/v1/clients")["total"] == 0
    assert Api(secured, token=token("bob")).call("GET", "/api/v1/clients").status == 403
    assert Api(secured, token="not.a.token").call("GET", "/api/v1/clients").status == 401


def test_public_routes_need_no_credentials(secured: RunningNode) -> None:
    api = Api(secured)
    for path in ("/healthz", "/readyz", "/metrics", "/api/v1/openapi.yaml"):
        assert api.call("GET", path).status == 200, path
    api.headers["authorization"] = "Digest username=admin"
    assert api.call("GET", "/api/v1/node").status == 401


def test_failed_logins_block_the_address_for_a_while(tmp_path: Path) -> None:
    settings = secured_settings(tmp_path, max_failures=3, failure_window=60, failure_ban=1)
    with running_node(settings) as node:
        wrong = Api(node, user=("admin", "guess"))
        for _ in range(3):
            assert wrong.call("GET", "/api/v1/stats").status == 401
        admin = Api(node, user=("admin", "a1"))
        assert "too many failed logins" in admin.get("/api/v1/stats", 403)["error"]
        eventually(lambda: admin.call("GET", "/api/v1/stats").status == 200)
