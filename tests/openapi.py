"""`mop/admin/openapi.yaml` for tests: its paths, and answers of the API checked against the
schemas it gives them (JSON Schema 2020-12, which OpenAPI 3.1 uses)."""

from __future__ import annotations

import re
from functools import cache
from typing import Any
from urllib.parse import quote

import yaml
from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from mop.admin.routes_docs import openapi_document

_URI = "urn:mop:admin:openapi"


@cache
def document() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(openapi_document())
    return loaded


@cache
def _registry() -> Registry[Any]:
    return Registry().with_resource(_URI, DRAFT202012.create_resource(document()))


def _pointer(*parts: str) -> str:
    escaped = (part.replace("~", "~0").replace("/", "~1") for part in parts)
    return quote("/" + "/".join(escaped), safe="/~")


def template_of(path: str) -> str | None:
    """The documented path template a concrete path (percent-encoded) falls under; literal
    templates before those with parameters."""
    templates = sorted(document()["paths"], key=lambda template: template.count("{"))
    for template in templates:
        pattern = re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(template))
        if re.fullmatch(pattern, path):
            return template
    return None


def check_response(method: str, path: str, status: int, body: Any) -> None:
    """Fail unless the document describes `status` for `method path` and `body` (JSON) is
    what its schema says."""
    template = template_of(path)
    assert template is not None, f"{path} is not in openapi.yaml"
    operation = document()["paths"][template].get(method.lower())
    assert operation is not None, f"{method} {template} is not in openapi.yaml"
    code = str(status)
    assert code in operation["responses"], f"{method} {template}: {status} is not documented"
    response = operation["responses"][code]
    where = ("paths", template, method.lower(), "responses", code)
    if "$ref" in response:
        name = response["$ref"].rpartition("/")[2]
        response = document()["components"]["responses"][name]
        where = ("components", "responses", name)
    content = response.get("content", {})
    assert "application/json" in content, f"{method} {template}: {status} has no JSON body"
    schema = {"$ref": _URI + "#" + _pointer(*where, "content", "application/json", "schema")}
    Draft202012Validator(schema, registry=_registry()).validate(body)
