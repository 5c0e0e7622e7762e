"""A small ASGI application: requests matched to handlers by method and path template.

Only what the admin API needs: JSON in and out, path parameters (`/clients/{client_id}`),
query parameters, a bounded body, and errors as `{"error": "..."}` with the right status.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import parse_qs, unquote

log = logging.getLogger("mop.admin")

# Larger bodies are refused with 413; the API takes small JSON documents only.
MAX_BODY: Final = 1024 * 1024
JSON_TYPE: Final = "application/json"


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    query: Mapping[str, list[str]]
    headers: Mapping[str, str]  # lower-case names
    body: bytes
    params: Mapping[str, str] = field(default_factory=dict)
    client: str = ""

    def arg(self, name: str, default: str | None = None) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else default

    def int_arg(self, name: str, default: int, *, low: int = 0, high: int | None = None) -> int:
        raw = self.arg(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise HttpError(400, f"{name} must be an integer") from None
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f">= {low}"
            raise HttpError(400, f"{name} must be {bound}")
        return value

    def json(self) -> Any:
        if not self.body:
            raise HttpError(400, "a JSON body is required")
        try:
            return json.loads(self.body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise HttpError(400, f"the body is not JSON: {exc}") from None


@dataclass(frozen=True, slots=True)
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = JSON_TYPE
    headers: tuple[tuple[str, str], ...] = ()


def json_response(value: Any, status: int = 200) -> Response:
    return Response(status, json.dumps(value, separators=(",", ":")).encode())


class HttpError(Exception):
    """Answered as `{"error": message}` with `status`."""

    def __init__(self, status: int, message: str, headers: tuple[tuple[str, str], ...] = ()):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


Handler = Callable[[Request], Awaitable[Response]]
# Checks a request before its handler runs (authentication); raises HttpError to refuse it.
Guard = Callable[[Request], None]


@dataclass(frozen=True, slots=True)
class _Route:
    method: str
    template: str
    pattern: re.Pattern[str]
    handler: Handler
    public: bool


_PARAM = re.compile(r"\{(\w+)\}")


class Router:
    def __init__(self) -> None:
        self._routes: list[_Route] = []

    def add(self, method: str, template: str, handler: Handler, *, public: bool = False) -> None:
        """Route `method template` to `handler`. `{name}` in the template matches one path
        segment, percent-encoded (`a%2Fb` for the topic `a/b`), decoded into
        `request.params[name]`; a `public` route skips the guard (health checks, the page's
        static files)."""
        parts = _PARAM.split(template)  # literal, name, literal, name, ..., literal
        regex = "".join(
            f"(?P<{part}>[^/]+)" if i % 2 else re.escape(part) for i, part in enumerate(parts)
        )
        self._routes.append(_Route(method, template, re.compile(f"^{regex}$"), handler, public))

    def routes(self) -> list[tuple[str, str, bool]]:
        """(method, template, public) of every route, in the order they were added."""
        return [(route.method, route.template, route.public) for route in self._routes]

    def match(self, method: str, path: str) -> tuple[_Route, dict[str, str]]:
        allowed: list[str] = []
        for route in self._routes:
            found = route.pattern.match(path)
            if found is None:
                continue
            if route.method != method and not (method == "HEAD" and route.method == "GET"):
                allowed.append(route.method)
                continue
            return route, {name: unquote(value) for name, value in found.groupdict().items()}
        if allowed:
            raise HttpError(405, f"{method} is not allowed here", (("allow", ", ".join(allowed)),))
        raise HttpError(404, f"no such resource: {path}")


Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class AsgiApp:
    """The router as an ASGI 3 application (what hypercorn serves)."""

    def __init__(self, router: Router, guard: Guard | None = None) -> None:
        self.router = router
        self._guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # no WebSocket routes
        response = await self._respond(scope, receive)
        headers = [(name.encode(), value.encode()) for name, value in response.headers]
        if response.status != 304:  # a 304 describes the stored response; it has no body
            headers.append((b"content-type", response.content_type.encode()))
            headers.append((b"content-length", str(len(response.body)).encode()))
        # API answers are never cached; a route may decide otherwise (the dashboard's files).
        if not any(name.lower() == "cache-control" for name, _ in response.headers):
            headers.append((b"cache-control", b"no-store"))
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        body = b"" if scope["method"] == "HEAD" else response.body
        await send({"type": "http.response.body", "body": body})

    async def _respond(self, scope: Scope, receive: Receive) -> Response:
        method: str = scope["method"]
        # Matched still percent-encoded, so that a parameter may hold "/" as %2F (MQTT topic
        # names in `/api/v1/retained/{topic}`); parameters are decoded after matching.
        raw_path: bytes | None = scope.get("raw_path")
        path: str = raw_path.decode("latin-1").partition("?")[0] if raw_path else scope["path"]
        try:
            route, params = self.router.match(method, path)
            body = await _read_body(receive)
            client = scope.get("client")
            request = Request(
                method=method,
                path=path,
                query=parse_qs(scope.get("query_string", b"").decode("latin-1")),
                headers={
                    name.decode("latin-1").lower(): value.decode("latin-1")
                    for name, value in scope.get("headers", ())
                },
                body=body,
                params=params,
                client=f"{client[0]}:{client[1]}" if client else "",
            )
            if not route.public and self._guard is not None:
                self._guard(request)
            return await route.handler(request)
        except HttpError as exc:
            response = json_response({"error": exc.message}, exc.status)
            return Response(response.status, response.body, headers=exc.headers)
        except Exception:
            log.exception("admin API: %s %s failed", method, path)
            return json_response({"error": "internal error (logged by the node)"}, 500)


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        event = await receive()
        if event["type"] == "http.disconnect":
            break
        chunk = event.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise HttpError(413, f"the body is larger than {MAX_BODY} bytes")
        chunks.append(chunk)
        if not event.get("more_body", False):
            break
    return b"".join(chunks)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        event = await receive()
        if event["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif event["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
