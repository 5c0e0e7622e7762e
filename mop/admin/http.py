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
from urllib.parse import unquote_to_bytes

import trio

log = logging.getLogger("mop.admin")

# Larger bodies are refused with 413; the API takes small JSON documents only.
MAX_BODY: Final = 1024 * 1024
# Seconds a client has to send a request's body: one that stops sending part-way through would
# otherwise hold its connection open for as long as it likes (hypercorn bounds only the head).
BODY_TIMEOUT: Final = 30.0
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
        except RecursionError:
            raise HttpError(400, "the body is not JSON: nested too deeply") from None


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
# Checks the `Host` a request names (lower-case header names); raises HttpError to refuse it.
HostCheck = Callable[[Mapping[str, str]], None]


@dataclass(frozen=True, slots=True)
class _Route:
    method: str
    template: str
    pattern: re.Pattern[str]
    handler: Handler
    public: bool
    any_host: bool


_PARAM = re.compile(r"\{(\w+)\}")


class Router:
    def __init__(self) -> None:
        self._routes: list[_Route] = []

    def add(
        self,
        method: str,
        template: str,
        handler: Handler,
        *,
        public: bool = False,
        any_host: bool = False,
    ) -> None:
        """Route `method template` to `handler`. `{name}` in the template matches one path
        segment, percent-encoded UTF-8 (`a%2Fb` for the topic `a/b`), decoded into
        `request.params[name]`; a `public` route skips the guard (health checks, the page's
        static files), an `any_host` route the check of the `Host` header (health checks,
        which load balancers send with whatever host they like)."""
        parts = _PARAM.split(template)  # literal, name, literal, name, ..., literal
        regex = "".join(
            f"(?P<{part}>[^/]+)" if i % 2 else re.escape(part) for i, part in enumerate(parts)
        )
        pattern = re.compile(f"^{regex}$")
        self._routes.append(_Route(method, template, pattern, handler, public, any_host))

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
            return route, {name: _decoded(name, value) for name, value in found.groupdict().items()}
        if allowed:
            raise HttpError(405, f"{method} is not allowed here", (("allow", ", ".join(allowed)),))
        raise HttpError(404, f"no such resource: {path}")


def _decoded(name: str, value: str) -> str:
    """A path parameter as matched (percent-encoded, each character one byte of the path)
    decoded: HttpError 400 when its bytes are not UTF-8, rather than a U+FFFD in their place
    (a client id or topic that is not the one asked for)."""
    try:
        return unquote_to_bytes(value.encode("latin-1")).decode("utf-8")
    except UnicodeError:
        raise HttpError(
            400, f"the path parameter {name} is not UTF-8 once percent-decoded"
        ) from None


def parse_query(raw: bytes) -> dict[str, list[str]]:
    """The arguments of a query string (`a=1&b=&a=2`: `{"a": ["1", "2"], "b": [""]}`), an
    empty value kept as such (`?offset=` is not an absent offset but a wrong one). HttpError
    400 when a name or value is not UTF-8 once percent-decoded."""
    query: dict[str, list[str]] = {}
    for pair in raw.split(b"&"):
        if not pair:
            continue
        name, _, value = pair.partition(b"=")
        try:
            key, text = (
                unquote_to_bytes(part.replace(b"+", b" ")).decode("utf-8") for part in (name, value)
            )
        except UnicodeError:
            raise HttpError(400, "the query string is not UTF-8 once percent-decoded") from None
        query.setdefault(key, []).append(text)
    return query


Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class AsgiApp:
    """The router as an ASGI 3 application (what hypercorn serves)."""

    def __init__(
        self,
        router: Router,
        guard: Guard | None = None,
        *,
        hosts: HostCheck | None = None,
        body_timeout: float = BODY_TIMEOUT,
    ) -> None:
        self.router = router
        self._guard = guard
        self._hosts = hosts
        self._body_timeout = body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # no WebSocket routes
        response = await self._respond(scope, receive)
        headers = [(name.encode(), value.encode()) for name, value in response.headers]
        # A 304 describes the stored response and a 204 has no body: neither says a length.
        if response.status not in (204, 304):
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
        # names in `/api/v1/retained/{topic}`); parameters are decoded after matching, from
        # their bytes (each character of `path` is one byte of the request's path).
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
        path: str = raw_path.decode("latin-1").partition("?")[0]
        headers = {
            name.decode("latin-1").lower(): value.decode("latin-1")
            for name, value in scope.get("headers", ())
        }
        try:
            route, params = self._match(method, path, headers)
            body: bytes | None = None
            with trio.move_on_after(self._body_timeout):
                body = await _read_body(receive)
            if body is None:
                raise HttpError(408, "the request's body did not arrive in time", _CLOSE)
            client = scope.get("client")
            request = Request(
                method=method,
                path=path,
                query=parse_query(scope.get("query_string", b"")),
                headers=headers,
                body=body,
                params=params,
                client=f"{client[0]}:{client[1]}" if client else "",
            )
            if method not in _SAFE_METHODS and _from_another_site(request.headers):
                raise HttpError(403, "refused: a request of a page of another site")
            if not route.public and self._guard is not None:
                self._guard(request)
            return await route.handler(request)
        except HttpError as exc:
            response = json_response({"error": exc.message}, exc.status)
            return Response(response.status, response.body, headers=exc.headers)
        except Exception:
            log.exception("admin API: %s %s failed", method, path)
            return json_response({"error": "internal error (logged by the node)"}, 500)

    def _match(
        self, method: str, path: str, headers: Mapping[str, str]
    ) -> tuple[_Route, dict[str, str]]:
        """The route and parameters of a request whose `Host` may be answered: the host guard
        refuses any other, whether or not the path names something, unless the route takes
        any host."""
        try:
            route, params = self.router.match(method, path)
        except HttpError:
            if self._hosts is not None:
                self._hosts(headers)
            raise
        if self._hosts is not None and not route.any_host:
            self._hosts(headers)
        return route, params


_CLOSE: Final = (("connection", "close"),)
_SAFE_METHODS: Final = frozenset({"GET", "HEAD"})


def _from_another_site(headers: Mapping[str, str]) -> bool:
    """Whether a browser sends the request for a page of another origin. Such a page may post
    a form or a "simple" fetch without asking (no CORS preflight), and the browser adds the
    user's cached credentials: without this check any site the operator visits could ban or
    publish. Browsers say where a request comes from (`Sec-Fetch-Site`, else `Origin`); tools
    that are not browsers send neither and are served."""
    site = headers.get("sec-fetch-site")
    if site is not None:
        return site not in ("same-origin", "none")
    origin = headers.get("origin")
    if origin is None:
        return False
    scheme, separator, authority = origin.partition("://")
    host = headers.get("host", "")
    return not separator or scheme not in ("http", "https") or authority.lower() != host.lower()


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
