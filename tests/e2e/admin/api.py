"""A blocking client of a node's admin API for end-to-end tests: JSON in and out, credentials
when given, and every answer checked against `mop/admin/openapi.yaml` (`tests.openapi`)."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from mop.testing.node import RunningNode
from tests.openapi import check_response

TIMEOUT = 10.0


def encoded(segment: str) -> str:
    """A path parameter, percent-encoded (a topic's "/" too)."""
    return quote(segment, safe="")


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    headers: Mapping[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Api:
    def __init__(
        self,
        node: RunningNode,
        *,
        user: tuple[str, str] | None = None,
        token: str | None = None,
    ) -> None:
        host, port = node.node.address("admin")
        self.base = f"http://{host}:{port}"
        self.headers: dict[str, str] = {}
        if user is not None:
            pair = base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode()
            self.headers["authorization"] = f"Basic {pair}"
        if token is not None:
            self.headers["authorization"] = f"Bearer {token}"

    def call(
        self, method: str, path: str, body: Any = None, query: Mapping[str, Any] | None = None
    ) -> Answer:
        url = self.base + path + (f"?{urlencode(query)}" if query else "")
        data = None if body is None else json.dumps(body).encode()
        headers = dict(self.headers)
        if data is not None:
            headers["content-type"] = "application/json"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
                result = Answer(answer.status, _lower(answer.headers), answer.read())
        except urllib.error.HTTPError as error:
            result = Answer(error.code, _lower(error.headers), error.read())
        _check(method, path, result)
        return result

    def get(self, path: str, status: int = 200, **query: Any) -> Any:
        answer = self.call("GET", path, query=query)
        assert answer.status == status, (answer.status, answer.body)
        return answer.json()

    def post(self, path: str, body: Any, status: int = 200) -> Any:
        answer = self.call("POST", path, body)
        assert answer.status == status, (answer.status, answer.body)
        return answer.json()

    def delete(self, path: str, status: int = 204) -> Answer:
        answer = self.call("DELETE", path)
        assert answer.status == status, (answer.status, answer.body)
        return answer


def _lower(headers: Mapping[str, str]) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


def _check(method: str, path: str, answer: Answer) -> None:
    """Every JSON answer is what the OpenAPI document says it is."""
    if answer.headers.get("content-type") != "application/json" or not answer.body:
        return
    check_response(method, path, answer.status, json.loads(answer.body) if answer.body else None)


def eventually(condition: Callable[[], Any], timeout: float = TIMEOUT) -> Any:
    """Wait until `condition()` returns something true, and return it."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)
