"""The API's own description: `openapi.yaml` beside this module (OpenAPI 3.1), served as it
ships in the package."""

from __future__ import annotations

from importlib.resources import files

from mop.admin.context import AdminContext
from mop.admin.http import Request, Response, Router

OPENAPI_FILE = "openapi.yaml"


def openapi_document() -> bytes:
    return files("mop.admin").joinpath(OPENAPI_FILE).read_bytes()


def add_docs_routes(router: Router, _context: AdminContext) -> None:
    document = openapi_document()

    async def openapi(_request: Request) -> Response:
        return Response(200, document, "application/yaml")

    router.add("GET", "/api/v1/openapi.yaml", openapi, public=True)
