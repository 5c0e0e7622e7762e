"""The admin API's router and ASGI application, driven with ASGI events (no socket)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from mop.admin.http import MAX_BODY, AsgiApp, HttpError, Request, Response, Router, json_response


async def call(
    app: AsgiApp,
    method: str,
    path: str,
    *,
    query: bytes = b"",
    body: bytes = b"",
    chunk: int | None = None,
    host: bytes = b"127.0.0.1",
) -> tuple[int, dict[str, str], bytes]:
    """Send one request through `app` as an ASGI server would: the raw path percent-encoded,
    the body in chunks."""
    pieces = [body[i : i + chunk] for i in range(0, len(body), chunk)] if chunk else [body]
    events = [
        {"type": "http.request", "body": piece, "more_body": i < len(pieces) - 1}
        for i, piece in enumerate(pieces)
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return events.pop(0) if events else {"type": "http.disconnect"}

    async def send(event: dict[str, Any]) -> None:
        sent.append(event)

    scope = {
        "type": "http",
        "method": method,
        "path": path.replace("%2F", "/"),  # what a server decodes
        "raw_path": path.encode(),
        "query_string": query,
        "headers": [(b"host", host)],
        "client": ("127.0.0.1", 50000),
    }
    await app(scope, receive, send)
    start, body_event = sent
    headers = {name.decode(): value.decode() for name, value in start["headers"]}
    return start["status"], headers, body_event["body"]


def echo_app(guard: Any = None, hosts: Any = None) -> AsgiApp:
    router = Router()

    async def echo(request: Request) -> Response:
        return json_response(
            {"params": dict(request.params), "limit": request.int_arg("limit", 10, high=100)}
        )

    async def body(request: Request) -> Response:
        return json_response({"got": request.json()}, 201)

    async def fails(_request: Request) -> Response:
        raise RuntimeError("boom")

    router.add("GET", "/items/{name}", echo)
    router.add("POST", "/items", body)
    router.add("GET", "/public", echo, public=True)
    router.add("GET", "/fails", fails)
    router.add("GET", "/health", echo, public=True, any_host=True)
    return AsgiApp(router, guard, hosts=hosts)


async def test_path_parameters_are_matched_encoded_and_decoded_after() -> None:
    status, headers, body = await call(echo_app(), "GET", "/items/a%2Fb%20c")
    assert status == 200
    assert headers["content-type"] == "application/json"
    assert json.loads(body) == {"params": {"name": "a/b c"}, "limit": 10}


async def test_unknown_path_is_404_and_wrong_method_405_with_allow() -> None:
    status, _, body = await call(echo_app(), "GET", "/nothing")
    assert status == 404
    assert "no such resource" in json.loads(body)["error"]
    status, headers, _ = await call(echo_app(), "DELETE", "/items/x")
    assert status == 405
    assert headers["allow"] == "GET"


async def test_head_answers_like_get_without_a_body() -> None:
    status, headers, body = await call(echo_app(), "HEAD", "/items/x")
    assert status == 200
    assert body == b""
    assert int(headers["content-length"]) > 0


@pytest.mark.parametrize(
    ("query", "problem"),
    [(b"limit=abc", "limit must be an integer"), (b"limit=1000", "between 0 and 100")],
)
async def test_bad_query_arguments_are_400(query: bytes, problem: str) -> None:
    status, _, body = await call(echo_app(), "GET", "/items/x", query=query)
    assert status == 400
    assert problem in json.loads(body)["error"]


async def test_an_empty_query_argument_is_not_an_absent_one() -> None:
    status, _, body = await call(echo_app(), "GET", "/items/x", query=b"limit=")
    assert status == 400
    assert "limit must be an integer" in json.loads(body)["error"]


async def test_query_arguments_are_decoded_as_utf8() -> None:
    router = Router()

    async def args(request: Request) -> Response:
        return json_response(dict(request.query))

    router.add("GET", "/args", args)
    # A raw (not percent-encoded) UTF-8 byte sequence is taken as it is too.
    query = b"q=caf%C3%A9+au+lait&q=&flag&name=" + "é".encode()
    status, _, body = await call(AsgiApp(router), "GET", "/args", query=query)
    assert status == 200
    assert json.loads(body) == {"q": ["café au lait", ""], "flag": [""], "name": ["é"]}
    status, _, body = await call(AsgiApp(router), "GET", "/args", query=b"q=%FF")
    assert status == 400
    assert "not UTF-8" in json.loads(body)["error"]


@pytest.mark.parametrize("segment", ["%FF", "a%C3", "%ED%A0%80"])
async def test_a_path_parameter_that_is_not_utf8_is_400(segment: str) -> None:
    status, _, body = await call(echo_app(), "GET", f"/items/{segment}")
    assert status == 400
    assert "not UTF-8" in json.loads(body)["error"]
    status, _, body = await call(echo_app(), "GET", "/items/caf%C3%A9")
    assert (status, json.loads(body)["params"]) == (200, {"name": "café"})


async def test_the_host_guard_refuses_every_route_but_those_for_any_host() -> None:
    def hosts(headers: Any) -> None:
        if headers.get("host") != "127.0.0.1":
            raise HttpError(421, "wrong host")

    app = echo_app(hosts=hosts)
    assert (await call(app, "GET", "/items/x"))[0] == 200
    for path in ("/items/x", "/public", "/nothing", "/items/%FF"):
        status, _, body = await call(app, "GET", path, host=b"evil.example")
        assert (status, json.loads(body)) == (421, {"error": "wrong host"}), path
    assert (await call(app, "GET", "/health", host=b"evil.example"))[0] == 200


async def test_json_body_in_chunks() -> None:
    status, _, body = await call(echo_app(), "POST", "/items", body=b'{"a": [1, 2]}', chunk=3)
    assert status == 201
    assert json.loads(body) == {"got": {"a": [1, 2]}}


@pytest.mark.parametrize(
    ("body", "status"),
    [(b"", 400), (b"{nope", 400), (b"[" * 100_000, 400), (b"x" * (MAX_BODY + 1), 413)],
)
async def test_missing_broken_or_huge_bodies_are_refused(body: bytes, status: int) -> None:
    answer, _, text = await call(echo_app(), "POST", "/items", body=body, chunk=65536)
    assert answer == status
    assert json.loads(text)["error"]


async def test_handler_failure_is_500_without_details() -> None:
    status, _, body = await call(echo_app(), "GET", "/fails")
    assert status == 500
    assert "boom" not in body.decode()


async def test_guard_refuses_private_routes_only() -> None:
    def guard(request: Request) -> None:
        raise HttpError(401, "credentials required", (("www-authenticate", 'Basic realm="x"'),))

    app = echo_app(guard)
    status, headers, _ = await call(app, "GET", "/items/x")
    assert status == 401
    assert headers["www-authenticate"] == 'Basic realm="x"'
    status, _, _ = await call(app, "GET", "/public")
    assert status == 200


async def test_a_body_that_stops_arriving_is_408_and_closes_the_connection() -> None:
    router = Router()

    async def body(request: Request) -> Response:
        return json_response({"got": request.json()}, 201)

    router.add("POST", "/items", body)
    app = AsgiApp(router, body_timeout=0.2)
    events: list[dict[str, Any]] = [{"type": "http.request", "body": b"{", "more_body": True}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if events:
            return events.pop(0)
        await trio.sleep_forever()
        raise AssertionError

    async def send(event: dict[str, Any]) -> None:
        sent.append(event)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/items",
        "raw_path": b"/items",
        "query_string": b"",
        "headers": [],
        "client": ("127.0.0.1", 50000),
    }
    with trio.fail_after(5):
        await app(scope, receive, send)
    start, _ = sent
    assert start["status"] == 408
    assert (b"connection", b"close") in start["headers"]


async def test_a_204_has_no_content_length_or_type() -> None:
    router = Router()

    async def gone(_request: Request) -> Response:
        return Response(204)

    router.add("DELETE", "/items/{name}", gone)
    status, headers, body = await call(AsgiApp(router), "DELETE", "/items/x")
    assert (status, body) == (204, b"")
    assert "content-length" not in headers and "content-type" not in headers
