"""The dashboard's routes: the page and its static files, driven with ASGI events (no socket)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, cast

import pytest

import mop.admin
from mop.admin.context import AdminContext
from mop.admin.http import AsgiApp, Router, json_response
from mop.admin.routes_page import CONTENT_TYPES, add_page_routes, load_static_files

Answer = tuple[int, list[tuple[str, str]], bytes]


def page_app() -> AsgiApp:
    router = Router()
    # The page's routes read nothing of the node.
    add_page_routes(router, cast(AdminContext, None))

    async def api(_request: Any) -> Any:
        return json_response({"ok": True})

    router.add("GET", "/api/v1/thing", api)
    return AsgiApp(router)


async def call(path: str, method: str = "GET", headers: tuple[tuple[str, str], ...] = ()) -> Answer:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(event: dict[str, Any]) -> None:
        sent.append(event)

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(name.encode(), value.encode()) for name, value in headers],
    }
    await page_app()(scope, receive, send)
    start, body = sent
    pairs = [(name.decode(), value.decode()) for name, value in start["headers"]]
    return start["status"], pairs, body["body"]


def header(answer: Answer, name: str) -> str:
    values = [value for key, value in answer[1] if key == name]
    assert len(values) == 1, f"{name}: {values}"
    return values[0]


def names(answer: Answer) -> list[str]:
    return [key for key, _ in answer[1]]


async def test_page_is_html_kept_by_browsers_only_with_revalidation() -> None:
    answer = await call("/")
    status, _, body = answer
    assert status == 200
    assert header(answer, "content-type") == "text/html; charset=utf-8"
    assert header(answer, "cache-control") == "no-cache"
    assert re.fullmatch(r'"[0-9a-f]{20}"', header(answer, "etag"))
    assert header(answer, "x-content-type-options") == "nosniff"
    policy = header(answer, "content-security-policy")
    assert "default-src 'none'" in policy
    assert "frame-ancestors 'none'" in policy
    assert b'src="static/dashboard.js"' in body


async def test_api_answers_stay_uncached() -> None:
    answer = await call("/api/v1/thing")
    assert answer[0] == 200
    assert header(answer, "cache-control") == "no-store"


async def test_every_file_the_page_names_is_served_with_its_type() -> None:
    _, _, page = await call("/")
    wanted = set(re.findall(rb'(?:href|src)="static/([^"]+)"', page))
    scripts = [name for name in wanted if name.endswith(b".js")]
    for script in scripts:
        _, _, text = await call(f"/static/{script.decode()}")
        wanted |= set(re.findall(rb'from "\./([^"]+)"', text))
    assert {b"dashboard.js", b"dashboard.css", b"icon.svg", b"api.js", b"chart.js"} <= wanted
    for name in sorted(wanted):
        answer = await call(f"/static/{name.decode()}")
        assert answer[0] == 200, name
        suffix = "." + name.decode().rpartition(".")[2]
        assert header(answer, "content-type") == CONTENT_TYPES[suffix]
        assert answer[2]


async def test_unchanged_files_are_304_without_a_body() -> None:
    first = await call("/static/dashboard.css")
    etag = header(first, "etag")
    for condition in (etag, f"W/{etag}", f'"other", {etag}', "*"):
        answer = await call("/static/dashboard.css", headers=(("if-none-match", condition),))
        assert answer[0] == 304, condition
        assert answer[2] == b""
        assert header(answer, "etag") == etag
        assert "content-type" not in names(answer)
    changed = await call("/static/dashboard.css", headers=(("if-none-match", '"other"'),))
    assert changed[0] == 200
    assert changed[2] == first[2]


@pytest.mark.parametrize(
    "path",
    [
        "/static/../routes_page.py",
        "/static/..%2Froutes_page.py",
        "/static/%2e%2e%2Fhttp.py",
        "/static/%2E%2E",
        "/static/",
        "/static/nothing.js",
        "/static/a/dashboard.js",
        "/static/index.html",  # the page lives at / only: its relative links assume so
        "/index.html",
    ],
)
async def test_only_shipped_files_by_their_own_name(path: str) -> None:
    status, headers, body = await call(path)
    assert status == 404
    assert ("content-type", "application/json") in headers
    assert b"error" in body


async def test_head_and_other_methods() -> None:
    full = await call("/")
    head = await call("/", "HEAD")
    assert head[0] == 200
    assert head[2] == b""
    assert header(head, "content-length") == str(len(full[2]))
    status, headers, _ = await call("/", "POST")
    assert status == 405
    assert ("allow", "GET") in headers


def test_no_shipped_file_is_left_out() -> None:
    """A file of a type the routes do not know would be silently missing from the page."""
    shipped = {path.name for path in (Path(mop.admin.__file__).parent / "static").iterdir()}
    assert set(load_static_files()) == shipped


def test_the_files_ship_in_the_package() -> None:
    pyproject = Path(__file__).parents[3] / "pyproject.toml"
    package_data = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-data"]
    assert "admin/static/*" in package_data["mop"]
