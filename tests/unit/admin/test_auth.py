"""The admin API's guard: credentials read from `Authorization`, checked by the processor, and
the answer it gives (401 with a challenge, 403) for each outcome."""

from __future__ import annotations

import base64
import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest

from mop.admin.auth import CHALLENGE, AdminGuard, credentials_of
from mop.admin.http import HttpError, Request
from mop.security.identity import (
    ANONYMOUS,
    AuthenticationError,
    AuthFailure,
    Credentials,
    Principal,
)
from mop.settings import AuthSettings, Settings


def request(
    authorization: str | None = None,
    client: str = "10.1.2.3:5555",
    path: str = "/api/v1/stats",
) -> Request:
    headers = {} if authorization is None else {"authorization": authorization}
    return Request("GET", path, {}, headers, b"", client=client)


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_credentials_of_each_scheme() -> None:
    assert credentials_of(request()) == Credentials(address="10.1.2.3")
    assert credentials_of(request(basic("ann", "p:w"))) == Credentials(
        address="10.1.2.3", username="ann", password=b"p:w"
    )
    assert credentials_of(request("Bearer a.b.c")).token == "a.b.c"
    assert credentials_of(request("bearer a.b.c", client="::1:80")).address == "::1"


@pytest.mark.parametrize("header", ["Digest x", "Basic !!!", "Basic " + "bm9jb2xvbg==", "Bearer"])
def test_headers_that_are_no_credentials_are_401(header: str) -> None:
    with pytest.raises(HttpError) as caught:
        credentials_of(request(header))
    assert caught.value.status == 401
    assert caught.value.headers == CHALLENGE


def guard(outcome: Principal | AuthFailure, **auth: Any) -> tuple[AdminGuard, list[Credentials]]:
    seen: list[Credentials] = []

    def authenticate(credentials: Credentials) -> Principal:
        seen.append(credentials)
        if isinstance(outcome, AuthFailure):
            raise AuthenticationError(outcome, "no")
        return outcome

    settings = dataclasses.replace(Settings(), auth=AuthSettings(**auth))
    return AdminGuard(settings, SimpleNamespace(authenticate=authenticate)), seen  # type: ignore[arg-type]


def status(admin: AdminGuard, authorization: str | None = None, path: str = "/api/v1/x") -> int:
    try:
        admin(request(authorization, path=path))
    except HttpError as exc:
        return exc.status
    return 200


def test_without_authentication_configured_only_bans_apply() -> None:
    open_guard, seen = guard(ANONYMOUS)
    assert status(open_guard) == 200
    assert seen == [Credentials(address="10.1.2.3")]
    assert status(guard(AuthFailure.BANNED)[0]) == 403


def test_with_authentication_configured_admins_only() -> None:
    admin = Principal("admin", "password_file")
    assert status(guard(admin, password_file="p")[0], basic("admin", "x")) == 200
    assert status(guard(Principal("bob", "jwt"), password_file="p")[0], "Bearer t") == 403
    assert status(guard(ANONYMOUS, password_file="p")[0]) == 401
    assert status(guard(AuthFailure.BAD_CREDENTIALS, password_file="p")[0], "Bearer t") == 401
    assert status(guard(AuthFailure.EXPIRED, allow_anonymous=False)[0], "Bearer t") == 401
    assert status(guard(AuthFailure.BANNED, allow_anonymous=False)[0], "Bearer t") == 403


def test_proxies_may_ask_the_pulsar_admin_api_only() -> None:
    proxy = Principal("proxy-1", "jwt", is_proxy=True)
    admin, _ = guard(proxy, allow_anonymous=False)
    assert status(admin, "Bearer t", "/admin/v2/persistent/public/default") == 200
    assert status(admin, "Bearer t", "/api/v1/clients") == 403
    user, _ = guard(Principal("bob", "jwt"), allow_anonymous=False)
    assert status(user, "Bearer t", "/admin/v2/persistent/public/default") == 403
