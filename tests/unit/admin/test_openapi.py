"""`mop/admin/openapi.yaml` is a valid OpenAPI 3.1 document, ships in the package, and matches
the routes the admin application has: each documented, each documented path served (but those
of work that lands in its own time), public exactly where the document needs no credentials."""

from __future__ import annotations

import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from openapi_spec_validator import validate

from mop.admin import AdminContext, build_admin_app
from mop.membership import Membership
from mop.settings import Settings
from tests.openapi import check_response, document, template_of

# Documented in openapi.yaml, served by routes of other modules still on their way: none now.
DOCUMENTED_AHEAD: set[tuple[str, str]] = set()


def routes() -> list[tuple[str, str, bool]]:
    # Adding routes only keeps the context for later: a stand-in with settings will do, and a
    # broker's membership, so that the routes of Pulsar's admin API are there too.
    context = cast(
        AdminContext,
        SimpleNamespace(
            settings=Settings(),
            processor=None,
            broker=Membership((), "pulsar://127.0.0.1:6650"),
            # A node with its own broker: the retention and backlog quota routes too.
            retention=object(),
            backlog_quotas=object(),
        ),
    )
    return build_admin_app(context).router.routes()


def operations() -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method.upper(), template): operation
        for template, item in document()["paths"].items()
        for method, operation in item.items()
        if method in ("get", "put", "post", "delete", "patch")
    }


def test_the_document_is_valid_openapi_3_1() -> None:
    assert document()["openapi"].startswith("3.1")
    validate(document())


def test_every_route_is_documented_as_public_or_not() -> None:
    documented = operations()
    for method, template, public in routes():
        operation = documented.get((method, template))
        assert operation is not None, f"{method} {template} is not in openapi.yaml"
        assert (operation.get("security") == []) == public, f"{method} {template}: security"


def test_every_documented_operation_is_served() -> None:
    served = {(method, template) for method, template, _ in routes()}
    missing = set(operations()) - served - DOCUMENTED_AHEAD
    assert not missing, f"documented but not served: {sorted(missing)}"


def test_paths_fall_under_their_templates() -> None:
    assert template_of("/api/v1/retained/a%2Fb") == "/api/v1/retained/{topic}"
    assert template_of("/api/v1/openapi.yaml") == "/api/v1/openapi.yaml"
    assert template_of("/api/v1/bans/address/10.0.0.0%2F8") == "/api/v1/bans/{kind}/{value}"
    assert template_of("/api/v1/nothing") is None


def test_answers_are_checked_against_the_schemas() -> None:
    check_response("GET", "/api/v1/clients/x", 404, {"error": "not connected"})
    check_response(
        "GET",
        "/api/v1/retained",
        200,
        {"items": [], "total": 0, "offset": 0, "limit": 100},
    )
    for wrong in ({"errors": "typo"}, {"error": 1}):
        try:
            check_response("GET", "/api/v1/clients/x", 404, wrong)
        except Exception as exc:
            assert "ValidationError" in type(exc).__name__
        else:
            raise AssertionError(f"{wrong} passed")


def test_the_document_ships_in_the_package() -> None:
    pyproject = Path(__file__).parents[3] / "pyproject.toml"
    package_data = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-data"]
    assert "admin/openapi.yaml" in package_data["mop"]
