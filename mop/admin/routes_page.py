"""The dashboard: one HTML page and its scripts and styles, shipped in `mop/admin/static/`.

The page only reads the JSON API, so it is public: when the API asks for credentials (401 with
`WWW-Authenticate: Basic`), the browser prompts and sends them with the page's own requests.

Files are read once, when the routes are added, and served from memory by name: a name that is
not one of the shipped files (`..`, `a/b`, anything percent-encoded into a path) is a 404, so no
request reaches the file system. Caching is `no-cache` with an ETag: a browser keeps the files
but asks every time, and gets a bodiless 304 while they are unchanged, so a page opened after an
upgrade never runs stale scripts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Final

from mop.admin.context import AdminContext
from mop.admin.http import HttpError, Request, Response, Router

INDEX: Final = "index.html"

CONTENT_TYPES: Final[Mapping[str, str]] = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}

# Everything the page loads comes from this origin; its scripts may only call the API here, and
# no other site may frame it (a framed page could be tricked into a click on a kick button).
CONTENT_SECURITY_POLICY: Final = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)


@dataclass(frozen=True, slots=True)
class StaticFile:
    body: bytes
    content_type: str
    etag: str


def load_static_files() -> dict[str, StaticFile]:
    """The shipped files by name (those with a known content type), read from the package."""
    files: dict[str, StaticFile] = {}
    for entry in resources.files("mop.admin").joinpath("static").iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if not entry.is_file() or suffix not in CONTENT_TYPES:
            continue
        body = entry.read_bytes()
        etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
        files[entry.name] = StaticFile(body, CONTENT_TYPES[suffix], etag)
    return files


def add_page_routes(router: Router, context: AdminContext) -> None:
    """`GET /`: the dashboard page; `GET /static/{file}`: its scripts, styles and icon. The
    page needs nothing of `context`: everything it shows comes from the API."""
    files = load_static_files()
    if INDEX not in files:
        raise RuntimeError(f"mop/admin/static/{INDEX} is missing from the installed package")
    index = files.pop(INDEX)

    async def page(request: Request) -> Response:
        return _serve(request, index)

    async def static(request: Request) -> Response:
        name = request.params["file"]
        found = files.get(name)
        if found is None:
            raise HttpError(404, f"no such file: {name}")
        return _serve(request, found)

    router.add("GET", "/", page, public=True)
    router.add("GET", "/static/{file}", static, public=True)


def _serve(request: Request, file: StaticFile) -> Response:
    headers = (
        ("etag", file.etag),
        ("cache-control", "no-cache"),
        ("x-content-type-options", "nosniff"),
        ("content-security-policy", CONTENT_SECURITY_POLICY),
        ("referrer-policy", "no-referrer"),
    )
    if _matches(request.headers.get("if-none-match", ""), file.etag):
        return Response(304, b"", file.content_type, headers)
    return Response(200, file.body, file.content_type, headers)


def _matches(if_none_match: str, etag: str) -> bool:
    """Whether an `If-None-Match` header names `etag` (weak comparison, as RFC 9110 asks)."""
    for candidate in if_none_match.split(","):
        candidate = candidate.strip()
        if candidate == "*" or candidate.removeprefix("W/") == etag:
            return True
    return False
